package netpolicy

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
)

// tableObjects lists what the manager's table holds, from `nft -j list
// table`: each chain, set and counter by kind and name, each rule by its
// chain and handle, each element of a verdict map by map and key; the
// value is the object's handle and content (counters' values left out:
// the byte harvest resets them every second).
func tableObjects(t *testing.T, m *Manager) map[string]string {
	t.Helper()
	var doc struct {
		Nftables []map[string]map[string]any `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(run(t, "nft", "-j", "list", "table", "inet", m.table)), &doc); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	js := func(v any) string { b, _ := json.Marshal(v); return string(b) }
	for _, item := range doc.Nftables {
		for kind, o := range item {
			name, _ := o["name"].(string)
			switch kind {
			case "chain":
				out["chain "+name] = js(o["handle"])
			case "rule":
				out[fmt.Sprintf("rule %s %v", o["chain"], o["handle"])] = js(o["expr"])
			case "counter":
				out["counter "+name] = js(o["handle"])
			case "set":
				out["set "+name] = js(o["handle"]) + js(o["elem"])
			case "map":
				elems, _ := o["elem"].([]any)
				for _, e := range elems {
					kv, _ := e.([]any)
					if len(kv) == 2 {
						out[fmt.Sprintf("map %s %v", name, kv[0])] = js(kv[1])
					}
				}
			}
		}
	}
	return out
}

// owned returns the objects of objs that belong to the jails js: named
// after one of their ids, in one of their chains, or keyed by one of
// their interfaces.
func owned(objs map[string]string, js ...*testJail) map[string]string {
	out := map[string]string{}
	for k, v := range objs {
		for _, j := range js {
			if strings.Contains(k, j.id) || strings.HasSuffix(k, " "+j.att.Interface) {
				out[k] = v
			}
		}
	}
	return out
}

// TestAttachLeavesOtherJailsAlone: attaching, detaching or updating the
// policy of a jail changes only its own objects in the table. Every chain, rule, set, counter and
// map element of the jails attached before keeps its handle and content
// (so their counters keep counting, their learned addresses stay), and
// the transaction of an attach (and of a detach) has as many messages
// with 1 jail attached as with 8. Where an inter-jail rule relates the
// new jail to an attached one, only that jail's chain of inter-jail
// rules changes.
func TestAttachLeavesOtherJailsAlone(t *testing.T) {
	e := setup(t)
	bridge := Policy{Allow: []Rule{{Destination: "allowed.test"}, {Destination: inetA.String(), Ports: []int{7}, Protocol: ProtoTCP}},
		BytesPerHour: 1 << 30}

	// The cost of one more jail with 1 and with 8 attached.
	first := attach(t, e.m, "first", ModeBridge, bridge)
	// A learned address in the first jail's direct sets.
	if s, c := first.curl(t, nil, "http://allowed.test/"); s != "200" {
		t.Fatalf("first jail: proxied request: status %s exit %d", s, c)
	}
	probe := func(name string) (j *testJail, attachMsgs, detachMsgs int) {
		j = attach(t, e.m, name, ModeBridge, bridge)
		e.m.mu.Lock()
		attachMsgs = e.m.lastTx
		e.m.mu.Unlock()
		if err := e.m.Detach(context.Background(), j.id); err != nil {
			t.Fatal(err)
		}
		e.m.mu.Lock()
		detachMsgs = e.m.lastTx
		e.m.mu.Unlock()
		return j, attachMsgs, detachMsgs
	}
	_, a1, d1 := probe("probe-1")
	others := []*testJail{first}
	for i := range 6 {
		mode := ModeIsolated
		if i%2 == 0 {
			mode = ModeBridge
		}
		others = append(others, attach(t, e.m, fmt.Sprintf("other-%d", i), mode, bridge))
	}
	before := owned(tableObjects(t, e.m), others...)
	if !slices.ContainsFunc(slices.Collect(maps.Keys(before)), func(k string) bool {
		return strings.HasPrefix(k, "counter "+counterPrefix+first.id)
	}) {
		t.Fatalf("no counter of direct bytes for the first jail in %v", slices.Sorted(maps.Keys(before)))
	}
	if !strings.Contains(before[fmt.Sprintf("set d_%s_%d_0", first.id, 6)], inetA.String()) {
		t.Fatalf("the first jail's learned address %s is not in its direct set: %v", inetA, before)
	}
	newcomer := attach(t, e.m, "probe-8", ModeBridge, bridge)
	e.m.mu.Lock()
	a8 := e.m.lastTx
	e.m.mu.Unlock()
	after := tableObjects(t, e.m)
	if got := owned(after, others...); !maps.Equal(got, before) {
		t.Errorf("attaching one more jail changed the objects of the jails attached before:\n%s", diffObjects(before, got))
	}
	if len(owned(after, newcomer)) == 0 {
		t.Fatal("the attached jail has no objects in the table")
	}
	if err := e.m.Detach(context.Background(), newcomer.id); err != nil {
		t.Fatal(err)
	}
	e.m.mu.Lock()
	d8 := e.m.lastTx
	e.m.mu.Unlock()
	if got := owned(tableObjects(t, e.m), others...); !maps.Equal(got, before) {
		t.Errorf("detaching a jail changed the objects of the other jails:\n%s", diffObjects(before, got))
	}
	if left := owned(tableObjects(t, e.m), newcomer); len(left) > 0 {
		t.Errorf("objects of a detached jail left in the table: %v", slices.Sorted(maps.Keys(left)))
	}
	if a1 == 0 || a8 != a1 || d8 != d1 {
		t.Errorf("messages of an attach: %d with 1 jail attached, %d with 8; of a detach: %d and %d; want the same", a1, a8, d1, d8)
	}
	t.Logf("messages per attach %d, per detach %d (1 and 8 jails attached)", a1, d1)

	// A policy update replaces that jail's objects only.
	changed := bridge
	changed.Block = []Rule{{Destination: inetB.String()}}
	if err := e.m.Update(context.Background(), others[1].id, changed); err != nil {
		t.Fatal(err)
	}
	if got := owned(tableObjects(t, e.m), others[2:]...); !maps.Equal(got, owned(before, others[2:]...)) {
		t.Errorf("a policy update of one jail changed the objects of others:\n%s", diffObjects(owned(before, others[2:]...), got))
	}
	if maps.Equal(owned(tableObjects(t, e.m), others[1]), owned(before, others[1])) {
		t.Error("a policy update left the jail's objects as they were")
	}

	// An inter-jail rule of the new jail that relates it to "db" changes
	// db's chain of inter-jail rules, nothing else of db's or web's.
	web := attach(t, e.m, "web", ModeIsolated, basePolicy())
	db := attach(t, e.m, "db", ModeIsolated, basePolicy())
	before = owned(tableObjects(t, e.m), web, db)
	p := basePolicy()
	p.InterJail = []InterJailRule{{From: "db", To: "client", Ports: []int{5432}, Allow: true}}
	client := attach(t, e.m, "client", ModeIsolated, p)
	got := owned(tableObjects(t, e.m), web, db)
	for k := range before {
		if strings.HasPrefix(k, "rule "+chainFromOf+db.id+" ") {
			delete(before, k)
		}
	}
	var named []string
	for k, v := range got {
		if strings.HasPrefix(k, "rule "+chainFromOf+db.id+" ") {
			if strings.Contains(v, client.att.Interface) {
				named = append(named, k)
			}
			delete(got, k)
		}
	}
	if !maps.Equal(got, before) {
		t.Errorf("attaching a jail an inter-jail rule relates to db changed more than db's inter-jail chain:\n%s", diffObjects(before, got))
	}
	if len(named) == 0 {
		t.Error("db's chain of inter-jail rules does not name the new jail's interface")
	}
}

// diffObjects lists the objects that differ between a and b.
func diffObjects(a, b map[string]string) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(a)) {
		if b[k] != a[k] {
			out = append(out, fmt.Sprintf("- %s %s\n+ %s %s", k, a[k], k, b[k]))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(b)) {
		if _, ok := a[k]; !ok {
			out = append(out, fmt.Sprintf("+ %s %s", k, b[k]))
		}
	}
	return strings.Join(out, "\n")
}

// TestAttachFailureLeavesTable: an attach whose transaction the kernel
// refuses (here: an id too long for the names of its chains) fails with
// the table as it was and its veth removed, and the next attach works.
func TestAttachFailureLeavesTable(t *testing.T) {
	e := setup(t)
	p := basePolicy()
	p.Allow = append(p.Allow, Rule{Destination: inetA.String(), Ports: []int{7}, Protocol: ProtoTCP})
	j := attach(t, e.m, "kept", ModeBridge, p)
	before := tableObjects(t, e.m)
	_, path := addNetns(t, "ajtf")
	id := strings.Repeat("x", 300)
	if _, err := e.m.Attach(context.Background(), Jail{ID: id, Name: "long", NetnsPath: path, Mode: ModeBridge, Policy: basePolicy()}); err == nil {
		t.Fatal("attach of a jail whose chains the kernel refuses succeeded")
	}
	if got := tableObjects(t, e.m); !maps.Equal(got, before) {
		t.Errorf("a failed attach changed the table:\n%s", diffObjects(before, got))
	}
	if out := run(t, "ip", "-o", "link"); strings.Contains(out, vethName(testPrefix, id)) {
		t.Errorf("a failed attach left its veth %s", vethName(testPrefix, id))
	}
	if got := j.connect(t, inetA.String(), 7); got != "connected ping" {
		t.Errorf("allowed direct connection of the jail attached before, after a failed attach: %s", got)
	}
	if got := j.connect(t, inetB.String(), 7); got != "refused" {
		t.Errorf("direct connection no rule allows, after a failed attach: %s, want refused", got)
	}
	next := attach(t, e.m, "next", ModeIsolated, basePolicy())
	if len(owned(tableObjects(t, e.m), next)) == 0 {
		t.Error("no objects of the jail attached after a failed attach")
	}
}
