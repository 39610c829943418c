package agent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"
	"syscall"
)

// Keys holds the model API keys (and any other secret a credential
// names) in the daemon: from the daemon's environment, and from a secrets
// file of KEY=VALUE lines that must be a regular file of mode 0600 (or
// stricter) owned by the daemon's user. The file is re-read when it
// changes. Keys never leave the daemon but in the headers its proxy adds.
type Keys struct {
	file    string
	environ func(string) (string, bool)

	mu     sync.Mutex
	seen   string // the file's size, mode, owner and times when last read
	values map[string]string
	err    error
}

// NewKeys returns a key store reading env (os.LookupEnv when nil) and file
// ("" for none; a missing file is no error).
func NewKeys(file string, env func(string) (string, bool)) *Keys {
	if env == nil {
		env = os.LookupEnv
	}
	return &Keys{file: file, environ: env}
}

// Lookup returns the secret called name: the secrets file's value, else
// the daemon's environment variable.
func (k *Keys) Lookup(name string) (string, bool) {
	if v, ok := k.fromFile(name); ok {
		return v, true
	}
	v, ok := k.environ(name)
	if ok && v != "" {
		return v, true
	}
	return "", false
}

// Check reports what is wrong with the secrets file (nil when it is fine
// or absent).
func (k *Keys) Check() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.reload()
	return k.err
}

func (k *Keys) fromFile(name string) (string, bool) {
	if k.file == "" {
		return "", false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.reload()
	v, ok := k.values[name]
	return v, ok
}

// reload re-reads the file when its size or time changed. k.mu is held.
func (k *Keys) reload() {
	if k.file == "" {
		return
	}
	st, err := os.Stat(k.file)
	if errors.Is(err, fs.ErrNotExist) {
		k.values, k.err, k.seen = nil, nil, ""
		return
	}
	if err != nil {
		k.values, k.err = nil, err
		return
	}
	seen := fmt.Sprintf("%d %v %d", st.Size(), st.Mode(), st.ModTime().UnixNano())
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		seen += fmt.Sprintf(" %d %d %d.%d", sys.Ino, sys.Uid, sys.Ctim.Sec, sys.Ctim.Nsec)
	}
	if seen == k.seen {
		return
	}
	k.seen = seen
	k.values, k.err = nil, nil
	if !st.Mode().IsRegular() {
		k.err = fmt.Errorf("secrets file %s is not a regular file", k.file)
		return
	}
	if st.Mode().Perm()&0o077 != 0 {
		k.err = fmt.Errorf("secrets file %s has mode %04o; it must be 0600 (chmod 600 %s): its keys are ignored", k.file, st.Mode().Perm(), k.file)
		return
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Geteuid() {
		k.err = fmt.Errorf("secrets file %s belongs to uid %d, not the daemon's user: its keys are ignored", k.file, sys.Uid)
		return
	}
	data, err := os.ReadFile(k.file)
	if err != nil {
		k.err = err
		return
	}
	values := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, val, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		key = strings.TrimSpace(key)
		if !ok || key == "" {
			k.err = fmt.Errorf("secrets file %s line %d: want KEY=VALUE", k.file, n)
			return
		}
		val = strings.TrimSpace(val)
		if len(val) >= 2 && (val[0] == '"' || val[0] == '\'') && val[len(val)-1] == val[0] {
			val = val[1 : len(val)-1]
		}
		values[key] = val
	}
	k.values = values
}
