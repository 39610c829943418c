// Package v1alpha1 is the agent-sandbox `Sandbox` API (group
// agents.x-k8s.io, version v1alpha1) as agentjail's operator serves it,
// written from the published schema: a Sandbox is one stateful Pod with a
// stable identity (its hostname and a headless Service), an optional
// shutdown time, and replicas 0 or 1 to pause and resume it. agentjail's
// own abilities (snapshots, branches) are annotations on the Sandbox; see
// docs/kubernetes.md.
package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is agents.x-k8s.io/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: "agents.x-k8s.io", Version: "v1alpha1"}

// AddToScheme registers Sandbox and SandboxList.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &Sandbox{}, &SandboxList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// Sandbox is one isolated, stateful, singleton workload.
type Sandbox struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SandboxSpec   `json:"spec"`
	Status SandboxStatus `json:"status,omitempty"`
}

// SandboxList is a list of Sandboxes.
type SandboxList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Sandbox `json:"items"`
}

// ShutdownPolicy says whether an expired Sandbox is deleted (Delete) or
// kept, showing that it expired (Retain, the default). Its Pod and
// Service go either way.
type ShutdownPolicy string

// The shutdown policies.
const (
	ShutdownPolicyDelete ShutdownPolicy = "Delete"
	ShutdownPolicyRetain ShutdownPolicy = "Retain"
)

// SandboxSpec is the desired state of a Sandbox.
type SandboxSpec struct {
	// PodTemplate is the Pod the Sandbox runs.
	PodTemplate PodTemplate `json:"podTemplate"`
	// VolumeClaimTemplates are claims the Pod may reference. agentjail
	// nodes mount no volumes: a Sandbox with any is refused (its Ready
	// condition says why).
	VolumeClaimTemplates []PersistentVolumeClaimTemplate `json:"volumeClaimTemplates,omitempty"`
	// ShutdownTime is when the Sandbox expires.
	ShutdownTime *metav1.Time `json:"shutdownTime,omitempty"`
	// ShutdownPolicy applies at ShutdownTime (default Retain).
	ShutdownPolicy *ShutdownPolicy `json:"shutdownPolicy,omitempty"`
	// Replicas is 1 (running, the default) or 0 (paused: on agentjail
	// nodes its processes and files are kept in a snapshot and come back
	// on resume).
	Replicas *int32 `json:"replicas,omitempty"`
	// Service makes the controller keep a headless Service named as the
	// Sandbox (true), remove it (false), or leave one that exists (unset).
	Service *bool `json:"service,omitempty"`
}

// PodTemplate is the Pod of a Sandbox.
type PodTemplate struct {
	Spec       corev1.PodSpec `json:"spec"`
	ObjectMeta PodMetadata    `json:"metadata,omitempty"`
}

// PodMetadata are the labels and annotations the Pod gets.
type PodMetadata struct {
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// EmbeddedObjectMetadata is the metadata of a claim template.
type EmbeddedObjectMetadata struct {
	Name        string            `json:"name,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// PersistentVolumeClaimTemplate is a claim a Sandbox's Pod may use.
type PersistentVolumeClaimTemplate struct {
	EmbeddedObjectMetadata `json:"metadata,omitempty"`
	Spec                   corev1.PersistentVolumeClaimSpec `json:"spec"`
}

// SandboxStatus is the observed state of a Sandbox.
type SandboxStatus struct {
	// ServiceFQDN is the Service's name in the cluster's DNS.
	ServiceFQDN string `json:"serviceFQDN,omitempty"`
	// Service is the headless Service's name.
	Service string `json:"service,omitempty"`
	// Conditions: Ready (reasons DependenciesReady, DependenciesNotReady,
	// Paused, Expired, Unsupported).
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Replicas is how many Pods run (0 or 1).
	Replicas int32 `json:"replicas"`
	// Selector selects the Sandbox's Pod.
	Selector string `json:"selector,omitempty"`
	// PodIPs are the Pod's addresses.
	PodIPs []string `json:"podIPs,omitempty"`
}

// ConditionReady is the Sandbox's one condition type.
const ConditionReady = "Ready"
