// Package accounts reads the user and group databases of a root filesystem
// (/etc/passwd and /etc/group) with github.com/moby/sys/user. That parser
// reads an id it cannot parse, or a missing one, as 0: root. So lines whose
// ids are not numbers are passed over first, and a malformed entry never
// names root.
package accounts

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/moby/sys/user"
)

// maxLine bounds a line of an account file (a group's member list may be
// long).
const maxLine = 1 << 20

// Users returns the entries of the passwd data r for which filter (nil:
// all) returns true, in file order. Comments, and lines without a numeric
// uid and gid, are passed over.
func Users(r io.Reader, filter func(user.User) bool) ([]user.User, error) {
	clean, err := wellFormed(r, 2, 3)
	if err != nil {
		return nil, err
	}
	return user.ParsePasswdFilter(clean, filter)
}

// Groups returns the entries of the group data r for which filter (nil:
// all) returns true, in file order. Comments, and lines without a numeric
// gid, are passed over.
func Groups(r io.Reader, filter func(user.Group) bool) ([]user.Group, error) {
	clean, err := wellFormed(r, 2)
	if err != nil {
		return nil, err
	}
	return user.ParseGroupFilter(clean, filter)
}

// Find returns the first entry of the passwd file of the root filesystem
// at root whose name, or uid in decimal, is spec; false when the file or
// the entry is missing or the file cannot be read.
func Find(root, spec string) (user.User, bool) {
	f, err := os.Open(filepath.Join(root, "etc", "passwd"))
	if err != nil {
		return user.User{}, false
	}
	defer f.Close()
	users, err := Users(f, func(u user.User) bool {
		return u.Name == spec || strconv.Itoa(u.Uid) == spec
	})
	if err != nil || len(users) == 0 {
		return user.User{}, false
	}
	return users[0], true
}

// wellFormed returns the lines of r that are not comments and whose
// colon-separated fields at ids are decimal numbers.
func wellFormed(r io.Reader, ids ...int) (io.Reader, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, maxLine)
	var out bytes.Buffer
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		fields := bytes.Split(line, []byte(":"))
		ok := true
		for _, i := range ids {
			if i >= len(fields) {
				ok = false
				break
			}
			if n, err := strconv.Atoi(string(fields[i])); err != nil || n < 0 {
				ok = false
				break
			}
		}
		if ok {
			out.Write(line)
			out.WriteByte('\n')
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return &out, nil
}
