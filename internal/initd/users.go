package initd

import (
	"bytes"
	"slices"
	"strconv"

	"github.com/moby/sys/user"

	"github.com/agentjail/agentjail/internal/accounts"
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
	member, err := accounts.Groups(bytes.NewReader(groups), func(g user.Group) bool {
		return slices.Contains(g.List, id.Name)
	})
	if err != nil {
		return nil, newError(initproto.KindInvalid, "", "the jail's /etc/group: %v", err)
	}
	for _, g := range member {
		if !slices.Contains(id.Groups, g.Gid) {
			id.Groups = append(id.Groups, g.Gid)
		}
	}
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
	users, err := accounts.Users(bytes.NewReader(passwd), func(u user.User) bool {
		return (numeric && u.Uid == uid) || (!numeric && u.Name == spec)
	})
	if err != nil {
		return nil, newError(initproto.KindInvalid, "", "the jail's /etc/passwd: %v", err)
	}
	var found *identity
	if len(users) > 0 {
		u := users[0]
		found = &identity{Name: u.Name, UID: u.Uid, GID: u.Gid, Home: u.Home, Shell: u.Shell}
	}
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
	found, err := accounts.Groups(bytes.NewReader(groups), func(g user.Group) bool { return g.Name == spec })
	if err != nil {
		return 0, newError(initproto.KindInvalid, "", "the jail's /etc/group: %v", err)
	}
	if len(found) == 0 {
		return 0, newError(initproto.KindInvalid, "", "group %q does not exist in the jail", spec)
	}
	return found[0].Gid, nil
}
