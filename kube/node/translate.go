package node

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	agentjail "github.com/agentjail/agentjail/client"
)

// Annotations a Pod may carry for its jail.
const (
	// AnnotationLevel chooses the isolation level (container, process,
	// gvisor, vm...); the Pod's RuntimeClass name chooses it too, the
	// annotation wins.
	AnnotationLevel = "agentjail.dev/level"
	// AnnotationNetwork is the jail's network policy: the `network` object
	// of the jail config (isolation.network) as JSON or YAML.
	AnnotationNetwork = "agentjail.dev/network"
	// AnnotationJail is set by the node on the Pods it runs: the id of the
	// Pod's jail on this node.
	AnnotationJail = "agentjail.dev/jail"
)

// HostImage is the image reference that asks for the daemon's curated
// host tree (rootfs "host") instead of an image pulled from a registry.
const HostImage = "agentjail.dev/host"

// jailSpec is what a Pod becomes: the jail to create and its main
// command.
type jailSpec struct {
	create agentjail.CreateRequest
	// image is the image to pull first ("" for the host tree).
	image string
	// cmd is the container's command line; empty means the image's
	// entrypoint and command, resolved once the image is in the store.
	command, args []string
	cwd           string
}

// unsupportedError is a Pod asking for something a jail cannot do: the
// Pod fails with it as its message.
type unsupportedError struct{ msg string }

func (e *unsupportedError) Error() string { return e.msg }

func unsupported(format string, args ...any) error {
	return &unsupportedError{fmt.Sprintf(format, args...)}
}

// translate maps pod to a jail: its single container's image, command,
// args, env, working directory and limits, the isolation level from the
// Pod's RuntimeClass or AnnotationLevel, and the network policy from
// AnnotationNetwork. Anything else a jail cannot honour is an
// *unsupportedError naming the field.
func translate(pod *corev1.Pod) (*jailSpec, error) {
	spec := &pod.Spec
	if len(spec.Containers) != 1 {
		return nil, unsupported("spec.containers: a jail runs one container, this Pod has %d", len(spec.Containers))
	}
	if len(spec.InitContainers) > 0 {
		return nil, unsupported("spec.initContainers: init containers are not supported on agentjail nodes")
	}
	if len(spec.EphemeralContainers) > 0 {
		return nil, unsupported("spec.ephemeralContainers: ephemeral containers are not supported on agentjail nodes")
	}
	if spec.HostNetwork || spec.HostPID || spec.HostIPC {
		return nil, unsupported("spec.hostNetwork/hostPID/hostIPC: a jail never shares the host's namespaces")
	}
	c := &spec.Containers[0]
	if sc := c.SecurityContext; sc != nil {
		if sc.Privileged != nil && *sc.Privileged {
			return nil, unsupported("containers[0].securityContext.privileged: jails are never privileged")
		}
		if sc.Capabilities != nil && len(sc.Capabilities.Add) > 0 {
			return nil, unsupported("containers[0].securityContext.capabilities.add: a jail gets no added capabilities")
		}
	}
	for _, p := range c.Ports {
		if p.HostPort != 0 {
			return nil, unsupported("containers[0].ports: hostPort %d is not supported on agentjail nodes", p.HostPort)
		}
	}
	vols := map[string]*corev1.Volume{}
	for i := range spec.Volumes {
		vols[spec.Volumes[i].Name] = &spec.Volumes[i]
	}
	for _, m := range c.VolumeMounts {
		v := vols[m.Name]
		if v == nil || !serviceAccountVolume(v) {
			return nil, unsupported("containers[0].volumeMounts: volume %q: agentjail nodes mount no volumes into jails", m.Name)
		}
	}
	if len(c.VolumeDevices) > 0 {
		return nil, unsupported("containers[0].volumeDevices: agentjail nodes attach no block devices")
	}

	js := &jailSpec{command: c.Command, args: c.Args, cwd: c.WorkingDir}
	cfg := &js.create.Config
	cfg.Hostname = hostname(pod)
	if c.Image != HostImage {
		js.image = c.Image
		cfg.Isolation.Filesystem.Rootfs = "image:" + c.Image
	} else if len(c.Command) == 0 {
		return nil, unsupported("containers[0].command: the host image %s has no default command: give one", HostImage)
	}
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			// The pod controller resolves these before CreatePod; one left
			// over refers to something it cannot (a resourceFieldRef).
			return nil, unsupported("containers[0].env[%s]: valueFrom is not supported here", e.Name)
		}
		if cfg.Env == nil {
			cfg.Env = map[string]string{}
		}
		cfg.Env[e.Name] = e.Value
	}
	if len(c.EnvFrom) > 0 {
		return nil, unsupported("containers[0].envFrom: not supported on agentjail nodes; list the variables in env")
	}
	if err := limits(&cfg.Isolation.Resources, c.Resources.Limits); err != nil {
		return nil, err
	}
	if spec.RuntimeClassName != nil {
		cfg.Isolation.Level = *spec.RuntimeClassName
	}
	if l := pod.Annotations[AnnotationLevel]; l != "" {
		cfg.Isolation.Level = l
	}
	if n := pod.Annotations[AnnotationNetwork]; n != "" {
		if err := yaml.UnmarshalStrict([]byte(n), &cfg.Isolation.Network); err != nil {
			return nil, unsupported("metadata.annotations[%s]: not a network policy: %v", AnnotationNetwork, err)
		}
	}
	return js, nil
}

// serviceAccountVolume reports whether v is the projected service account
// token volume the apiserver adds to every Pod: the node does not mount it
// (the Pod gets an event saying so) rather than failing every Pod.
func serviceAccountVolume(v *corev1.Volume) bool {
	return v.Projected != nil && strings.HasPrefix(v.Name, "kube-api-access-")
}

// hostname is the Pod's hostname as the kubelet gives it (spec.hostname,
// else the Pod's name), cut to a jail hostname's limit.
func hostname(pod *corev1.Pod) string {
	h := pod.Spec.Hostname
	if h == "" {
		h = pod.Name
	}
	if len(h) > 63 {
		h = strings.TrimRight(h[:63], "-.")
	}
	return h
}

// limits maps a container's resource limits: cpu to a CFS quota, memory,
// ephemeral-storage to the jail's disk and pids. Other resources cannot be
// honoured.
func limits(r *agentjail.Resources, l corev1.ResourceList) error {
	for name, q := range l {
		switch name {
		case corev1.ResourceCPU:
			const period = 100000
			r.CPUPeriod = period
			r.CPUQuota = max(q.MilliValue()*period/1000, 1000)
		case corev1.ResourceMemory:
			r.MemoryBytes = q.Value()
		case corev1.ResourceEphemeralStorage:
			r.DiskBytes = q.Value()
		case "pids":
			r.PidsLimit = q.Value()
		default:
			return unsupported("containers[0].resources.limits: %s cannot be given to a jail", name)
		}
	}
	return nil
}
