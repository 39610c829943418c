package model

import "time"

// AgentTool is an installed agent CLI: one read-only tool tree shared by
// every jail that runs that version.
type AgentTool struct {
	// Name is the agent (claude, codex, gemini, opencode).
	Name string `json:"name"`
	// Package and Version are the npm package installed.
	Package string `json:"package"`
	Version string `json:"version"`
	// Extra are the other npm packages installed beside it (the Node a
	// CLI runs on, plugins).
	Extra []string `json:"extra,omitempty"`
	// SHA256 digests the tree: every path, mode, link target and file
	// content, in order.
	SHA256 string `json:"sha256"`
	// Files and SizeBytes count the tree's regular files and their bytes.
	Files     int   `json:"files"`
	SizeBytes int64 `json:"size_bytes"`
	// Bin are the executables put on the jail's PATH.
	Bin []string `json:"bin"`
	// InstalledAt is when the tree was put in place.
	InstalledAt time.Time `json:"installed_at"`
	// Dir is the tree's host path.
	Dir string `json:"dir"`
}

// AgentInfo is an agent agentjail knows, with its installed versions.
type AgentInfo struct {
	Name           string      `json:"name"`
	Package        string      `json:"package"`
	DefaultVersion string      `json:"default_version"`
	Provider       string      `json:"provider"`
	ModelHost      string      `json:"model_host"`
	KeyName        string      `json:"key_name"`
	KeyPresent     bool        `json:"key_present"`
	Installed      []AgentTool `json:"installed"`
}

// AgentInstallRequest is the body of POST /agents/{name}/install.
type AgentInstallRequest struct {
	// Version to install (default: agentjail's pinned version).
	Version string `json:"version,omitempty"`
}

// AgentInstallEvent is one line of an install's NDJSON stream: progress
// lines, then the tool (Installed false when that version was there
// already) or an error.
type AgentInstallEvent struct {
	Progress  string     `json:"progress,omitempty"`
	Tool      *AgentTool `json:"tool,omitempty"`
	Installed bool       `json:"installed,omitempty"`
}

// AgentRunRequest is the body of POST /jails/{id}/agent/run: one
// headless run of the jail's agent.
type AgentRunRequest struct {
	// Prompt is the task.
	Prompt string `json:"prompt"`
	// Args are added to the agent's own.
	Args []string `json:"args,omitempty"`
	// TimeoutMs kills the run when it expires (0: none).
	TimeoutMs int64 `json:"timeout_ms,omitempty"`
	// Encoding of the streamed output: "utf8" (default) or "base64".
	Encoding string `json:"encoding,omitempty"`
}

// AgentSessionRequest is the body of POST /jails/{id}/agent/session: the
// agent's TUI started as a terminal session.
type AgentSessionRequest struct {
	Rows int    `json:"rows,omitempty"`
	Cols int    `json:"cols,omitempty"`
	Term string `json:"term,omitempty"`
	// Args are added to the agent's own.
	Args []string `json:"args,omitempty"`
}

// SyncResult is the answer of POST /jails/{id}/sync.
type SyncResult struct {
	Jail string `json:"jail"`
	// Repo is the host repository; Branch the branch written there.
	Repo   string `json:"repo"`
	Branch string `json:"branch"`
	// Commit is the branch's new head; Base the commit it was compared to
	// (the last sync's, or the one the workspace was filled from).
	Commit string `json:"commit"`
	Base   string `json:"base"`
	// Commits counts the commits from Base to Commit; Files lists the
	// paths that differ.
	Commits  int       `json:"commits"`
	Files    []string  `json:"files"`
	SyncedAt time.Time `json:"synced_at"`
}

// PreviewRequest is the body of POST /jails/{id}/previews.
type PreviewRequest struct {
	// Port is the jail's port the dev server listens on.
	Port int `json:"port"`
	// TTLS is how long the link is valid, in seconds (default 3600).
	TTLS int64 `json:"ttl_s,omitempty"`
}

// PreviewLink is a signed preview URL of a jail's port.
type PreviewLink struct {
	Jail      string    `json:"jail"`
	Port      int       `json:"port"`
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
}
