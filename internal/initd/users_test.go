package initd

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/agentjail/agentjail/internal/initproto"
)

func TestLookupUser(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	passwd := "# comment\nroot:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000::/home/agent:/bin/sh\nbroken:x:notanumber:1::/:/bin/sh\n"
	group := "root:x:0:\nagent:x:1000:\ndev:x:2000:agent,other\nops:x:3000:other\n"
	os.WriteFile(filepath.Join(dir, "etc/passwd"), []byte(passwd), 0o644)
	os.WriteFile(filepath.Join(dir, "etc/group"), []byte(group), 0o644)
	r, err := openRoot(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	for _, tc := range []struct {
		spec, group string
		want        identity
	}{
		{"agent", "", identity{Name: "agent", UID: 1000, GID: 1000, Groups: []int{1000, 2000}, Home: "/home/agent"}},
		{"1000", "", identity{Name: "agent", UID: 1000, GID: 1000, Groups: []int{1000, 2000}, Home: "/home/agent"}},
		{"agent", "ops", identity{Name: "agent", UID: 1000, GID: 3000, Groups: []int{3000, 2000}, Home: "/home/agent"}},
		{"agent", "4000", identity{Name: "agent", UID: 1000, GID: 4000, Groups: []int{4000, 2000}, Home: "/home/agent"}},
		{"root", "", identity{Name: "root", UID: 0, GID: 0, Groups: []int{0}, Home: "/root"}},
		{"5000", "", identity{Name: "5000", UID: 5000, GID: 5000, Groups: []int{5000}}},
	} {
		got, err := r.lookupUser(tc.spec, tc.group)
		if err != nil {
			t.Errorf("%s/%s: %v", tc.spec, tc.group, err)
			continue
		}
		if got.Name != tc.want.Name || got.UID != tc.want.UID || got.GID != tc.want.GID || got.Home != tc.want.Home || !slices.Equal(got.Groups, tc.want.Groups) {
			t.Errorf("%s/%s: got %+v, want %+v", tc.spec, tc.group, *got, tc.want)
		}
	}
	// A user without a home gets the config's, else "/".
	for cfgHome, want := range map[string]string{"": "/", "/var/lib/jail/home": "/var/lib/jail/home"} {
		s := &Server{root: r, cfg: initproto.InitConfig{Home: cfgHome}}
		if got, err := s.lookupUser("5000", ""); err != nil || got.Home != want {
			t.Errorf("uid 5000 with config home %q: %+v %v, want home %q", cfgHome, got, err, want)
		}
		if got, err := s.lookupUser("agent", ""); err != nil || got.Home != "/home/agent" {
			t.Errorf("agent with config home %q: %+v %v", cfgHome, got, err)
		}
	}
	for _, tc := range [][2]string{{"nobody", ""}, {"broken", ""}, {"agent", "nogroup"}, {"-1", ""}, {"", ""}} {
		_, err := r.lookupUser(tc[0], tc[1])
		if pe := protoError(err); err == nil || pe.Kind != initproto.KindInvalid {
			t.Errorf("%q/%q: got %v, want an invalid error", tc[0], tc[1], err)
		}
	}
}

func TestParseSignal(t *testing.T) {
	for in, want := range map[string]int{"SIGTERM": 15, "term": 15, "KILL": 9, "10": 10} {
		got, err := parseSignal(in)
		if err != nil || int(got) != want {
			t.Errorf("%q: %v %v", in, got, err)
		}
	}
	for _, in := range []string{"", "SIGNOPE", "0", "99"} {
		if _, err := parseSignal(in); err == nil {
			t.Errorf("%q parsed", in)
		}
	}
}
