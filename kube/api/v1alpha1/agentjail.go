package v1alpha1

import corev1 "k8s.io/api/core/v1"

// agentjail's extensions to the Sandbox API, as labels, annotations and a
// Pod condition (the Sandbox schema itself is upstream's).
const (
	// LabelNameHash is on a Sandbox's Pod and selects it: a hash of the
	// Sandbox's name (names may be longer than a label value).
	LabelNameHash = "agents.x-k8s.io/sandbox-name-hash"
	// AnnotationSnapshot on a paused Sandbox records its snapshot (a
	// Snapshot as JSON).
	AnnotationSnapshot = "agentjail.dev/snapshot"
	// AnnotationSnapshotRequest on a Pod asks its node for a full
	// snapshot of the Pod's jail; the value is a token the answer echoes.
	AnnotationSnapshotRequest = "agentjail.dev/snapshot-request"
	// AnnotationRestore on a Pod makes its node restore the jail from a
	// snapshot (a Snapshot as JSON) instead of starting it afresh.
	AnnotationRestore = "agentjail.dev/restore"
	// ConditionSnapshot is the Pod condition with the node's answer to a
	// snapshot request: True with the Snapshot as JSON in its message, or
	// False with "TOKEN: reason".
	ConditionSnapshot corev1.PodConditionType = "agentjail.dev/Snapshot"
	// AnnotationAPI is on every agentjail Node: the URL of its daemon's
	// API, which the gateway forwards to.
	AnnotationAPI = "agentjail.dev/api"
	// AnnotationBranch on a running Sandbox asks for that many (1 to
	// MaxBranches) new Sandboxes in the state of a snapshot of it, named
	// NAME-bK-1 ... NAME-bK-N (K counts the Sandbox's branch requests)
	// and placed by the scheduler on any agentjail node: the snapshot
	// travels through the operator's snapshot registry. The operator
	// removes the annotation when the branches exist (or the request
	// failed) and reports in the ConditionBranched condition.
	AnnotationBranch = "agentjail.dev/branch"
	// AnnotationBranchCount on a Sandbox counts its branch requests taken.
	AnnotationBranchCount = "agentjail.dev/branch-count"
	// LabelBranchOf is on a branch Sandbox: the name of the Sandbox it
	// was branched from.
	LabelBranchOf = "agentjail.dev/branch-of"
	// ConditionBranched is the Sandbox condition reporting its last branch
	// request: True naming the new Sandboxes, False with why it failed.
	ConditionBranched = "agentjail.dev/Branched"
	// AnnotationSnapshotPush on a Pod with AnnotationSnapshotRequest
	// makes its node push the snapshot to this registry reference
	// (registry/repository:tag) and delete its own copy; the answer's
	// Snapshot then names the pushed artifact (Ref).
	AnnotationSnapshotPush = "agentjail.dev/snapshot-push"
	// MaxBranches bounds AnnotationBranch.
	MaxBranches = 32
)

// Snapshot is a snapshot of a Sandbox's jail on a node.
type Snapshot struct {
	// Node holds the snapshot; ID is its id in that node's daemon.
	Node string `json:"node"`
	ID   string `json:"id"`
	// Pid is the Pod's main command in the jail, attached to again after
	// a restore.
	Pid int `json:"pid"`
	// Token is the request the snapshot answers.
	Token string `json:"token,omitempty"`
	// Ref is the registry artifact the snapshot was pushed to, by digest
	// (AnnotationSnapshotPush). A Pod restoring a snapshot with a Ref is
	// placed by the scheduler; its node pulls the snapshot first.
	Ref string `json:"ref,omitempty"`
}
