package deploy

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/agentjail/agentjail/kube/internal/kubetest"
)

// renderArgs renders the plain manifests: release agentjail in namespace
// agentjail, the token from Secret agentjail-token (made by the user).
var renderArgs = []string{"template", "agentjail", "chart/agentjail", "--namespace", "agentjail",
	"--set", "token.existingSecret=agentjail-token", "--include-crds"}

// TestChart: `helm lint` passes, and manifests/agentjail.yaml is what
// `helm template` renders (AGENTJAIL_UPDATE_MANIFESTS=1 rewrites it).
func TestChart(t *testing.T) {
	helm := kubetest.Bin(t, "helm")
	env := append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	lint := exec.Command(helm, "lint", "--strict", "chart/agentjail")
	lint.Env = env
	if out, err := lint.CombinedOutput(); err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
	render := exec.Command(helm, renderArgs...)
	render.Env = env
	out, err := render.Output()
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	const path = "manifests/agentjail.yaml"
	header := []byte("# Rendered from chart/agentjail: helm " + strings.Join(renderArgs, " ") + "\n# (the token Secret agentjail-token is yours to make).\n")
	want := append(header, out...)
	if os.Getenv("AGENTJAIL_UPDATE_MANIFESTS") == "1" {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("%s is not what the chart renders: run AGENTJAIL_UPDATE_MANIFESTS=1 go test ./deploy/", path)
	}
}

// TestChartSnapshotRegistry: the snapshotRegistry values reach the
// operator (--snapshot-registry) and every daemon (--insecure-registry
// for a plain-HTTP registry, the login Secret as its DOCKER_CONFIG).
func TestChartSnapshotRegistry(t *testing.T) {
	helm := kubetest.Bin(t, "helm")
	render := exec.Command(helm, append(renderArgs,
		"--set", "snapshotRegistry.repository=registry.example:5000/team/snapshots",
		"--set", "snapshotRegistry.insecure=true", "--set", "snapshotRegistry.loginSecret=registry-login")...)
	render.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	out, err := render.Output()
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	for _, want := range []string{
		"- --snapshot-registry=registry.example:5000/team/snapshots",
		"- --insecure-registry=registry.example:5000",
		"- name: DOCKER_CONFIG\n              value: /docker-config",
		"- {name: docker-config, mountPath: /docker-config, readOnly: true}",
		"- {name: docker-config, secret: {secretName: registry-login, items: [{key: .dockerconfigjson, path: config.json}], defaultMode: 0400}}",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the rendered chart lacks %q", want)
		}
	}
}
