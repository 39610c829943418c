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
}
