package agent

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
)

func TestExpand(t *testing.T) {
	keys := NewKeys("", func(name string) (string, bool) {
		if name == "ANTHROPIC_API_KEY" {
			return "sk-real", true
		}
		return "", false
	})
	m := &Manifest{Name: "claude", Version: "2.1.330", Dir: "/var/lib/agentjail/tools/claude/2.1.330"}

	cfg := config.Config{Agent: &config.Agent{Name: "claude"}}
	if err := Expand(&cfg, Definitions["claude"], m, keys); err != nil {
		t.Fatal(err)
	}
	n := cfg.Isolation.Network
	if len(n.Routes) != 1 || n.Routes[0] != (config.Route{Host: "api.anthropic.com", URL: "https://api.anthropic.com"}) {
		t.Errorf("routes %+v", n.Routes)
	}
	if len(n.Credentials) != 1 || n.Credentials[0].Secret != "ANTHROPIC_API_KEY" || n.Credentials[0].Header != "x-api-key" || n.Credentials[0].Value != "" {
		t.Errorf("credentials %+v", n.Credentials)
	}
	if b, _ := json.Marshal(cfg); strings.Contains(string(b), "sk-real") {
		t.Fatal("the key is in the jail's config")
	}
	if len(n.AlwaysAllow) != 1 || n.AlwaysAllow[0].Destination != "api.anthropic.com" {
		t.Errorf("always_allow %+v", n.AlwaysAllow)
	}
	fs := cfg.Isolation.Filesystem
	if len(fs.ReadOnlyMounts) != 1 || fs.ReadOnlyMounts[0].Source != m.Dir || fs.ReadOnlyMounts[0].Target != "/opt/agentjail/claude" {
		t.Errorf("mounts %+v", fs.ReadOnlyMounts)
	}
	if !strings.HasPrefix(cfg.Env["PATH"], "/opt/agentjail/claude/bin:") || cfg.Env["ANTHROPIC_API_KEY"] != DummyKey ||
		cfg.Env["ANTHROPIC_BASE_URL"] != "http://api.anthropic.com" || cfg.Env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] != "1" {
		t.Errorf("env %v", cfg.Env)
	}
	if cfg.Isolation.Resources.MemoryBytes != agentMemory || cfg.Isolation.Resources.PidsLimit != agentPids {
		t.Errorf("resources %+v", cfg.Isolation.Resources)
	}

	// An endpoint override is allowed by address and port, and needs no key.
	cfg = config.Config{Agent: &config.Agent{Name: "codex", Endpoint: "http://127.0.0.1:11434/prefix"}}
	if err := Expand(&cfg, Definitions["codex"], &Manifest{Name: "codex", Version: "1", Dir: "/t"}, keys); err != nil {
		t.Fatal(err)
	}
	n = cfg.Isolation.Network
	if n.Routes[0].URL != "http://127.0.0.1:11434/prefix" || len(n.Credentials) != 0 {
		t.Errorf("override: routes %+v credentials %+v", n.Routes, n.Credentials)
	}
	if a := n.AlwaysAllow[0]; a.Destination != "127.0.0.1" || len(a.Ports) != 1 || a.Ports[0] != 11434 {
		t.Errorf("override: always_allow %+v", n.AlwaysAllow)
	}

	// No key and no endpoint; no network.
	cfg = config.Config{Agent: &config.Agent{Name: "gemini"}}
	if err := Expand(&cfg, Definitions["gemini"], m, keys); !errors.Is(err, errdefs.ErrUnprocessable) || !strings.Contains(err.Error(), "GEMINI_API_KEY") {
		t.Errorf("no key: %v", err)
	}
	cfg = config.Config{Agent: &config.Agent{Name: "claude"}}
	cfg.Isolation.Network.Mode = config.NetNone
	if err := Expand(&cfg, Definitions["claude"], m, keys); !errors.Is(err, errdefs.ErrUnprocessable) {
		t.Errorf("mode none: %v", err)
	}
	for _, bad := range []config.Agent{{}, {Name: "claude", Endpoint: "ftp://x"}, {Name: "claude", Endpoint: "http://u:p@x"},
		{Name: "claude", HomeTemplate: "rel/dir"}, {Name: "claude", Version: "1 2"}} {
		if err := ValidateSpec(&bad); !errors.Is(err, errdefs.ErrUnprocessable) {
			t.Errorf("ValidateSpec(%+v) = %v", bad, err)
		}
	}
	if _, err := Lookup("nope"); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "claude, codex, gemini, opencode") {
		t.Errorf("Lookup(nope) = %v", err)
	}
}

func TestHomeFiles(t *testing.T) {
	for _, name := range Names() {
		cfg := config.Config{Agent: &config.Agent{Name: name, Version: "1.2.3", Model: "m1"}}
		cfg.Isolation.Filesystem.WorkspaceRoot = "/workspace"
		files, err := HomeFiles(&cfg, Definitions[name])
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: %v", name, err)
		}
		for rel, data := range files {
			if strings.HasSuffix(rel, ".json") {
				var v map[string]any
				if err := json.Unmarshal(data, &v); err != nil {
					t.Errorf("%s %s: %v", name, rel, err)
				}
			}
			if strings.Contains(string(data), "sk-") {
				t.Errorf("%s %s holds something like a key", name, rel)
			}
		}
	}
	files, _ := HomeFiles(&config.Config{Agent: &config.Agent{Name: "claude", Version: "2.1.330"},
		Isolation: config.Isolation{Filesystem: config.Filesystem{WorkspaceRoot: "/workspace"}}}, Definitions["claude"])
	var state struct {
		Onboarding bool `json:"hasCompletedOnboarding"`
		Keys       struct {
			Approved []string `json:"approved"`
		} `json:"customApiKeyResponses"`
		Projects map[string]struct {
			Trusted bool `json:"hasTrustDialogAccepted"`
		} `json:"projects"`
	}
	json.Unmarshal(files[".claude.json"], &state)
	if !state.Onboarding || len(state.Keys.Approved) != 1 || !strings.HasSuffix(DummyKey, state.Keys.Approved[0]) || !state.Projects["/workspace"].Trusted {
		t.Errorf("claude's state: %+v", state)
	}
}

func TestKeys(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "secrets.env")
	k := NewKeys(file, func(string) (string, bool) { return "from-env", true })
	if v, ok := k.Lookup("X"); !ok || v != "from-env" {
		t.Fatalf("no file: %q %v", v, ok)
	}
	os.WriteFile(file, []byte("# keys\nX=from-file\nexport Y=\"quoted\"\n"), 0o644)
	if v, _ := k.Lookup("X"); v != "from-env" || k.Check() == nil || !strings.Contains(k.Check().Error(), "0600") {
		t.Fatalf("a file readable by others is ignored: %q %v", v, k.Check())
	}
	os.Chmod(file, 0o600)
	if v, _ := k.Lookup("X"); v != "from-file" {
		t.Fatalf("0600 file: %q", v)
	}
	if v, _ := k.Lookup("Y"); v != "quoted" {
		t.Fatalf("quoted value: %q", v)
	}
	os.WriteFile(file, []byte("garbage\n"), 0o600)
	if k.Check() == nil {
		t.Fatal("a malformed file is no error")
	}
}

func TestHashTree(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a"), []byte("hello"), 0o644)
	os.Link(filepath.Join(dir, "a"), filepath.Join(dir, "b"))
	os.Symlink("a", filepath.Join(dir, "c"))
	sum, files, size, err := HashTree(dir)
	if err != nil || files != 1 || size != 5 {
		t.Fatalf("%s %d files %d bytes %v: a hard link counts once", sum, files, size, err)
	}
	os.WriteFile(filepath.Join(dir, ManifestName), []byte("{}"), 0o644)
	if again, _, _, _ := HashTree(dir); again != sum {
		t.Fatal("the manifest changed the tree's hash")
	}
	os.WriteFile(filepath.Join(dir, "a"), []byte("hellO"), 0o644)
	if again, _, _, _ := HashTree(dir); again == sum {
		t.Fatal("a changed byte left the hash as it was")
	}
	if compareVersions("1.10.0", "1.9.2") <= 0 || compareVersions("2.1.330", "2.1.330") != 0 || !numericVersion("0.61.0") || numericVersion("latest") {
		t.Fatal("version order")
	}
}
