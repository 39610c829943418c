package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestAPIHealth(t *testing.T) {
	d := shared(t)
	c := newClient("http://"+d.addr, "")
	var h struct {
		Status  string `json:"status"`
		Version string `json:"version"`
		Jails   *int   `json:"jails"`
	}
	c.want(t, http.StatusOK, "GET", "/health", nil, &h)
	if h.Status != "ok" || h.Version == "" || h.Jails == nil {
		t.Errorf("GET /health: %+v", h)
	}
}

func TestAPIAuth(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, map[string]any{"start": false})
	routes := [][2]string{
		{"GET", "/jails"}, {"POST", "/jails"}, {"GET", "/jails/" + j.ID}, {"POST", "/jails/" + j.ID + "/start"},
		{"POST", "/jails/" + j.ID + "/stop"}, {"DELETE", "/jails/" + j.ID}, {"POST", "/jails/" + j.ID + "/exec"},
		{"POST", "/jails/" + j.ID + "/exec/stream"}, {"GET", "/jails/" + j.ID + "/files/workspace"},
		{"PUT", "/jails/" + j.ID + "/files/workspace/x"}, {"DELETE", "/jails/" + j.ID + "/files/workspace/x"},
		{"GET", "/jails/nonexistent"},
	}
	for _, tok := range []string{"", "wrong", d.token + "x", strings.ToUpper(d.token)} {
		c := newClient("http://"+d.addr, tok)
		for _, rt := range routes {
			r := c.do(t, rt[0], rt[1], "{}")
			if r.status != http.StatusUnauthorized {
				t.Errorf("%s %s with token %q: want 401, got %s", rt[0], rt[1], tok, r)
				continue
			}
			if r.errorMessage() == "" {
				t.Errorf("%s %s: the 401 has no error body: %s", rt[0], rt[1], r)
			}
		}
	}
	// Basic auth, a token in the query: refused too.
	r := d.api.do(t, "GET", "/jails?token="+d.token, nil, "Authorization", "Basic "+d.token)
	if r.status != http.StatusUnauthorized {
		t.Errorf("basic auth: want 401, got %s", r)
	}
	// The jail is untouched.
	if got := d.getJail(t, j.ID); got.Status != "created" {
		t.Errorf("after unauthorized requests the jail is %s", got.Status)
	}
}

func TestAPIBadInput(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, nil)
	cases := []struct {
		name    string
		method  string
		path    string
		body    any
		status  int
		message string
	}{
		{"malformed JSON", "POST", "/jails", `{"name": "x",`, 400, ""},
		{"not an object", "POST", "/jails", `[1,2]`, 400, ""},
		{"trailing data", "POST", "/jails", `{"name":"x"} {}`, 400, ""},
		{"unknown top-level key", "POST", "/jails", map[string]any{"name": "x", "bogus_key": 1}, 400, "bogus_key"},
		{"unknown nested key", "POST", "/jails", map[string]any{"isolation": map[string]any{"resources": map[string]any{"memory_mb": 1}}}, 400, "memory_mb"},
		{"wrong type", "POST", "/jails", map[string]any{"isolation": map[string]any{"resources": map[string]any{"memory_bytes": "lots"}}}, 400, "memory_bytes"},
		{"memory above max", "POST", "/jails", map[string]any{"isolation": map[string]any{"resources": map[string]any{"memory_bytes": 9 << 30}}}, 422, "isolation.resources.memory_bytes"},
		{"pids above max", "POST", "/jails", map[string]any{"isolation": map[string]any{"resources": map[string]any{"pids_limit": 100000}}}, 422, "isolation.resources.pids_limit"},
		{"disk below min", "POST", "/jails", map[string]any{"isolation": map[string]any{"resources": map[string]any{"disk_bytes": 1 << 20}}}, 422, "isolation.resources.disk_bytes"},
		{"bad name", "POST", "/jails", map[string]any{"name": "no spaces/slashes!"}, 422, "name"},
		{"name too long", "POST", "/jails", map[string]any{"name": strings.Repeat("a", 64)}, 422, "name"},
		{"unknown level", "POST", "/jails", map[string]any{"isolation": map[string]any{"level": "quantum"}}, 422, "isolation.level"},
		{"unknown network mode", "POST", "/jails", map[string]any{"isolation": map[string]any{"network": map[string]any{"mode": "wormhole"}}}, 422, "isolation.network.mode"},
		{"relative workspace", "POST", "/jails", map[string]any{"isolation": map[string]any{"filesystem": map[string]any{"workspace_root": "work"}}}, 422, "isolation.filesystem.workspace_root"},
		{"unknown capability", "POST", "/jails", map[string]any{"isolation": map[string]any{"process": map[string]any{"capabilities": []string{"CAP_TELEPORT"}}}}, 422, "capabilities"},
		{"huge body", "POST", "/jails", `{"name":"` + strings.Repeat("a", 5<<20) + `"}`, 413, ""},
		{"YAML on a JSON route", "POST", "/jails/" + j.ID + "/exec", nil, 400, "Content-Type"},
		{"exec without cmd", "POST", "/jails/" + j.ID + "/exec", map[string]any{}, 0, "cmd"},
		{"exec unknown key", "POST", "/jails/" + j.ID + "/exec", map[string]any{"cmd": []string{"true"}, "shell": true}, 400, "shell"},
		{"exec huge body", "POST", "/jails/" + j.ID + "/exec", `{"cmd":["true"],"stdin":"` + strings.Repeat("a", 5<<20) + `"}`, 413, ""},
		{"unknown jail: get", "GET", "/jails/doesnotexist", nil, 404, "doesnotexist"},
		{"unknown jail: start", "POST", "/jails/doesnotexist/start", nil, 404, ""},
		{"unknown jail: stop", "POST", "/jails/doesnotexist/stop", nil, 404, ""},
		{"unknown jail: delete", "DELETE", "/jails/doesnotexist", nil, 404, ""},
		{"unknown jail: exec", "POST", "/jails/doesnotexist/exec", map[string]any{"cmd": []string{"true"}}, 404, ""},
		{"unknown jail: stream", "POST", "/jails/doesnotexist/exec/stream", map[string]any{"cmd": []string{"true"}}, 404, ""},
		{"unknown jail: files", "GET", "/jails/doesnotexist/files/workspace", nil, 404, ""},
		{"unknown route", "GET", "/nope", nil, 404, ""},
		{"unknown query parameter", "GET", "/jails/" + j.ID + "/files/workspace?recursive=maybe", nil, 400, "recursive"},
		{"missing file", "GET", "/jails/" + j.ID + "/files/workspace/does/not/exist", nil, 404, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var r *response
			if c.name == "YAML on a JSON route" {
				r = d.api.do(t, c.method, c.path, "cmd: [\"true\"]\n", "Content-Type", "application/yaml")
			} else {
				r = d.api.do(t, c.method, c.path, c.body)
			}
			switch {
			case c.status == 0 && r.status != 400 && r.status != 422:
				t.Errorf("want 400 or 422, got %s", r)
			case c.status != 0 && r.status != c.status:
				t.Errorf("want %d, got %s", c.status, r)
			}
			var e apiError
			if err := json.Unmarshal(r.body, &e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
				t.Errorf("not an error body {\"error\":{\"code\",\"message\"}}: %s", r)
			}
			if c.message != "" && !strings.Contains(e.Error.Message, c.message) {
				t.Errorf("the message does not name %q: %q", c.message, e.Error.Message)
			}
		})
	}
	// None of the refused creates made a jail.
	var list struct {
		Jails []jailInfo `json:"jails"`
	}
	d.api.want(t, http.StatusOK, "GET", "/jails", nil, &list)
	for _, x := range list.Jails {
		if x.Name == "x" || strings.HasPrefix(x.Name, "aaaa") {
			t.Errorf("a refused create left a jail: %+v", x)
		}
	}
}

func TestAPILifecycle(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, map[string]any{"start": false})
	if j.Status != "created" || j.Pid != 0 {
		t.Fatalf("created with start=false: %+v", j)
	}
	if !bytes.Contains(j.Config, []byte(`"memory_bytes":536870912`)) || !bytes.Contains(j.Config, []byte(`"workspace_root":"/workspace"`)) {
		t.Errorf("the config is not reported with its defaults: %s", j.Config)
	}
	run := execReq{Cmd: []string{"echo", "hi"}}
	want409 := func(method, path string, body any) {
		t.Helper()
		if r := d.api.do(t, method, path, body); r.status != http.StatusConflict {
			t.Errorf("%s %s in state %s: want 409, got %s", method, path, d.getJail(t, j.ID).Status, r)
		}
	}
	want409("POST", "/jails/"+j.ID+"/exec", run)
	want409("POST", "/jails/"+j.ID+"/stop", nil)

	for round := range 2 {
		var got jailInfo
		d.api.want(t, http.StatusOK, "POST", "/jails/"+j.ID+"/start", nil, &got)
		if got.Status != "running" || got.Pid == 0 {
			t.Fatalf("round %d: after start: %+v", round, got)
		}
		want409("POST", "/jails/"+j.ID+"/start", nil)
		if res := d.exec(t, j.ID, run); res.Stdout != "hi\n" || res.ExitCode != 0 {
			t.Fatalf("round %d: exec: %s", round, &res)
		}
		g := d.getJail(t, j.ID)
		if g.Stats == nil || g.Stats.MemoryBytes == 0 || g.Stats.Pids == 0 || g.Stats.CPUTimeNs == 0 || g.Stats.PidsLimit != 128 {
			t.Errorf("round %d: stats of a running jail: %+v", round, g.Stats)
		}
		// By name too.
		if byName := d.getJail(t, j.Name); byName.ID != j.ID {
			t.Errorf("GET /jails/{name}: %+v", byName)
		}
		got = jailInfo{}
		d.api.want(t, http.StatusOK, "POST", "/jails/"+j.ID+"/stop", map[string]any{"timeout_s": 2}, &got)
		if got.Status != "stopped" || got.Pid != 0 {
			t.Fatalf("round %d: after stop: %+v", round, got)
		}
		want409("POST", "/jails/"+j.ID+"/stop", nil)
		want409("POST", "/jails/"+j.ID+"/exec", run)
		want409("POST", "/jails/"+j.ID+"/exec/stream", run)
	}
	// Files written before a stop survive it.
	d.api.want(t, http.StatusOK, "POST", "/jails/"+j.ID+"/start", nil, nil)
	d.putFile(t, j.ID, "/workspace/keep", []byte("kept"))
	d.api.want(t, http.StatusOK, "POST", "/jails/"+j.ID+"/stop", nil, nil)
	d.api.want(t, http.StatusOK, "POST", "/jails/"+j.ID+"/start", nil, nil)
	if out := d.mustSh(t, j.ID, "cat /workspace/keep"); out != "kept" {
		t.Errorf("a file did not survive stop/start: %q", out)
	}

	// Names are unique.
	r := d.api.do(t, "POST", "/jails", map[string]any{"name": j.Name})
	if r.status != http.StatusConflict || !strings.Contains(r.errorMessage(), j.Name) {
		t.Errorf("a second jail named %s: want 409 naming it, got %s", j.Name, r)
	}

	var list struct {
		Jails []jailInfo `json:"jails"`
	}
	d.api.want(t, http.StatusOK, "GET", "/jails", nil, &list)
	found := false
	for _, x := range list.Jails {
		found = found || x.ID == j.ID
	}
	if !found {
		t.Errorf("GET /jails does not list %s", j.ID)
	}

	d.api.want(t, http.StatusNoContent, "DELETE", "/jails/"+j.ID, nil, nil)
	d.api.want(t, http.StatusNotFound, "GET", "/jails/"+j.ID, nil, nil)
	d.api.want(t, http.StatusNotFound, "DELETE", "/jails/"+j.ID, nil, nil)
	// The name is free again.
	var again jailInfo
	d.api.want(t, http.StatusCreated, "POST", "/jails", map[string]any{"name": j.Name, "start": false}, &again)
	d.destroy(t, again.ID)
}

func TestAPIExec(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, map[string]any{"env": map[string]string{"JAIL_VAR": "from-config"}})
	id := j.ID

	t.Run("stdin", func(t *testing.T) {
		res := d.exec(t, id, execReq{Cmd: []string{"sh", "-c", "tr a-z A-Z; echo done >&2"}, Stdin: "hello\nworld\n"})
		if res.Stdout != "HELLO\nWORLD\n" || res.Stderr != "done\n" || res.ExitCode != 0 {
			t.Errorf("%s", &res)
		}
	})
	t.Run("env", func(t *testing.T) {
		res := d.exec(t, id, execReq{Cmd: []string{"sh", "-c", `echo "$FOO|$JAIL_VAR"`}, Env: map[string]string{"FOO": "bar baz"}})
		if res.Stdout != "bar baz|from-config\n" {
			t.Errorf("%s", &res)
		}
		res = d.exec(t, id, execReq{Cmd: []string{"sh", "-c", `echo "$FOO|$JAIL_VAR"`}})
		if res.Stdout != "|from-config\n" {
			t.Errorf("an exec's env leaked into the next: %s", &res)
		}
	})
	t.Run("cwd", func(t *testing.T) {
		if res := d.exec(t, id, execReq{Cmd: []string{"pwd"}}); res.Stdout != "/workspace\n" {
			t.Errorf("default cwd: %s", &res)
		}
		if res := d.exec(t, id, execReq{Cmd: []string{"pwd"}, Cwd: "/tmp"}); res.Stdout != "/tmp\n" {
			t.Errorf("cwd /tmp: %s", &res)
		}
		r := d.api.do(t, "POST", "/jails/"+id+"/exec", execReq{Cmd: []string{"pwd"}, Cwd: "/does/not/exist"})
		if r.status == http.StatusOK && strings.Contains(string(r.body), `"exit_code":0`) || r.status/100 == 5 {
			t.Errorf("a cwd that does not exist: want a 4xx or a failed command, got %s", r)
		}
	})
	t.Run("user", func(t *testing.T) {
		for user, want := range map[string]string{"": "1000 1000 agent", "agent": "1000 1000 agent", "root": "0 0 root", "0": "0 0 root", "1000": "1000 1000 agent"} {
			res := d.exec(t, id, execReq{Cmd: []string{"sh", "-c", "echo $(id -u) $(id -g) $(id -un)"}, User: user})
			if strings.TrimSpace(res.Stdout) != want {
				t.Errorf("user %q: want %q: %s", user, want, &res)
			}
		}
		r := d.api.do(t, "POST", "/jails/"+id+"/exec", execReq{Cmd: []string{"true"}, User: "nosuchuser"})
		if r.status/100 != 4 {
			t.Errorf("unknown user: want 4xx, got %s", r)
		}
		// The workspace belongs to the jail's user.
		if out := d.mustSh(t, id, "stat -c '%u %a' /workspace; touch /workspace/mine && echo ok"); !strings.HasPrefix(out, "1000 ") || !strings.Contains(out, "ok") {
			t.Errorf("the workspace: %q", out)
		}
	})
	t.Run("exit codes", func(t *testing.T) {
		for _, code := range []int{0, 1, 3, 42, 255} {
			res := d.exec(t, id, execReq{Cmd: []string{"sh", "-c", fmt.Sprintf("exit %d", code)}})
			if res.ExitCode != code || res.Signal != "" {
				t.Errorf("exit %d: %s", code, &res)
			}
		}
		res := d.exec(t, id, execReq{Cmd: []string{"sh", "-c", "kill -TERM $$"}})
		if !strings.Contains(res.Signal, "TERM") {
			t.Errorf("killed by SIGTERM: %s", &res)
		}
		r := d.api.do(t, "POST", "/jails/"+id+"/exec", execReq{Cmd: []string{"no-such-command-here"}})
		if r.status == http.StatusOK && !strings.Contains(string(r.body), `"exit_code":127`) {
			t.Errorf("a command that does not exist: want exit 127 or a 4xx, got %s", r)
		} else if r.status != http.StatusOK && r.status/100 != 4 {
			t.Errorf("a command that does not exist: want exit 127 or a 4xx, got %s", r)
		}
	})
	t.Run("timeout kills the tree", func(t *testing.T) {
		start := time.Now()
		res := d.exec(t, id, execReq{
			Cmd:       []string{"sh", "-c", "setsid sleep 3001 & (sleep 3002 &) ; setsid sh -c 'sleep 3003 & wait' & sleep 3004"},
			TimeoutMs: 1000,
		})
		if !res.TimedOut {
			t.Errorf("timed_out is false: %s", &res)
		}
		if el := time.Since(start); el > 15*time.Second {
			t.Errorf("the 1 s timeout took %v", el)
		}
		if res.DurationMs < 900 || res.DurationMs > 15000 {
			t.Errorf("duration_ms %v for a 1 s timeout", res.DurationMs)
		}
		var left string
		if err := waitFor(3*time.Second, func() error {
			out := d.mustSh(t, id, "ps -eo stat=,args= | grep -v '^Z' | grep 'sleep 300' | grep -v grep || true")
			left = out
			if strings.TrimSpace(out) != "" {
				return fmt.Errorf("still running")
			}
			return nil
		}); err != nil {
			t.Errorf("processes survived the timeout:\n%s", left)
		}
	})
	t.Run("truncation", func(t *testing.T) {
		res := d.exec(t, id, execReq{Cmd: []string{"sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' a; echo err >&2"}})
		if !res.Truncated || len(res.Stdout) != 1<<20 || res.ExitCode != 0 || res.Stderr != "err\n" {
			t.Errorf("3 MB of output: truncated %v, %d bytes kept, exit %d, stderr %q", res.Truncated, len(res.Stdout), res.ExitCode, res.Stderr)
		}
		res = d.exec(t, id, execReq{Cmd: []string{"sh", "-c", "head -c 1000 /dev/zero | tr '\\0' a"}})
		if res.Truncated || len(res.Stdout) != 1000 {
			t.Errorf("1000 bytes of output: truncated %v, %d bytes", res.Truncated, len(res.Stdout))
		}
	})
}

// streamEvent is one line of an exec stream.
type streamEvent struct {
	Type     string `json:"type"`
	Data     string `json:"data"`
	ExitCode int    `json:"exit_code"`
	TimedOut bool   `json:"timed_out"`
}

func TestAPIExecStream(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, nil)
	// The command cannot end before the test creates /workspace/go, which
	// it does only after reading the first chunk.
	body, _ := json.Marshal(execReq{
		Cmd:       []string{"sh", "-c", "echo first; echo oops >&2; while [ ! -e /workspace/go ]; do sleep 0.05; done; echo second; exit 7"},
		TimeoutMs: 60_000,
	})
	req, err := http.NewRequest("POST", "http://"+d.addr+"/jails/"+j.ID+"/exec/stream", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+d.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST exec/stream: HTTP %d", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.Contains(ct, "ndjson") {
		t.Errorf("Content-Type %q", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	var events []streamEvent
	released := false
	for sc.Scan() {
		var ev streamEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("a stream line is not JSON: %q", sc.Text())
		}
		events = append(events, ev)
		if ev.Type == "stdout" && strings.Contains(ev.Data, "first") && !released {
			released = true
			d.putFile(t, j.ID, "/workspace/go", nil)
		}
		if ev.Type == "exit" {
			break
		}
	}
	if !released {
		t.Fatalf("the first chunk never came before the end: %+v", events)
	}
	var stdout, stderr string
	last := events[len(events)-1]
	for _, ev := range events {
		switch ev.Type {
		case "stdout":
			stdout += ev.Data
		case "stderr":
			stderr += ev.Data
		}
	}
	if stdout != "first\nsecond\n" || stderr != "oops\n" || last.Type != "exit" || last.ExitCode != 7 {
		t.Errorf("stream: stdout %q stderr %q last %+v", stdout, stderr, last)
	}
}

func TestAPIFiles(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, map[string]any{"isolation": map[string]any{"filesystem": map[string]any{
		"blocked_paths": []string{"/workspace/secret", "/etc/agentjail-blocked", "/usr/share/doc"},
	}}})
	base := "/jails/" + j.ID + "/files"

	data := make([]byte, 256*1024)
	for i := range data {
		data[i] = byte(i * 7)
	}
	var info fileInfo
	d.api.want(t, http.StatusCreated, "PUT", base+"/workspace/dir/data.bin", data, &info)
	if info.Size != int64(len(data)) || info.Type != "file" || info.UID != 1000 {
		t.Errorf("PUT answer: %+v", info)
	}
	r := d.api.want(t, http.StatusOK, "GET", base+"/workspace/dir/data.bin", nil, nil)
	if !bytes.Equal(r.body, data) {
		t.Errorf("GET returned %d bytes, not what was written", len(r.body))
	}
	if out := d.mustSh(t, j.ID, "sha256sum /workspace/dir/data.bin | cut -c1-64"); strings.TrimSpace(out) != sha256Hex(data) {
		t.Errorf("the file in the jail differs from what was written")
	}
	// Written in the jail, read through the API.
	d.mustSh(t, j.ID, "printf 'from inside' > /workspace/dir/inside.txt; mkdir -p /workspace/dir/sub")
	r = d.api.want(t, http.StatusOK, "GET", base+"/workspace/dir/inside.txt", nil, nil)
	if string(r.body) != "from inside" {
		t.Errorf("GET inside.txt: %s", r)
	}

	var listing struct {
		Path    string     `json:"path"`
		Entries []fileInfo `json:"entries"`
	}
	d.api.want(t, http.StatusOK, "GET", base+"/workspace/dir", nil, &listing)
	names := map[string]string{}
	for _, e := range listing.Entries {
		names[e.Name] = e.Type
	}
	if listing.Path != "/workspace/dir" || names["data.bin"] != "file" || names["inside.txt"] != "file" || names["sub"] != "dir" || len(names) != 3 {
		t.Errorf("listing: %+v", listing)
	}
	d.api.want(t, http.StatusOK, "GET", base+"/workspace/dir/data.bin?stat=true", nil, &info)
	if info.Size != int64(len(data)) || info.Type != "file" || info.Mode != "0644" {
		t.Errorf("stat: %+v", info)
	}
	d.api.want(t, http.StatusCreated, "PUT", base+"/workspace/dir/x.sh?mode=0755", "#!/bin/sh\necho run\n", &info)
	if out := d.mustSh(t, j.ID, "/workspace/dir/x.sh"); out != "run\n" {
		t.Errorf("an uploaded script with mode 0755: %q", out)
	}
	d.api.want(t, http.StatusCreated, "PUT", base+"/workspace/newdir?type=dir", nil, &info)
	if info.Type != "dir" {
		t.Errorf("mkdir: %+v", info)
	}

	var acc struct {
		Accessible bool   `json:"accessible"`
		Reason     string `json:"reason"`
	}
	d.api.want(t, http.StatusOK, "GET", base+"/workspace/dir/data.bin?access=write", nil, &acc)
	if !acc.Accessible {
		t.Errorf("the jail user cannot write its own file: %+v", acc)
	}
	d.api.want(t, http.StatusOK, "GET", base+"/etc/shadow?access=read", nil, &acc)
	if acc.Accessible {
		t.Errorf("the jail user may read /etc/shadow: %+v", acc)
	}
	d.api.want(t, http.StatusOK, "GET", base+"/usr/bin/env?access=write", nil, &acc)
	if acc.Accessible {
		t.Errorf("the jail user may write /usr/bin/env: %+v", acc)
	}

	d.api.want(t, http.StatusNoContent, "DELETE", base+"/workspace/dir/data.bin", nil, nil)
	d.api.want(t, http.StatusNotFound, "GET", base+"/workspace/dir/data.bin", nil, nil)
	if r := d.api.do(t, "DELETE", base+"/workspace/dir", nil); r.status/100 == 2 {
		t.Errorf("deleting a non-empty dir without recursive: %s", r)
	}
	d.api.want(t, http.StatusNoContent, "DELETE", base+"/workspace/dir?recursive=true", nil, nil)
	if out := d.mustSh(t, j.ID, "ls -A /workspace/dir 2>&1 || true"); !strings.Contains(out, "No such file") {
		t.Errorf("after a recursive delete: %q", out)
	}

	// Blocked paths: refused by the API (403), masked in the jail.
	for _, p := range []string{"/workspace/secret", "/workspace/secret/a", "/etc/agentjail-blocked", "/usr/share/doc", "/usr/share/doc/bash"} {
		for _, m := range []string{"GET", "PUT", "DELETE"} {
			var body any
			if m == "PUT" {
				body = "x"
			}
			if r := d.api.do(t, m, base+p, body); r.status != http.StatusForbidden {
				t.Errorf("%s %s (blocked): want 403, got %s", m, p, r)
			}
		}
		if r := d.api.do(t, "GET", base+p+"?stat=true", nil); r.status != http.StatusForbidden {
			t.Errorf("stat %s (blocked): want 403, got %s", p, r)
		}
	}
	// Through a symlink to a blocked path too.
	d.mustSh(t, j.ID, "ln -s /workspace/secret /workspace/to-secret")
	if r := d.api.do(t, "PUT", base+"/workspace/to-secret/a", "x"); r.status/100 != 4 {
		t.Errorf("PUT through a symlink to a blocked path: want a refusal, got %s", r)
	}
	if out := d.mustSh(t, j.ID, "ls -A /workspace/secret 2>/dev/null | wc -l"); strings.TrimSpace(out) != "0" {
		t.Errorf("a PUT through a symlink wrote under the blocked /workspace/secret")
	}
	// A blocked path that exists is masked inside the jail.
	if out := d.mustSh(t, j.ID, "ls -A /usr/share/doc 2>/dev/null | wc -l"); strings.TrimSpace(out) != "0" {
		t.Errorf("the blocked /usr/share/doc is not masked in the jail: %s entries", strings.TrimSpace(out))
	}
}

// readmeYAML is the configuration example of README.md.
const readmeYAML = `name: %s
start: true
env:
  CI: "true"
isolation:
  level: container
  filesystem:
    rootfs: host
    workspace_root: /workspace
    read_only_mounts:
      - {source: /usr/share/common-licenses, target: /licenses}
    read_write_mounts: []
    blocked_paths: [/workspace/.secrets]
  network:
    mode: isolated
  resources:
    cpu_shares: 256
    cpu_quota: 50000
    cpu_period: 100000
    memory_bytes: 536870912
    memory_swap_bytes: 536870912
    disk_bytes: 1073741824
    pids_limit: 128
    nofile_limit: 1024
  process:
    user: agent
    capabilities: []
    drop_capabilities: []
`

// TestAPICreateYAML creates a jail from the README's YAML example.
func TestAPICreateYAML(t *testing.T) {
	d := shared(t)
	r := d.api.do(t, "POST", "/jails", fmt.Sprintf(readmeYAML, uniqueName(t)), "Content-Type", "application/yaml")
	if r.status != http.StatusCreated {
		t.Fatalf("POST /jails (YAML): %s", r)
	}
	var j jailInfo
	if err := json.Unmarshal(r.body, &j); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.destroy(t, j.ID) })
	out := d.mustSh(t, j.ID, "echo $CI; test -f /licenses/GPL-3 && echo mounted; touch /licenses/x 2>/dev/null || echo read-only")
	if out != "true\nmounted\nread-only\n" {
		t.Errorf("the README's jail: %q", out)
	}
}

// TestAPIConcurrentCreate creates jails at the same time: every create
// succeeds and every jail runs commands.
func TestAPIConcurrentCreate(t *testing.T) {
	d := shared(t)
	const n = 8
	ids := make([]string, n)
	errs := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := d.api.send("POST", "/jails", map[string]any{"name": fmt.Sprintf("%s-%d", uniqueName(t), i)})
			switch {
			case err != nil:
				errs[i] = err.Error()
			case r.status != http.StatusCreated:
				errs[i] = r.String()
			default:
				var j jailInfo
				if err := json.Unmarshal(r.body, &j); err != nil {
					errs[i] = err.Error()
				}
				ids[i] = j.ID
			}
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if id != "" {
			t.Cleanup(func() { d.destroy(t, id) })
		}
	}
	for i, e := range errs {
		if e != "" {
			t.Errorf("create %d of %d concurrent: %s", i, n, e)
		}
	}
	if t.Failed() {
		t.Fatalf("the daemon's errors:\n%s", d.errorLines(3))
	}
	for _, id := range ids {
		if res := d.exec(t, id, execReq{Cmd: []string{"echo", id}}); res.Stdout != id+"\n" {
			t.Errorf("exec in %s: %s", id, &res)
		}
	}
}
