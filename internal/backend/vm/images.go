package vm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cavaliergopher/cpio"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/errdefs"
)

// images makes, once per content, the read-only images machines boot
// from: the initramfs (the daemon's binary as PID 1 and the guest kernel's
// modules) and erofs images of directory trees (a jail's lower tree, the
// host's /usr). They are kept in dir under names derived from what they
// hold, shared by every jail and daemon of the host, and rebuilt when
// their source changes.
type images struct {
	dir   string
	mkfs  string
	mu    sync.Mutex
	locks map[string]*sync.Mutex
	// sums are file digests by path, size and modification time.
	sums map[string]string
}

// lock serialises the building of image name within the daemon, and
// every build across the host's daemons (one lock file for all).
func (im *images) lock(name string) func() {
	im.mu.Lock()
	l, ok := im.locks[name]
	if !ok {
		l = new(sync.Mutex)
		im.locks[name] = l
	}
	im.mu.Unlock()
	l.Lock()
	f, err := os.OpenFile(filepath.Join(im.dir, "build.lock"), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err == nil {
		if unix.Flock(int(f.Fd()), unix.LOCK_EX) != nil {
			f.Close()
			f = nil
		}
	}
	return func() {
		if f != nil {
			f.Close()
		}
		l.Unlock()
	}
}

// use returns path when it exists, marking it used now (prune keeps what
// was used lately).
func use(path string) bool {
	now := time.Now()
	return os.Chtimes(path, now, now) == nil
}

// initramfs returns the initramfs holding binary as /agentjail and the
// modules of kernelDir (modules/order lists them in load order).
func (im *images) initramfs(binary, kernelDir string) (string, error) {
	// Named after what it holds: every daemon of one binary shares it.
	h := sha256.New()
	for _, f := range []string{binary, filepath.Join(kernelDir, "VERSION"), filepath.Join(kernelDir, "modules", "order")} {
		if err := im.hashFile(h, f); err != nil {
			return "", fmt.Errorf("guest initramfs: %w", err)
		}
	}
	name := "initramfs-" + hex.EncodeToString(h.Sum(nil))[:16] + ".cpio"
	path := filepath.Join(im.dir, name)
	if use(path) {
		return path, nil
	}
	defer im.lock(name)()
	if use(path) {
		return path, nil
	}
	order, err := os.ReadFile(filepath.Join(kernelDir, "modules", "order"))
	if err != nil {
		return "", fmt.Errorf("guest initramfs: %w", err)
	}
	tmp, err := os.CreateTemp(im.dir, name+".*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	w := cpio.NewWriter(tmp)
	for _, d := range []string{"dev", "proc", "sys", "mnt", "tmp", "lib", "lib/modules"} {
		if err := w.WriteHeader(&cpio.Header{Name: d, Mode: cpio.TypeDir | 0o755}); err != nil {
			return "", err
		}
	}
	files := [][2]string{{binary, "agentjail"}, {filepath.Join(kernelDir, "modules", "order"), "lib/modules/order"}}
	for _, m := range strings.Fields(string(order)) {
		files = append(files, [2]string{filepath.Join(kernelDir, "modules", m), "lib/modules/" + m})
	}
	for _, f := range files {
		if err := addFile(w, f[0], f[1]); err != nil {
			return "", fmt.Errorf("guest initramfs: %w", err)
		}
	}
	if err := w.Close(); err != nil {
		return "", err
	}
	if err := tmp.Sync(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", err
	}
	im.prune("initramfs-", name)
	return path, nil
}

// hashFile adds the content of file f to h; a file's digest is kept
// while its size and modification time stay (the daemon's binary is
// hashed once).
func (im *images) hashFile(h io.Writer, f string) error {
	st, err := os.Stat(f)
	if err != nil {
		return err
	}
	key := fmt.Sprintf("%s %d %d", f, st.Size(), st.ModTime().UnixNano())
	im.mu.Lock()
	sum, ok := im.sums[key]
	im.mu.Unlock()
	if !ok {
		r, err := os.Open(f)
		if err != nil {
			return err
		}
		d := sha256.New()
		_, err = io.Copy(d, r)
		r.Close()
		if err != nil {
			return err
		}
		sum = string(d.Sum(nil))
		im.mu.Lock()
		im.sums[key] = sum
		im.mu.Unlock()
	}
	_, err = io.WriteString(h, sum)
	return err
}

func addFile(w *cpio.Writer, src, name string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if err := w.WriteHeader(&cpio.Header{Name: name, Mode: cpio.TypeReg | 0o755, Size: st.Size()}); err != nil {
		return err
	}
	_, err = io.Copy(w, f)
	return err
}

// treeKey identifies the content of the tree at root cheaply: every
// entry's path, mode and owner, and every non-directory's size and
// modification time (package managers and builders replace files, which
// changes these; a directory's own times change only with its entries,
// which are in the key themselves). Python's bytecode caches
// (__pycache__) are left out: any python3 the host's root runs may write
// them, and a guest checks each one against its source anyway, so a stale
// one in an image is only not used.
func treeKey(root string) (string, error) {
	h := sha256.New()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "__pycache__" {
			return fs.SkipDir
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if d.IsDir() {
			fmt.Fprintf(h, "%s\x00%o %d %d\n", p, st.Mode, st.Uid, st.Gid)
			return nil
		}
		fmt.Fprintf(h, "%s\x00%o %d %d %d %d.%d\n", p, st.Mode, st.Uid, st.Gid, st.Size, st.Mtim.Sec, st.Mtim.Nsec)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("read %s: %w", root, err)
	}
	return hex.EncodeToString(h.Sum(nil))[:24], nil
}

// erofs returns an erofs image of the tree at root, named after kind,
// root and the tree's key,
// building it when the tree changed since the last one (which is then
// removed: machines that have it open keep reading it).
func (im *images) erofs(ctx context.Context, kind, root string) (string, error) {
	key, err := treeKey(root)
	if err != nil {
		return "", err
	}
	src := sha256.Sum256([]byte(root))
	prefix := kind + "-" + hex.EncodeToString(src[:4]) + "-"
	name := prefix + key + ".erofs"
	path := filepath.Join(im.dir, name)
	if use(path) {
		return path, nil
	}
	defer im.lock(name)()
	if use(path) {
		return path, nil
	}
	tmp := path + ".tmp"
	os.Remove(tmp)
	out, err := exec.CommandContext(ctx, im.mkfs, "--quiet", "--preserve-mtime", tmp, root).CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		if bytes.Contains(bytes.ToLower(out), []byte(unix.ENOSPC.Error())) {
			return "", errdefs.Wrap(errdefs.ErrNoSpace, err, "build the erofs image of %s in %s: the disk is full: %s", root, im.dir, lastLine(out))
		}
		return "", fmt.Errorf("build the erofs image of %s: %w: %s", root, err, lastLine(out))
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return "", err
	}
	im.prune(prefix, name)
	return path, nil
}

// pruneAfter is how long an image no machine started from is kept: other
// daemons of the host (another version of the binary, another /usr) and
// snapshots of machines started from it may still need it.
const pruneAfter = 24 * time.Hour

// prune removes the images named prefix* other than keep that were not
// used for pruneAfter (earlier versions of the same source).
func (im *images) prune(prefix, keep string) {
	ents, _ := os.ReadDir(im.dir)
	for _, e := range ents {
		n := e.Name()
		if !strings.HasPrefix(n, prefix) || n == keep || strings.HasSuffix(n, ".tmp") {
			continue
		}
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > pruneAfter {
			os.Remove(filepath.Join(im.dir, n))
		}
	}
}

func lastLine(b []byte) string {
	s := strings.TrimSpace(string(b))
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}
