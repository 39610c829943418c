package agent

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// HomeOptions are what an agent's home template depends on.
type HomeOptions struct {
	// Version is the installed version of the CLI.
	Version string
	// Workspace is the jail-side workspace (trusted by the CLI).
	Workspace string
	// Model is the model asked for ("" the CLI's default).
	Model string
	// BaseURL is the model API as the jail's CLI sees it
	// (http://<provider host>, routed by the daemon's proxy).
	BaseURL string
	// ToolDir is where the tool tree is mounted in the jail.
	ToolDir string
}

func jsonFile(v any) ([]byte, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// claudeHome: onboarding done (else the TUI's offline preflight exits 1),
// the dummy key approved, the workspace trusted, the bypass-permissions
// warning accepted, auto-updates off.
func claudeHome(h HomeOptions) (map[string][]byte, error) {
	state := map[string]any{
		"hasCompletedOnboarding": true,
		"lastOnboardingVersion":  h.Version,
		"theme":                  "dark",
		"autoUpdates":            false,
		"customApiKeyResponses":  map[string]any{"approved": []string{lastN(DummyKey, 20)}, "rejected": []string{}},
		"projects": map[string]any{h.Workspace: map[string]any{
			"hasTrustDialogAccepted": true, "hasCompletedProjectOnboarding": true,
		}},
		"bypassPermissionsModeAccepted": true,
	}
	settings := map[string]any{
		"skipDangerousModePermissionPrompt": true,
		// Bypass mode is the point (the jail is the sandbox): no offer to
		// switch to auto mode, whose classifier calls the model too.
		"disableAutoMode": "disable",
		"permissions":     map[string]any{"defaultMode": "bypassPermissions"},
		"env":             map[string]string{"DISABLE_AUTOUPDATER": "1"},
	}
	if h.Model != "" {
		settings["model"] = h.Model
	}
	a, err := jsonFile(state)
	if err != nil {
		return nil, err
	}
	b, err := jsonFile(settings)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{".claude.json": a, ".claude/settings.json": b}, nil
}

func lastN(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// codexHome: a custom provider on the proxy's plain-HTTP endpoint (the
// built-in one ignores base URLs and tries WebSockets first), analytics,
// plugins, the background daemon and update checks off, the workspace
// trusted, no approvals and no nested sandbox.
func codexHome(h HomeOptions) (map[string][]byte, error) {
	var b strings.Builder
	if h.Model != "" {
		fmt.Fprintf(&b, "model = %s\n", strconv.Quote(h.Model))
	}
	fmt.Fprintf(&b, `model_provider = "agentjail"
check_for_update_on_startup = false
approval_policy = "never"
sandbox_mode = "danger-full-access"

[model_providers.agentjail]
name = "OpenAI through agentjail"
base_url = %s
env_key = "OPENAI_API_KEY"
wire_api = "responses"

[analytics]
enabled = false

[features]
plugins = false
daemon_auto_start = false

[projects.%s]
trust_level = "trusted"
`, strconv.Quote(h.BaseURL+"/v1"), strconv.Quote(h.Workspace))
	return map[string][]byte{".codex/config.toml": []byte(b.String())}, nil
}

// geminiHome: API-key auth (the base URL alone makes the CLI refuse its
// own inferred auth type), folder trust, usage statistics, telemetry and
// auto-update off.
func geminiHome(h HomeOptions) (map[string][]byte, error) {
	settings := map[string]any{
		"security":  map[string]any{"auth": map[string]any{"selectedType": "gemini-api-key"}, "folderTrust": map[string]any{"enabled": false}},
		"privacy":   map[string]any{"usageStatisticsEnabled": false},
		"telemetry": map[string]any{"enabled": false},
		"general":   map[string]any{"enableAutoUpdate": false, "enableAutoUpdateNotification": false},
	}
	if h.Model != "" {
		settings["model"] = map[string]any{"name": h.Model}
	}
	b, err := jsonFile(settings)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{".gemini/settings.json": b}, nil
}

// opencodeHome: the anthropic provider on the proxy's endpoint, sharing
// and auto-update off, bash and edits allowed, and the plugin opencode
// would fetch from npm linked from the tool tree.
func opencodeHome(h HomeOptions) (map[string][]byte, error) {
	model := h.Model
	if model == "" {
		model = "claude-sonnet-4-5"
	}
	cfg := map[string]any{
		"$schema":     "https://opencode.ai/config.json",
		"model":       "anthropic/" + model,
		"small_model": "anthropic/" + model,
		"autoupdate":  false,
		"share":       "disabled",
		"provider": map[string]any{"anthropic": map[string]any{
			"options": map[string]any{"baseURL": h.BaseURL + "/v1", "apiKey": DummyKey},
			"models":  map[string]any{model: map[string]any{"name": model}},
		}},
		"permission": map[string]any{"bash": "allow", "edit": "allow", "webfetch": "allow"},
	}
	b, err := jsonFile(cfg)
	if err != nil {
		return nil, err
	}
	pkg, err := jsonFile(map[string]any{"dependencies": map[string]string{"@opencode-ai/plugin": h.Version}})
	if err != nil {
		return nil, err
	}
	return map[string][]byte{
		".config/opencode/opencode.json": b,
		".config/opencode/package.json":  pkg,
		// A symbolic link: the target is the tool tree's node_modules.
		".config/opencode/node_modules": []byte(SymlinkPrefix + h.ToolDir + "/node_modules"),
	}, nil
}

// SymlinkPrefix marks a home template entry that is a symbolic link to
// the rest of its content.
const SymlinkPrefix = "\x00symlink:"
