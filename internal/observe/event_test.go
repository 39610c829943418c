package observe

import (
	"encoding/json"
	"testing"
)

func TestEventJSONFieldNames(t *testing.T) {
	cases := []struct {
		ev   Event
		want []string
	}{
		{Event{Type: TypeSyscall, TS: 1706000000000123456, PID: 42, TID: 42, Comm: "python3", NR: 1, Args: [6]uint64{1, 140234567, 128}, Ret: 128, DurNS: 1234},
			[]string{"type", "ts", "pid", "tid", "comm", "nr", "name", "args", "ret", "dur_ns", "host_pid"}},
		{Event{Type: TypeFile, PID: 42, Op: "write", Path: "/tmp/output.txt", Bytes: 1024, FD: -1},
			[]string{"type", "ts", "pid", "op", "path", "bytes"}},
		{Event{Type: TypeNet, PID: 42, Dir: "egress", Proto: "tcp", Src: "10.0.0.2:54321", Dst: "93.184.216.34:443", Bytes: 512},
			[]string{"type", "ts", "pid", "dir", "proto", "src", "dst", "bytes"}},
		{Event{Type: TypeProc, Op: "exec", PID: 43, PPID: 42, Exe: "/usr/bin/curl", Argv: []string{"curl", "https://example.com"}},
			[]string{"type", "ts", "op", "pid", "ppid", "exe", "argv", "cwd", "uid"}},
		{Event{Type: TypeProc, Op: "exit", PID: 43, Signal: 9}, []string{"signal"}},
		{Event{Type: TypeLost, Source: LostKernel, Lost: 7}, []string{"type", "source", "count"}},
	}
	for _, c := range cases {
		b := c.ev.AppendJSON(nil)
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s: invalid JSON: %v", b, err)
		}
		for _, f := range c.want {
			if _, ok := m[f]; !ok {
				t.Errorf("%s: missing %q", b, f)
			}
		}
		if m["type"] != c.ev.Type.String() {
			t.Errorf("%s: type %v", b, m["type"])
		}
	}
	ev := Event{Type: TypeSyscall, NR: 1, TS: 1706000000000123456}
	var m map[string]any
	json.Unmarshal(ev.AppendJSON(nil), &m)
	if m["name"] != "write" || m["ts"] != float64(1706000000000) {
		t.Errorf("name %v ts %v", m["name"], m["ts"])
	}
	if _, ok := m["count"]; ok {
		t.Errorf("one call has a count: %v", m)
	}
	ev.Count, ev.LastTS = 3, ev.TS+500
	m = nil
	json.Unmarshal(ev.AppendJSON(nil), &m)
	if m["count"] != float64(3) || m["last_ts_ns"] != float64(ev.LastTS) {
		t.Errorf("run of 3 calls: count %v last_ts_ns %v", m["count"], m["last_ts_ns"])
	}
}

func TestSyscallNames(t *testing.T) {
	if SyscallName(0) != "read" || SyscallName(59) != "execve" || SyscallName(452) != "fchmodat2" || SyscallName(-1) != "" {
		t.Fatal("syscall table")
	}
	if nr, ok := SyscallNumber("openat"); !ok || nr != 257 {
		t.Fatalf("openat = %d", nr)
	}
	if _, err := ParseType("nope"); err == nil {
		t.Fatal("ParseType accepted nope")
	}
}
