package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

var (
	_ runtime.Object = (*Sandbox)(nil)
	_ runtime.Object = (*SandboxList)(nil)
)

// DeepCopyObject implements runtime.Object.
func (s *Sandbox) DeepCopyObject() runtime.Object { return s.DeepCopy() }

// DeepCopy copies s.
func (s *Sandbox) DeepCopy() *Sandbox {
	if s == nil {
		return nil
	}
	out := &Sandbox{TypeMeta: s.TypeMeta}
	s.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	s.Spec.deepCopyInto(&out.Spec)
	s.Status.deepCopyInto(&out.Status)
	return out
}

// DeepCopyObject implements runtime.Object.
func (l *SandboxList) DeepCopyObject() runtime.Object { return l.DeepCopy() }

// DeepCopy copies l.
func (l *SandboxList) DeepCopy() *SandboxList {
	if l == nil {
		return nil
	}
	out := &SandboxList{TypeMeta: l.TypeMeta}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]Sandbox, len(l.Items))
		for i := range l.Items {
			out.Items[i] = *l.Items[i].DeepCopy()
		}
	}
	return out
}

func copyMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (s *SandboxSpec) deepCopyInto(out *SandboxSpec) {
	s.PodTemplate.Spec.DeepCopyInto(&out.PodTemplate.Spec)
	out.PodTemplate.ObjectMeta = PodMetadata{Labels: copyMap(s.PodTemplate.ObjectMeta.Labels), Annotations: copyMap(s.PodTemplate.ObjectMeta.Annotations)}
	if s.VolumeClaimTemplates != nil {
		out.VolumeClaimTemplates = make([]PersistentVolumeClaimTemplate, len(s.VolumeClaimTemplates))
		for i, v := range s.VolumeClaimTemplates {
			o := &out.VolumeClaimTemplates[i]
			o.Name = v.Name
			o.Labels, o.Annotations = copyMap(v.Labels), copyMap(v.Annotations)
			v.Spec.DeepCopyInto(&o.Spec)
		}
	}
	if s.ShutdownTime != nil {
		out.ShutdownTime = s.ShutdownTime.DeepCopy()
	}
	if s.ShutdownPolicy != nil {
		p := *s.ShutdownPolicy
		out.ShutdownPolicy = &p
	}
	if s.Replicas != nil {
		r := *s.Replicas
		out.Replicas = &r
	}
	if s.Service != nil {
		b := *s.Service
		out.Service = &b
	}
}

func (s *SandboxStatus) deepCopyInto(out *SandboxStatus) {
	*out = *s
	if s.Conditions != nil {
		out.Conditions = make([]metav1.Condition, len(s.Conditions))
		for i := range s.Conditions {
			s.Conditions[i].DeepCopyInto(&out.Conditions[i])
		}
	}
	if s.PodIPs != nil {
		out.PodIPs = append([]string(nil), s.PodIPs...)
	}
}

// DeepCopy copies s.
func (s *SandboxStatus) DeepCopy() *SandboxStatus {
	if s == nil {
		return nil
	}
	out := new(SandboxStatus)
	s.deepCopyInto(out)
	return out
}
