package node

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func testPod(c corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{c}},
	}
}

func TestTranslateMapsTheContainer(t *testing.T) {
	p := testPod(corev1.Container{
		Name: "main", Image: "python:3.12", Command: []string{"python"}, Args: []string{"-c", "pass"}, WorkingDir: "/src",
		Env: []corev1.EnvVar{{Name: "A", Value: "1"}},
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("256Mi"),
			corev1.ResourceEphemeralStorage: resource.MustParse("1Gi"),
		}},
	})
	gvisor := "gvisor"
	p.Spec.RuntimeClassName = &gvisor
	p.Annotations = map[string]string{AnnotationNetwork: `{"mode": "none"}`}
	js, err := translate(p)
	if err != nil {
		t.Fatal(err)
	}
	cfg := js.create.Config
	r := cfg.Isolation.Resources
	if js.image != "python:3.12" || cfg.Isolation.Filesystem.Rootfs != "image:python:3.12" || cfg.Isolation.Level != "gvisor" ||
		cfg.Isolation.Network.Mode != "none" || cfg.Env["A"] != "1" || cfg.Hostname != "p" || js.cwd != "/src" ||
		r.CPUQuota != 50000 || r.CPUPeriod != 100000 || r.MemoryBytes != 256<<20 || r.DiskBytes != 1<<30 {
		t.Fatalf("%+v %+v", js, cfg)
	}
	p.Annotations[AnnotationLevel] = "container"
	if js, _ := translate(p); js.create.Config.Isolation.Level != "container" {
		t.Fatalf("the annotation does not win over the RuntimeClass: %q", js.create.Config.Isolation.Level)
	}
}

func TestTranslateRefusesWhatAJailCannotDo(t *testing.T) {
	yes := true
	for _, tc := range []struct {
		name   string
		modify func(*corev1.Pod)
		want   string
	}{
		{"two containers", func(p *corev1.Pod) { p.Spec.Containers = append(p.Spec.Containers, p.Spec.Containers[0]) }, "one container"},
		{"init container", func(p *corev1.Pod) { p.Spec.InitContainers = p.Spec.Containers }, "init containers"},
		{"host network", func(p *corev1.Pod) { p.Spec.HostNetwork = true }, "host's namespaces"},
		{"privileged", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: &yes}
		}, "privileged"},
		{"volume", func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "v", MountPath: "/v"}}
		}, "volume \"v\""},
		{"gpu", func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
		}, "nvidia.com/gpu"},
		{"host image without command", func(p *corev1.Pod) {
			p.Spec.Containers[0].Image, p.Spec.Containers[0].Command = HostImage, nil
		}, "no default command"},
		{"bad network", func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationNetwork: `{"bogus": 1}`} }, "not a network policy"},
	} {
		p := testPod(corev1.Container{Name: "main", Image: "alpine", Command: []string{"true"}})
		tc.modify(p)
		_, err := translate(p)
		var u *unsupportedError
		if !errors.As(err, &u) || !strings.Contains(u.msg, tc.want) {
			t.Errorf("%s: %v, want an unsupported error about %q", tc.name, err, tc.want)
		}
	}
	// The service account token volume is not mounted, not refused.
	p := testPod(corev1.Container{Name: "main", Image: "alpine", Command: []string{"true"},
		VolumeMounts: []corev1.VolumeMount{{Name: "kube-api-access-x", MountPath: "/var/run/secrets"}}})
	p.Spec.Volumes = []corev1.Volume{{Name: "kube-api-access-x", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}}}
	if _, err := translate(p); err != nil {
		t.Errorf("service account volume: %v", err)
	}
}
