package accounts

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/sys/user"
)

const passwd = `# comment
root:x:0:0:root:/root:/bin/bash
  agent:x:1000:1000:Agent:/home/agent:/bin/sh
broken:x:notanumber:1::/:/bin/sh
short:x
nogid:x:7:
neg:x:-1:-1::/:/bin/sh
toor:x:0:0::/root:/bin/sh
`

func TestUsersPassesOverMalformedLines(t *testing.T) {
	users, err := Users(strings.NewReader(passwd), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, u := range users {
		names = append(names, u.Name)
	}
	if got := strings.Join(names, ","); got != "root,agent,toor" {
		t.Fatalf("users %s, want root,agent,toor (malformed ids must not read as root)", got)
	}
	a := users[1]
	if a.Uid != 1000 || a.Gid != 1000 || a.Home != "/home/agent" || a.Shell != "/bin/sh" || a.Gecos != "Agent" {
		t.Fatalf("agent = %+v", a)
	}
	only, err := Users(strings.NewReader(passwd), func(u user.User) bool { return u.Uid == 0 })
	if err != nil || len(only) != 2 {
		t.Fatalf("filter: %+v %v", only, err)
	}
}

func TestGroups(t *testing.T) {
	groups, err := Groups(strings.NewReader("root:x:0:\n#c\ndev:x:2000:agent,other\nbad:x:x:agent\nlong:x:3000:"+strings.Repeat("u,", 100000)+"agent\n"), func(g user.Group) bool {
		for _, m := range g.List {
			if m == "agent" {
				return true
			}
		}
		return false
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) != 2 || groups[0].Gid != 2000 || groups[1].Gid != 3000 {
		t.Fatalf("groups of agent: %+v", groups)
	}
}

func TestLineTooLong(t *testing.T) {
	if _, err := Users(strings.NewReader("a:x:1:1::/:"+strings.Repeat("x", 2<<20)+"\n"), nil); err == nil {
		t.Fatal("a 2 MiB line was accepted")
	}
}

func isZero(s string) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n == 0
}

// FuzzUsers: any bytes parse without a panic, and no entry reads as uid or
// gid 0 unless its line says 0.
func FuzzUsers(f *testing.F) {
	f.Add(passwd)
	f.Add("a:b:c:d:e:f:g:h\n::0:0\n:\n")
	f.Fuzz(func(t *testing.T, data string) {
		users, err := Users(strings.NewReader(data), nil)
		if err != nil {
			return
		}
		roots := 0
		for _, line := range strings.Split(data, "\n") {
			if f := strings.Split(strings.TrimSpace(line), ":"); len(f) > 3 && !strings.HasPrefix(f[0], "#") && isZero(f[2]) {
				roots++
			}
		}
		for _, u := range users {
			if u.Uid < 0 || u.Gid < 0 {
				t.Fatalf("negative id: %+v", u)
			}
			if u.Uid == 0 {
				roots--
			}
		}
		if roots < 0 {
			t.Fatalf("more entries read as uid 0 than lines say so:\n%q", data)
		}
		if _, err := Groups(strings.NewReader(data), nil); err != nil {
			return
		}
	})
}

func TestFindByNameOrUID(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	for spec, want := range map[string]string{"agent": "/home/agent", "1000": "/home/agent", "0": "/root", "broken": "", "ghost": ""} {
		u, ok := Find(root, spec)
		if ok != (want != "") || u.Home != want {
			t.Errorf("Find(%q) = %+v %v, want home %q", spec, u, ok, want)
		}
	}
	if _, ok := Find(t.TempDir(), "root"); ok {
		t.Error("a tree without /etc/passwd has a root entry")
	}
}
