package initd

import (
	"bufio"
	"bytes"
	"slices"
	"strconv"
	"strings"

	"github.com/agentjail/agentjail/internal/initproto"
)

// identity is a resolved jail user.
type identity struct {
	Name   string
	UID    int
	GID    int
	Groups []int // supplementary groups, including GID
	Home   string
	Shell  string // login shell from /etc/passwd (may be empty)
}

// maxAccountFile bounds how much of /etc/passwd and /etc/group is read.
const maxAccountFile = 8 << 20

// lookupUser resolves spec (a name or numeric uid) from the jail's
// /etc/passwd and /etc/group; group, when not empty, overrides the primary
// group (name or numeric gid). A numeric uid without a passwd entry runs
// with gid = uid, no supplementary groups and no home (Server.lookupUser
// gives it one). An unknown name is a KindInvalid error.
func (r *fsRoot) lookupUser(spec, group string) (*identity, error) {
	if spec == "" {
		return nil, newError(initproto.KindInvalid, "", "user is empty")
	}
	passwd, _ := r.readSmallFile("/etc/passwd", maxAccountFile)
	groups, _ := r.readSmallFile("/etc/group", maxAccountFile)
	id, err := findUser(passwd, spec)
	if err != nil {
		return nil, err
	}
	if group != "" {
		gid, err := findGroup(groups, group)
		if err != nil {
			return nil, err
		}
		id.GID = gid
	}
	id.Groups = []int{id.GID}
	forEachLine(groups, func(f []string) {
		if len(f) < 4 {
			return
		}
		gid, err := strconv.Atoi(f[2])
		if err != nil || slices.Contains(id.Groups, gid) {
			return
		}
		if slices.Contains(strings.Split(f[3], ","), id.Name) {
			id.Groups = append(id.Groups, gid)
		}
	})
	return id, nil
}

// lookupUser is fsRoot.lookupUser with the config's Home given to a user
// whose passwd entry names no home (and "/" when the config has none).
func (s *Server) lookupUser(spec, group string) (*identity, error) {
	id, err := s.root.lookupUser(spec, group)
	if err == nil && id.Home == "" {
		id.Home = s.cfg.Home
		if id.Home == "" {
			id.Home = "/"
		}
	}
	return id, err
}

// findUser finds spec in passwd contents.
func findUser(passwd []byte, spec string) (*identity, error) {
	uid, numErr := strconv.Atoi(spec)
	numeric := numErr == nil
	if numeric && uid < 0 {
		return nil, newError(initproto.KindInvalid, "", "user %q is not a valid uid", spec)
	}
	var found *identity
	forEachLine(passwd, func(f []string) {
		if found != nil || len(f) < 7 {
			return
		}
		u, err1 := strconv.Atoi(f[2])
		g, err2 := strconv.Atoi(f[3])
		if err1 != nil || err2 != nil {
			return
		}
		if (numeric && u == uid) || (!numeric && f[0] == spec) {
			found = &identity{Name: f[0], UID: u, GID: g, Home: f[5], Shell: f[6]}
		}
	})
	switch {
	case found != nil:
		return found, nil
	case numeric:
		return &identity{Name: spec, UID: uid, GID: uid}, nil
	case spec == "root":
		return &identity{Name: "root", Home: "/root"}, nil
	}
	return nil, newError(initproto.KindInvalid, "", "user %q does not exist in the jail", spec)
}

// findGroup resolves a group name or numeric gid from group contents.
func findGroup(groups []byte, spec string) (int, error) {
	if gid, err := strconv.Atoi(spec); err == nil {
		if gid < 0 {
			return 0, newError(initproto.KindInvalid, "", "group %q is not a valid gid", spec)
		}
		return gid, nil
	}
	gid := -1
	forEachLine(groups, func(f []string) {
		if gid < 0 && len(f) >= 3 && f[0] == spec {
			if g, err := strconv.Atoi(f[2]); err == nil {
				gid = g
			}
		}
	})
	if gid < 0 {
		return 0, newError(initproto.KindInvalid, "", "group %q does not exist in the jail", spec)
	}
	return gid, nil
}

// forEachLine calls fn with the colon-separated fields of every
// non-comment line of an account file.
func forEachLine(data []byte, fn func([]string)) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fn(strings.Split(line, ":"))
	}
}
