package initd

import (
	"bytes"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

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
//
// Every exec resolves its user: the answer for one version of the two
// files (see fileStamp) is remembered, and the files are read and parsed
// again only when either changed.
func (r *fsRoot) lookupUser(spec, group string) (*identity, error) {
	if spec == "" {
		return nil, newError(initproto.KindInvalid, "", "user is empty")
	}
	// Most lookups hit the cache: stamping the files needs no open for
	// reading. A miss opens them and stamps the versions it reads.
	key := identityKey{spec, group}
	if id, ok := r.users.get(r.stampAccountFile("/etc/passwd"), r.stampAccountFile("/etc/group"), key); ok {
		return id, nil
	}
	pf, pstamp := r.openAccountFile("/etc/passwd")
	if pf != nil {
		defer pf.Close()
	}
	gf, gstamp := r.openAccountFile("/etc/group")
	if gf != nil {
		defer gf.Close()
	}
	passwd, groups := readAccountFile(pf), readAccountFile(gf)
	id, err := resolveUser(passwd, groups, spec, group)
	if err != nil {
		return nil, err
	}
	r.users.put(pstamp, gstamp, key, id)
	return id, nil
}

// resolveUser is lookupUser on the contents of the two files.
func resolveUser(passwd, groups []byte, spec, group string) (*identity, error) {
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

// fileStamp identifies one version of a file: writing to it, replacing
// it or changing its attributes changes the stamp (the change time moves
// with every change, and the kernel gives it a finer grain once it has
// been read). The zero stamp is a file that is missing or not a regular
// file.
type fileStamp struct {
	dev, ino     uint64
	size         int64
	mtime, ctime unix.Timespec
}

// openAccountFile opens the jail's account file p for reading and stamps
// it; a missing or unusable file is (nil, the zero stamp), read as empty.
func (r *fsRoot) openAccountFile(p string) (*os.File, fileStamp) {
	fd, err := r.open(p, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, fileStamp{}
	}
	stamp, ok := stampOf(fd)
	if !ok {
		unix.Close(fd)
		return nil, fileStamp{}
	}
	return os.NewFile(uintptr(fd), p), stamp
}

// stampAccountFile stamps the jail's account file p without opening it
// for reading (openAccountFile's stamp of the same version).
func (r *fsRoot) stampAccountFile(p string) fileStamp {
	fd, err := r.open(p, unix.O_PATH, 0)
	if err != nil {
		return fileStamp{}
	}
	defer unix.Close(fd)
	stamp, _ := stampOf(fd)
	return stamp
}

// stampOf stamps the regular file open at fd; false when it is not one
// (the zero stamp).
func stampOf(fd int) (fileStamp, bool) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fileStamp{}, false
	}
	return fileStamp{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}, true
}

// readAccountFile reads an account file opened by openAccountFile (nil:
// empty), up to maxAccountFile bytes.
func readAccountFile(f *os.File) []byte {
	if f == nil {
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(f, maxAccountFile))
	return b
}

// identityKey is a lookup: the user and group asked for.
type identityKey struct{ user, group string }

// identityCache remembers resolved users for one version of the account
// files.
type identityCache struct {
	mu            sync.Mutex
	passwd, group fileStamp
	ids           map[identityKey]identity
}

// maxCachedIdentities bounds the cache (lookups of many distinct users
// start it over).
const maxCachedIdentities = 64

// get returns a copy of the identity remembered for key, when the files
// are still the versions it was resolved from.
func (c *identityCache) get(passwd, group fileStamp, key identityKey) (*identity, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.passwd != passwd || c.group != group {
		return nil, false
	}
	id, ok := c.ids[key]
	if !ok {
		return nil, false
	}
	id.Groups = slices.Clone(id.Groups)
	return &id, true
}

// put remembers id for key, resolved from the given versions of the files.
func (c *identityCache) put(passwd, group fileStamp, key identityKey, id *identity) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.passwd != passwd || c.group != group || len(c.ids) >= maxCachedIdentities {
		c.passwd, c.group, c.ids = passwd, group, nil
	}
	if c.ids == nil {
		c.ids = make(map[identityKey]identity)
	}
	v := *id
	v.Groups = slices.Clone(id.Groups)
	c.ids[key] = v
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
