package e2b

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentjail/agentjail/internal/apikey"
	"github.com/agentjail/agentjail/internal/atomicfile"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
)

// Volumes: the SDK's Volume. A volume is a directory of the daemon's
// (DATA_DIR/e2b/volumes/ID/data), mounted read-write into the sandboxes
// that name it (volumeMounts) and served by the volume content API
// (/volumecontent/ID/..., authorized by the volume's token). The daemon
// reaches into it only through an os.Root, so a symbolic link a sandbox
// leaves there never leads the daemon out of it.

// Limits of volumes.
const (
	// maxVolumeWrite bounds one file written through the content API.
	maxVolumeWrite = 4 << 30
	// maxVolumeList bounds the entries of one listing.
	maxVolumeList = 10000
	// maxVolumeDepth bounds a listing's depth.
	maxVolumeDepth = 16
)

var volumeNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// volumeRecord is a volume as kept in DATA_DIR/e2b/volumes/{id}.json.
type volumeRecord struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Tenant    string    `json:"tenant"`
	KeyID     string    `json:"key_id"`
	Token     string    `json:"token"`
	CreatedAt time.Time `json:"created_at"`
}

// volumeMount is a volume mounted in a sandbox.
type volumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// volumes holds the volumes.
type volumes struct {
	dir  string
	mu   sync.Mutex
	byID map[string]*volumeRecord
}

func openVolumes(dataDir string) (*volumes, error) {
	v := &volumes{dir: filepath.Join(dataDir, "e2b", "volumes"), byID: map[string]*volumeRecord{}}
	if err := os.MkdirAll(v.dir, 0o700); err != nil {
		return nil, fmt.Errorf("e2b: %w", err)
	}
	ents, err := os.ReadDir(v.dir)
	if err != nil {
		return nil, fmt.Errorf("e2b: %w", err)
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(v.dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("e2b: %w", err)
		}
		var r volumeRecord
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, fmt.Errorf("e2b: %s: %w", e.Name(), err)
		}
		v.byID[r.ID] = &r
	}
	return v, nil
}

// dataDir is where volume id's files are.
func (v *volumes) dataDir(id string) string { return filepath.Join(v.dir, id, "data") }

// find is the volume ref (an id or a name) c may use: ErrNotFound if none.
func (v *volumes) find(c caller, ref string) (*volumeRecord, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if r, ok := v.byID[ref]; ok && (c.key.Role == apikey.RoleAdmin || r.Tenant == c.key.Tenant) {
		return r, nil
	}
	for _, r := range v.byID {
		if r.Name == ref && r.Tenant == c.key.Tenant {
			return r, nil
		}
	}
	return nil, errdefs.NotFoundf("volume %q not found", ref)
}

func volumeJSON(r *volumeRecord, token bool) map[string]any {
	out := map[string]any{"volumeID": r.ID, "name": r.Name}
	if token {
		out["token"] = r.Token
	}
	return out
}

// postVolume makes a volume; a name is its tenant's once.
func (s *Service) postVolume(c caller, w http.ResponseWriter, r *http.Request) error {
	var b struct {
		Name string `json:"name"`
	}
	if err := decode(r, &b); err != nil {
		return err
	}
	if !volumeNameRE.MatchString(b.Name) {
		return errdefs.Invalidf("name: %q is not a volume name (letters, digits, '.', '_', '-', at most 63)", b.Name)
	}
	v := s.volumes
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, o := range v.byID {
		if o.Name == b.Name && o.Tenant == c.key.Tenant {
			return errdefs.Conflictf("volume %q already exists", b.Name)
		}
	}
	rec := &volumeRecord{ID: newSandboxID(), Name: b.Name, Tenant: c.key.Tenant, KeyID: c.key.ID, Token: newToken(), CreatedAt: time.Now().UTC()}
	// The root is open to every user of the sandboxes that mount it.
	if err := os.MkdirAll(v.dataDir(rec.ID), 0o700); err != nil {
		return err
	}
	if err := os.Chmod(v.dataDir(rec.ID), 0o777); err != nil {
		return err
	}
	data, _ := json.MarshalIndent(rec, "", "  ")
	if err := atomicfile.WriteFile(filepath.Join(v.dir, rec.ID+".json"), data, 0o600); err != nil {
		os.RemoveAll(filepath.Join(v.dir, rec.ID))
		return err
	}
	v.byID[rec.ID] = rec
	writeJSON(w, http.StatusCreated, volumeJSON(rec, true))
	return nil
}

func (s *Service) listVolumes(c caller, w http.ResponseWriter, r *http.Request) error {
	v := s.volumes
	v.mu.Lock()
	var recs []*volumeRecord
	for _, rec := range v.byID {
		if c.key.Role == apikey.RoleAdmin || rec.Tenant == c.key.Tenant {
			recs = append(recs, rec)
		}
	}
	v.mu.Unlock()
	slices.SortFunc(recs, func(a, b *volumeRecord) int { return a.CreatedAt.Compare(b.CreatedAt) })
	out := []map[string]any{}
	for _, rec := range recs {
		out = append(out, volumeJSON(rec, false))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Service) getVolume(c caller, w http.ResponseWriter, r *http.Request) error {
	rec, err := s.volumes.find(c, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, volumeJSON(rec, true))
	return nil
}

// deleteVolume removes a volume and its files; a volume a sandbox mounts
// is a conflict.
func (s *Service) deleteVolume(c caller, w http.ResponseWriter, r *http.Request) error {
	rec, err := s.volumes.find(c, r.PathValue("id"))
	if err != nil {
		return err
	}
	s.mu.Lock()
	for _, sb := range s.sandboxes {
		sr := sb.snapshot()
		if sr.Tenant == rec.Tenant && slices.ContainsFunc(sr.Volumes, func(m volumeMount) bool { return m.Name == rec.Name }) {
			s.mu.Unlock()
			return errdefs.Conflictf("volume %s is mounted by sandbox %s", rec.Name, sr.ID)
		}
	}
	s.mu.Unlock()
	v := s.volumes
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := os.Remove(filepath.Join(v.dir, rec.ID+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	delete(v.byID, rec.ID)
	if err := os.RemoveAll(filepath.Join(v.dir, rec.ID)); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// volumeMounts checks a create's volumeMounts and returns the jail's
// mounts of them.
func (s *Service) volumeMounts(c caller, raw json.RawMessage) ([]volumeMount, []config.Mount, error) {
	if !given(raw) {
		return nil, nil, nil
	}
	var ms []volumeMount
	if err := json.Unmarshal(raw, &ms); err != nil {
		return nil, nil, errdefs.Invalidf("volumeMounts: %v", err)
	}
	var out []config.Mount
	seen := map[string]bool{}
	for _, m := range ms {
		if !path.IsAbs(m.Path) || path.Clean(m.Path) != m.Path || m.Path == "/" {
			return nil, nil, errdefs.Invalidf("volumeMounts: path %q must be a clean absolute path other than /", m.Path)
		}
		if seen[m.Path] {
			return nil, nil, errdefs.Invalidf("volumeMounts: path %q is given twice", m.Path)
		}
		seen[m.Path] = true
		rec, err := s.volumes.find(c, m.Name)
		if err != nil {
			return nil, nil, fmt.Errorf("volumeMounts: %w", err)
		}
		out = append(out, config.Mount{Source: s.volumes.dataDir(rec.ID), Target: m.Path})
	}
	return ms, out, nil
}

// volumeContent authorizes a content request (Authorization: Bearer
// TOKEN of the volume in the path) and opens the volume's root.
func (s *Service) volumeContent(h func(w http.ResponseWriter, r *http.Request, root *os.Root, p string) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		err := func() error {
			id := r.PathValue("id")
			tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			v := s.volumes
			v.mu.Lock()
			rec := v.byID[id]
			v.mu.Unlock()
			if rec == nil || tok == "" || subtle.ConstantTimeCompare([]byte(tok), []byte(rec.Token)) != 1 {
				return errdefs.New(errdefs.ErrUnauthorized, "volume %s: a missing or wrong token (Authorization: Bearer, from Volume.create or getInfo)", id)
			}
			p, err := volumePath(r.URL.Query().Get("path"))
			if err != nil {
				return err
			}
			root, err := os.OpenRoot(v.dataDir(id))
			if err != nil {
				return err
			}
			defer root.Close()
			return h(w, r, root, p)
		}()
		if err != nil {
			s.writeError(w, r, volumeError(err))
		}
	}
}

// volumePath is the root-relative form of a content request's path.
func volumePath(p string) (string, error) {
	if p == "" {
		return "", errdefs.Invalidf("path: required")
	}
	c := path.Clean("/" + p)
	if c == "/" {
		return ".", nil
	}
	return strings.TrimPrefix(c, "/"), nil
}

// volumeAbs is the volume path of root-relative p.
func volumeAbs(p string) string {
	if p == "." {
		return "/"
	}
	return "/" + p
}

// volumeError gives file system errors their kinds.
func volumeError(err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errdefs.Wrap(errdefs.ErrNotFound, err, "volume")
	case errors.Is(err, fs.ErrExist):
		return errdefs.Wrap(errdefs.ErrConflict, err, "volume")
	case errors.Is(err, fs.ErrPermission):
		return errdefs.Wrap(errdefs.ErrForbidden, err, "volume")
	case strings.Contains(err.Error(), "path escapes from parent"), errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTEMPTY):
		return errdefs.Wrap(errdefs.ErrInvalid, err, "volume")
	}
	return err
}

// entryJSON is a VolumeEntryStat.
func entryJSON(root *os.Root, p string, fi fs.FileInfo) map[string]any {
	typ := "unknown"
	switch {
	case fi.Mode().IsRegular():
		typ = "file"
	case fi.IsDir():
		typ = "directory"
	case fi.Mode()&fs.ModeSymlink != 0:
		typ = "symlink"
	}
	out := map[string]any{"name": fi.Name(), "path": volumeAbs(p), "size": fi.Size(), "type": typ,
		"mode": uint32(fi.Mode().Perm()), "mtime": fi.ModTime().UTC().Format(time.RFC3339Nano)}
	if p == "." {
		out["name"] = "/"
	}
	out["atime"], out["ctime"] = out["mtime"], out["mtime"]
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		out["uid"], out["gid"] = st.Uid, st.Gid
		out["atime"] = time.Unix(st.Atim.Unix()).UTC().Format(time.RFC3339Nano)
		out["ctime"] = time.Unix(st.Ctim.Unix()).UTC().Format(time.RFC3339Nano)
	}
	if typ == "symlink" {
		if t, err := root.Readlink(p); err == nil {
			out["target"] = t
		}
	}
	return out
}

// ownership applies the uid, gid and mode of a content request's query.
func ownership(root *os.Root, p string, q map[string][]string) error {
	get := func(k string, base int) (int64, bool, error) {
		v := ""
		if len(q[k]) > 0 {
			v = q[k][0]
		}
		if v == "" {
			return 0, false, nil
		}
		n, err := strconv.ParseInt(v, base, 64)
		if err != nil || n < 0 || n > 1<<32-1 {
			return 0, false, errdefs.Invalidf("%s: %q is not a number", k, v)
		}
		return n, true, nil
	}
	mode, hasMode, err := get("mode", 10)
	if err != nil {
		return err
	}
	uid, hasUID, err := get("uid", 10)
	if err != nil {
		return err
	}
	gid, hasGID, err := get("gid", 10)
	if err != nil {
		return err
	}
	if hasMode {
		if mode > 0o7777 {
			return errdefs.Invalidf("mode: %o is not a file mode", mode)
		}
		if err := root.Chmod(p, fs.FileMode(mode).Perm()|fileModeBits(mode)); err != nil {
			return err
		}
	}
	if hasUID || hasGID {
		u, g := -1, -1
		if hasUID {
			u = int(uid)
		}
		if hasGID {
			g = int(gid)
		}
		if err := root.Lchown(p, u, g); err != nil {
			return err
		}
	}
	return nil
}

// fileModeBits converts setuid, setgid and sticky bits.
func fileModeBits(m int64) fs.FileMode {
	var out fs.FileMode
	if m&0o4000 != 0 {
		out |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		out |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		out |= fs.ModeSticky
	}
	return out
}

func (s *Service) volumeList(w http.ResponseWriter, r *http.Request, root *os.Root, p string) error {
	depth := 1
	if v := r.URL.Query().Get("depth"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxVolumeDepth {
			return errdefs.Invalidf("depth: %q must be 1 to %d", v, maxVolumeDepth)
		}
		depth = n
	}
	fi, err := root.Lstat(p)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return errdefs.Invalidf("%s is not a directory", volumeAbs(p))
	}
	out := []map[string]any{}
	var walk func(dir string, d int) error
	walk = func(dir string, d int) error {
		f, err := root.Open(dir)
		if err != nil {
			return err
		}
		ents, err := f.ReadDir(maxVolumeList + 1)
		f.Close()
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		for _, e := range ents {
			if len(out) >= maxVolumeList {
				return errdefs.New(errdefs.ErrTooLarge, "the listing has more than %d entries", maxVolumeList)
			}
			child := path.Join(dir, e.Name())
			info, err := e.Info()
			if err != nil {
				continue
			}
			out = append(out, entryJSON(root, child, info))
			if e.IsDir() && d < depth {
				if err := walk(child, d+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(p, 1); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Service) volumeMkdir(w http.ResponseWriter, r *http.Request, root *os.Root, p string) error {
	var err error
	if r.URL.Query().Get("force") == "true" {
		err = root.MkdirAll(p, 0o777)
	} else {
		err = root.Mkdir(p, 0o777)
	}
	if err != nil {
		return err
	}
	if err := ownership(root, p, r.URL.Query()); err != nil {
		return err
	}
	fi, err := root.Lstat(p)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, entryJSON(root, p, fi))
	return nil
}

func (s *Service) volumeStat(w http.ResponseWriter, r *http.Request, root *os.Root, p string) error {
	fi, err := root.Lstat(p)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, entryJSON(root, p, fi))
	return nil
}

func (s *Service) volumePatch(w http.ResponseWriter, r *http.Request, root *os.Root, p string) error {
	var b struct {
		UID  *int64 `json:"uid"`
		GID  *int64 `json:"gid"`
		Mode *int64 `json:"mode"`
	}
	if err := decode(r, &b); err != nil {
		return err
	}
	q := map[string][]string{}
	for k, v := range map[string]*int64{"uid": b.UID, "gid": b.GID, "mode": b.Mode} {
		if v != nil {
			q[k] = []string{strconv.FormatInt(*v, 10)}
		}
	}
	if _, err := root.Lstat(p); err != nil {
		return err
	}
	if err := ownership(root, p, q); err != nil {
		return err
	}
	return s.volumeStat(w, r, root, p)
}

func (s *Service) volumeRemove(w http.ResponseWriter, r *http.Request, root *os.Root, p string) error {
	if p == "." {
		return errdefs.Invalidf("path: the volume's root cannot be removed")
	}
	if _, err := root.Lstat(p); err != nil {
		return err
	}
	if err := root.RemoveAll(p); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Service) volumeRead(w http.ResponseWriter, r *http.Request, root *os.Root, p string) error {
	f, err := root.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return errdefs.Invalidf("%s is not a file", volumeAbs(p))
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
	w.WriteHeader(http.StatusOK)
	_, _ = io.Copy(w, f)
	return nil
}

func (s *Service) volumeWrite(w http.ResponseWriter, r *http.Request, root *os.Root, p string) error {
	if p == "." {
		return errdefs.Invalidf("path: the volume's root is a directory")
	}
	if r.ContentLength > maxVolumeWrite {
		return errdefs.New(errdefs.ErrTooLarge, "a file of %d bytes, over %d", r.ContentLength, int64(maxVolumeWrite))
	}
	if dir := path.Dir(p); dir != "." && r.URL.Query().Get("force") != "false" {
		if err := root.MkdirAll(dir, 0o777); err != nil {
			return err
		}
	}
	f, err := root.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o666)
	if err != nil {
		return err
	}
	n, err := io.Copy(f, io.LimitReader(r.Body, maxVolumeWrite+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return errdefs.Wrap(errdefs.ErrInvalid, err, "writing %s", volumeAbs(p))
	}
	if n > maxVolumeWrite {
		_ = root.Remove(p)
		return errdefs.New(errdefs.ErrTooLarge, "a file over %d bytes", int64(maxVolumeWrite))
	}
	if err := ownership(root, p, r.URL.Query()); err != nil {
		return err
	}
	fi, err := root.Lstat(p)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, entryJSON(root, p, fi))
	return nil
}
