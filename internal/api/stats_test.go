package api

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestStatsOneSample(t *testing.T) {
	h := newHarness(t)
	h.create("a")
	h.create("b")
	w := h.do("GET", "/stats?follow=false&interval_ms=500", nil, nil)
	if w.Code != 200 || w.Header().Get("Content-Type") != "text/event-stream" {
		t.Fatalf("GET /stats: %d %s", w.Code, w.Body)
	}
	data, ok := strings.CutPrefix(strings.TrimSpace(w.Body.String()), "event: stats\ndata: ")
	if !ok {
		t.Fatalf("not one stats event: %q", w.Body)
	}
	var s StatsSample
	if err := json.Unmarshal([]byte(data), &s); err != nil {
		t.Fatal(err)
	}
	if len(s.Jails) != 2 || s.IntervalMs != 500 || s.Jails[0].Stats == nil {
		t.Fatalf("sample %s", data)
	}
	for _, bad := range []string{"interval_ms=10", "interval_ms=x", "interval_ms=99999999", "follow=maybe"} {
		wantError(t, h.do("GET", "/stats?"+bad, nil, nil), 400, "invalid_argument")
	}
}

func TestTailLinesAndMerge(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, from, n, step int, typ string) *os.File {
		var b strings.Builder
		for i := range n {
			ts := from + i*step
			fmt.Fprintf(&b, `{"type":"%s","ts":%d,"ts_ns":%d,"i":%d}`+"\n", typ, ts/1e6, ts, i)
		}
		b.WriteString(`{"type":"` + typ + `","ts_ns":99999999999`) // a line being written
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	// Many more lines than one backwards block holds.
	a, err := tailLines(write("a", 0, 50000, 2, "syscall"), 30000, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != 30000 || a[0].ts != 40000 || a[len(a)-1].ts != 99998 {
		t.Fatalf("tail: %d lines, %d..%d", len(a), a[0].ts, a[len(a)-1].ts)
	}
	b, err := tailLines(write("b", 1, 10, 7, "proc"), 100, 1<<30)
	if err != nil || len(b) != 10 {
		t.Fatalf("short file: %d %v", len(b), err)
	}
	// The byte bound cuts the tail and drops the torn first line.
	c, err := tailLines(write("c", 0, 1000, 1, "net"), 1000, 4096)
	if err != nil || len(c) == 0 || len(c) >= 1000 || !strings.HasPrefix(string(c[0].line), `{"type":"net"`) {
		t.Fatalf("bounded tail: %d %v", len(c), err)
	}
	m := mergeByTime([][]storedLine{a, b})
	if len(m) != len(a)+len(b) {
		t.Fatalf("merged %d", len(m))
	}
	for i := 1; i < len(m); i++ {
		if m[i].ts < m[i-1].ts {
			t.Fatalf("merge out of order at %d", i)
		}
	}
	// Identical lost lines from several files are kept once.
	lost := storedLine{ts: 5, line: []byte(`{"type":"lost","ts_ns":5}`)}
	if got := mergeByTime([][]storedLine{{lost}, {lost}, {lost}}); len(got) != 1 {
		t.Fatalf("lost lines kept %d times", len(got))
	}
	if _, err := parseHistory("200001"); err == nil {
		t.Fatal("history above the maximum accepted")
	}
}

// TestEventsHistory: ?history=N sends the last N stored events, merged by
// time from the per-type files, in batches, then history-end, then live
// events (follow=false ends there).
func TestEventsHistory(t *testing.T) {
	h := newHarness(t)
	h.create("x")
	var sys, procs strings.Builder
	for i := range 2500 {
		fmt.Fprintf(&sys, `{"type":"syscall","ts_ns":%d,"i":%d}`+"\n", 2*i, i)
	}
	for i := range 10 {
		fmt.Fprintf(&procs, `{"type":"proc","ts_ns":%d,"i":%d}`+"\n", 2*i+4001, i)
	}
	h.svc.SetEventLog("x", "syscalls", sys.String())
	h.svc.SetEventLog("x", "processes", procs.String())
	w := h.do("GET", "/jails/x/events?history=2000&follow=false", nil, nil)
	if w.Code != 200 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	var got []map[string]any
	batches := 0
	end := ""
	for _, ev := range strings.Split(w.Body.String(), "\n\n") {
		if data, ok := strings.CutPrefix(ev, "event: history\ndata: "); ok {
			var batch []map[string]any
			if err := json.Unmarshal([]byte(data), &batch); err != nil {
				t.Fatalf("history batch: %v", err)
			}
			got = append(got, batch...)
			batches++
		}
		if data, ok := strings.CutPrefix(ev, "event: history-end\ndata: "); ok {
			end = data
		}
	}
	if len(got) != 2000 || batches != 2 || end != `{"type":"history-end","count":2000}` {
		t.Fatalf("%d events in %d batches, end %q", len(got), batches, end)
	}
	procSeen := 0
	for i := 1; i < len(got); i++ {
		if got[i]["ts_ns"].(float64) < got[i-1]["ts_ns"].(float64) {
			t.Fatalf("out of time order at %d", i)
		}
		if got[i]["type"] == "proc" {
			procSeen++
		}
	}
	if procSeen != 10 || got[len(got)-1]["ts_ns"].(float64) != 4998 {
		t.Fatalf("merge: %d proc events, last %v", procSeen, got[len(got)-1])
	}
	wantError(t, h.do("GET", "/jails/x/events?history=-1", nil, nil), 400, "invalid_argument")
}
