// Package rootfs provides the lower trees of jail root filesystems.
//
// The `host` provider is a small tree of the jail's own (DATA_DIR/rootfs/host)
// over which the host's /usr is bind-mounted read-only: the merged-/usr
// symlinks, an empty usr/ mount point, a minimal /etc of the jail's own plus
// an allowlist of non-secret host /etc files, and the empty directories a
// system expects. Nothing of the host's /root, /home, credentials or the data
// dir is copied. The `dir` provider uses a directory tree the caller names,
// checked by CheckDir.
package rootfs

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/atomicfile"
	"github.com/agentjail/agentjail/internal/errdefs"
)

// recipeVersion changes whenever the layout built by EnsureHost changes.
const recipeVersion = 1

// Mount is a host directory bind-mounted into a jail.
type Mount struct {
	Source   string // host path
	Target   string // path inside the jail
	ReadOnly bool
}

// HostMounts are the bind mounts a host-provider jail needs on top of the
// tree of EnsureHost: the host's /usr, to be mounted read-only, nosuid and
// nodev.
func HostMounts() []Mount {
	return []Mount{{Source: "/usr", Target: "/usr", ReadOnly: true}}
}

// hostEtc are the host /etc entries (relative to /etc, globs allowed)
// copied into the tree when present. Only world-readable files are copied;
// symlinks are copied as symlinks (they resolve inside the jail).
var hostEtc = []string{
	"ld.so.cache", "ld.so.conf", "ld.so.conf.d",
	"alternatives",
	"ssl/certs", "ssl/openssl.cnf", "ca-certificates.conf",
	"localtime", "timezone", "os-release", "debian_version",
	"profile", "profile.d", "bash.bashrc", "inputrc",
	"mime.types", "protocols", "services", "gitconfig",
	"python3*", "magic", "magic.mime",
}

// usrLinks are the top-level directories a merged-/usr host links into /usr.
var usrLinks = []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"}

// requiredUsrLinks must be links into /usr on the host.
var requiredUsrLinks = map[string]bool{"bin": true, "sbin": true, "lib": true}

// jailUser is the unprivileged user of every jail.
const jailUser = 1000

// dirs are the empty directories of the tree, with their modes and owners.
var dirs = []struct {
	path     string
	mode     fs.FileMode
	uid, gid int
}{
	{"usr", 0o755, 0, 0},
	{"etc", 0o755, 0, 0},
	{"root", 0o700, 0, 0},
	{"home", 0o755, 0, 0},
	{"home/agent", 0o750, jailUser, jailUser},
	{"workspace", 0o755, jailUser, jailUser},
	{"tmp", fs.ModeSticky | 0o777, 0, 0},
	{"var", 0o755, 0, 0},
	{"var/tmp", fs.ModeSticky | 0o777, 0, 0},
	{"var/lib", 0o755, 0, 0},
	{"var/cache", 0o755, 0, 0},
	{"var/log", 0o755, 0, 0},
	{"run", 0o755, 0, 0},
	{"proc", 0o555, 0, 0},
	{"sys", 0o555, 0, 0},
	{"dev", 0o755, 0, 0},
	{"mnt", 0o755, 0, 0},
	{"opt", 0o755, 0, 0},
	{"srv", 0o755, 0, 0},
	{".agentjail", 0o755, 0, 0},
	{".agentjail/run", 0o700, 0, 0},
}

// etcFiles are the /etc files of the jail's own.
var etcFiles = map[string]struct {
	mode fs.FileMode
	data string
}{
	"passwd": {0o644, "root:x:0:0:root:/root:/bin/bash\n" +
		"agent:x:1000:1000:agent:/home/agent:/bin/bash\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"},
	"group": {0o644, "root:x:0:\ntty:x:5:\nagent:x:1000:\nnogroup:x:65534:\n"},
	// Locked entries: no account has a password.
	"shadow":   {0o640, "root:*:0:0:99999:7:::\nagent:*:0:0:99999:7:::\nnobody:*:0:0:99999:7:::\n"},
	"hosts":    {0o644, "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"},
	"hostname": {0o644, "agentjail\n"},
	"nsswitch.conf": {0o644, "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n" +
		"networks: files\nprotocols: files\nservices: files\nethers: files\nrpc: files\n"},
	"resolv.conf": {0o644, ""},
}

// hostMu serialises EnsureHost within the process; a lock file serialises
// it across processes.
var hostMu sync.Mutex

// EnsureHost builds, once, the lower tree of the `host` provider at
// dataDir/rootfs/host and returns its path. The tree is built in a temporary
// directory and renamed into place; it is rebuilt (and swapped in
// atomically) when its recipe changes: the recipe version of this package or
// the host files it copies (so that e.g. ld.so.cache follows host upgrades).
// A replaced tree is moved to dataDir/rootfs/.retired/, not deleted, since
// running jails may still use it as their lower layer. errdefs.ErrUnavailable
// if the host is not a merged-/usr system.
func EnsureHost(dataDir string) (string, error) {
	if !filepath.IsAbs(dataDir) {
		return "", errdefs.Invalidf("rootfs: data dir %q is not absolute", dataDir)
	}
	root := filepath.Join(filepath.Clean(dataDir), "rootfs")
	dst := filepath.Join(root, "host")
	hostMu.Lock()
	defer hostMu.Unlock()
	if err := os.MkdirAll(root, 0o700); err != nil {
		return "", fmt.Errorf("rootfs: %w", err)
	}
	unlock, err := lockFile(filepath.Join(root, ".lock"))
	if err != nil {
		return "", err
	}
	defer unlock()

	key, err := recipeKey()
	if err != nil {
		return "", err
	}
	recipeFile := filepath.Join(root, "host.recipe")
	if have, err := os.ReadFile(recipeFile); err == nil && string(have) == key {
		if st, err := os.Stat(dst); err == nil && st.IsDir() {
			return dst, nil
		}
	}

	tmp, err := os.MkdirTemp(root, ".host-")
	if err != nil {
		return "", fmt.Errorf("rootfs: %w", err)
	}
	keep := false
	defer func() {
		if !keep {
			os.RemoveAll(tmp)
		}
	}()
	if err := buildHost(tmp); err != nil {
		return "", err
	}
	if _, err := os.Lstat(dst); err == nil {
		// Swap atomically, then retire the old tree (now at tmp).
		if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dst, unix.RENAME_EXCHANGE); err != nil {
			return "", fmt.Errorf("rootfs: replace %s: %w", dst, err)
		}
		keep = true
		retired := filepath.Join(root, ".retired")
		if err := os.MkdirAll(retired, 0o700); err != nil {
			return "", fmt.Errorf("rootfs: %w", err)
		}
		if err := os.Rename(tmp, filepath.Join(retired, "host-"+strconv.FormatInt(time.Now().UnixNano(), 10))); err != nil {
			return "", fmt.Errorf("rootfs: retire the old host tree: %w", err)
		}
	} else {
		if err := os.Rename(tmp, dst); err != nil {
			return "", fmt.Errorf("rootfs: %w", err)
		}
		keep = true
	}
	if err := atomicfile.WriteFile(recipeFile, []byte(key), 0o600); err != nil {
		return "", fmt.Errorf("rootfs: %w", err)
	}
	return dst, nil
}

// lockFile takes an exclusive flock on path and returns its release.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("rootfs: lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("rootfs: lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

// recipeKey digests what the host tree is built from: the recipe version,
// the host's /usr links and the metadata of the host entries copied (for a
// directory its own metadata, which changes when entries are added, removed
// or replaced, as package tools do). It costs a few dozen lstat calls, so
// EnsureHost can run on every jail create.
func recipeKey() (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "recipe %d\n", recipeVersion)
	for _, name := range usrLinks {
		t, _ := os.Readlink("/" + name)
		fmt.Fprintf(h, "link %s %s\n", name, t)
	}
	srcs, err := hostEtcSources()
	if err != nil {
		return "", err
	}
	for _, src := range srcs {
		fi, err := os.Lstat(src)
		if err != nil {
			continue // vanished: the build skips it too
		}
		t, _ := os.Readlink(src)
		fmt.Fprintf(h, "%s %o %d %d %s\n", src, fi.Mode(), fi.Size(), fi.ModTime().UnixNano(), t)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// hostEtcSources expands hostEtc to the host paths present, sorted.
func hostEtcSources() ([]string, error) {
	var out []string
	for _, pat := range hostEtc {
		m, err := filepath.Glob(filepath.Join("/etc", pat))
		if err != nil {
			return nil, fmt.Errorf("rootfs: pattern %q: %w", pat, err)
		}
		out = append(out, m...)
	}
	sort.Strings(out)
	return out, nil
}

// buildHost fills the empty directory dir with the host tree.
func buildHost(dir string) error {
	if err := os.Chmod(dir, 0o755); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	for _, name := range usrLinks {
		t, err := os.Readlink("/" + name)
		switch {
		case err == nil && (t == "usr/"+name || t == "/usr/"+name):
			if err := os.Symlink("usr/"+name, filepath.Join(dir, name)); err != nil {
				return fmt.Errorf("rootfs: %w", err)
			}
		case requiredUsrLinks[name]:
			return errdefs.Unavailablef("rootfs: the host provider needs a merged-/usr host, but /%s is not a link to usr/%s", name, name)
		}
	}
	for _, d := range dirs {
		p := filepath.Join(dir, d.path)
		if err := os.Mkdir(p, d.mode.Perm()); err != nil {
			return fmt.Errorf("rootfs: %w", err)
		}
		if err := os.Chmod(p, d.mode.Perm()|modeBits(d.mode)); err != nil {
			return fmt.Errorf("rootfs: %w", err)
		}
		if err := os.Lchown(p, d.uid, d.gid); err != nil {
			return fmt.Errorf("rootfs: %w", err)
		}
	}
	// The mount point of the agentjail binary.
	if err := os.WriteFile(filepath.Join(dir, ".agentjail", "agentjail"), nil, 0o755); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	if err := os.Symlink("../proc/self/mounts", filepath.Join(dir, "etc", "mtab")); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	for name, f := range etcFiles {
		p := filepath.Join(dir, "etc", name)
		if err := os.WriteFile(p, []byte(f.data), f.mode); err != nil {
			return fmt.Errorf("rootfs: %w", err)
		}
		if err := os.Chmod(p, f.mode); err != nil {
			return fmt.Errorf("rootfs: %w", err)
		}
	}
	srcs, err := hostEtcSources()
	if err != nil {
		return err
	}
	for _, src := range srcs {
		rel, err := filepath.Rel("/etc", src)
		if err != nil {
			return fmt.Errorf("rootfs: %w", err)
		}
		dst := filepath.Join(dir, "etc", rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fmt.Errorf("rootfs: %w", err)
		}
		if err := copyTree(src, dst); err != nil {
			return err
		}
	}
	return nil
}

// modeBits converts the sticky/setgid bits of m to os.Chmod's form.
func modeBits(m fs.FileMode) fs.FileMode {
	return m & (fs.ModeSticky | fs.ModeSetgid)
}

// copyTree copies src to dst: directories and world-readable regular files
// with their permission bits (never setuid/setgid), symlinks as symlinks.
// Entries that are not world-readable, and other file types, are skipped.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
				return nil
			}
			return fmt.Errorf("rootfs: copy %s: %w", p, err)
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return fmt.Errorf("rootfs: %w", err)
		}
		out := filepath.Join(dst, rel)
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		perm := fi.Mode().Perm()
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return fmt.Errorf("rootfs: copy %s: %w", p, err)
			}
			if err := os.Symlink(t, out); err != nil {
				return fmt.Errorf("rootfs: %w", err)
			}
		case fi.IsDir():
			if perm&0o005 != 0o005 {
				return filepath.SkipDir
			}
			if err := os.Mkdir(out, perm); err != nil {
				return fmt.Errorf("rootfs: %w", err)
			}
			if err := os.Chmod(out, perm); err != nil {
				return fmt.Errorf("rootfs: %w", err)
			}
		case fi.Mode().IsRegular():
			if perm&0o004 == 0 {
				return nil
			}
			if err := copyFile(p, out, perm); err != nil {
				return err
			}
		}
		return nil
	})
}

// copyFile copies the regular file src to the new file dst with mode perm.
func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("rootfs: copy %s: %w", src, err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("rootfs: copy %s: %w", src, err)
	}
	if err := out.Chmod(perm); err != nil {
		out.Close()
		return fmt.Errorf("rootfs: %w", err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("rootfs: copy %s: %w", src, err)
	}
	return nil
}

// CheckDir validates the tree of a `dir` provider: dir must be absolute
// (errdefs.ErrInvalid), exist and be a directory (errdefs.ErrUnprocessable),
// and must be neither "/" nor inside dataDir nor an ancestor of it
// (errdefs.ErrForbidden: the jail would see the daemon's data). Symlinks are
// resolved before comparing.
func CheckDir(dir, dataDir string) error {
	if !filepath.IsAbs(dir) {
		return errdefs.Invalidf("rootfs dir %q: not an absolute path", dir)
	}
	real, err := filepath.EvalSymlinks(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return errdefs.Unprocessablef("rootfs dir %q: does not exist", dir)
	}
	if err != nil {
		return errdefs.Wrap(errdefs.ErrUnprocessable, err, "rootfs dir %q", dir)
	}
	st, err := os.Stat(real)
	if err != nil {
		return errdefs.Wrap(errdefs.ErrUnprocessable, err, "rootfs dir %q", dir)
	}
	if !st.IsDir() {
		return errdefs.Unprocessablef("rootfs dir %q: not a directory", dir)
	}
	if real == "/" {
		return errdefs.Forbiddenf("rootfs dir %q: the host's root cannot be a jail's root", dir)
	}
	data := filepath.Clean(dataDir)
	if r, err := filepath.EvalSymlinks(data); err == nil {
		data = r
	}
	if within(real, data) || within(data, real) {
		return errdefs.Forbiddenf("rootfs dir %q: overlaps the data dir %s", dir, dataDir)
	}
	return nil
}

// within reports whether the clean path p is dir or lies below it.
func within(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}
