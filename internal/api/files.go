package api

import (
	"errors"
	"io"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/model"
)

// DirListing is the body of GET /jails/{id}/files/{path} on a directory.
type DirListing = model.DirListing

// Headers of a file download.
const (
	// HeaderMode carries the file's permission bits in octal ("0644").
	HeaderMode = "X-Agentjail-Mode"
	// HeaderMtime carries the file's modification time (RFC 3339, nanoseconds).
	HeaderMtime = "X-Agentjail-Mtime"
)

// jailPath returns the absolute, clean jail path of a files route: the
// {path...} wildcard with a leading slash.
func jailPath(r *http.Request) (string, error) {
	p := r.PathValue("path")
	if p == "" {
		return "", errdefs.Invalidf("path: empty; name a path in the jail after /files/ (without its leading slash)")
	}
	if strings.ContainsRune(p, 0) {
		return "", errdefs.Invalidf("path: contains a NUL byte")
	}
	return path.Clean("/" + p), nil
}

// query returns r's query parameters, refusing any not in allowed and any
// given more than once.
func query(r *http.Request, allowed ...string) (url.Values, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, errdefs.Invalidf("query: %v", err)
	}
	for k, vs := range q {
		if !slices.Contains(allowed, k) {
			return nil, errdefs.Invalidf("query parameter %q: unknown (allowed: %s)", k, strings.Join(allowed, ", "))
		}
		if len(vs) > 1 {
			return nil, errdefs.Invalidf("query parameter %q: given %d times", k, len(vs))
		}
	}
	return q, nil
}

// boolParam parses an optional boolean query parameter.
func boolParam(q url.Values, name string) (bool, error) {
	v := q.Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errdefs.Invalidf("query parameter %s: %q is not true or false", name, v)
	}
	return b, nil
}

func (s *server) getFile(w http.ResponseWriter, r *http.Request) error {
	p, err := jailPath(r)
	if err != nil {
		return err
	}
	q, err := query(r, "stat", "access", "user")
	if err != nil {
		return err
	}
	stat, err := boolParam(q, "stat")
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	ctx := r.Context()
	if q.Has("access") {
		if stat {
			return errdefs.Invalidf("query: stat and access are exclusive")
		}
		mode := q.Get("access")
		if mode != "read" && mode != "write" {
			return errdefs.Invalidf("query parameter access: %q (expected read or write)", mode)
		}
		res, err := s.svc.Access(ctx, id, p, mode, q.Get("user"))
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, res)
		return nil
	}
	if q.Has("user") {
		return errdefs.Invalidf("query parameter user: only meaningful with access")
	}
	info, err := s.svc.Stat(ctx, id, p)
	if err != nil {
		return err
	}
	if stat {
		writeJSON(w, http.StatusOK, info)
		return nil
	}
	if info.Type == "dir" {
		l, err := s.svc.ReadDir(ctx, id, p)
		if err != nil {
			return err
		}
		if l.Entries == nil {
			l.Entries = []model.FileInfo{}
		}
		writeJSON(w, http.StatusOK, l)
		return nil
	}
	info, rc, err := s.svc.ReadFile(ctx, id, p)
	if err != nil {
		return err
	}
	defer rc.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set(HeaderMode, info.Mode)
	h.Set(HeaderMtime, info.ModTime.UTC().Format(time.RFC3339Nano))
	if info.Type == "file" && info.Size >= 0 {
		h.Set("Content-Length", strconv.FormatInt(info.Size, 10))
	}
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil && ctx.Err() == nil {
		// The status is out; all that is left is to cut the body short,
		// which the client sees as a truncated response.
		s.log.Warn("file download interrupted", "path", r.URL.EscapedPath(), "err", err)
	}
	return nil
}

// uploadReader limits an upload to MaxUpload bytes and remembers whether
// the limit was hit, whatever the Service makes of the read error.
type uploadReader struct {
	r       io.Reader
	tooBig  bool
	readErr error
}

func (u *uploadReader) Read(p []byte) (int, error) {
	n, err := u.r.Read(p)
	if err != nil && err != io.EOF {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			u.tooBig = true
		}
		u.readErr = err
	}
	return n, err
}

func (s *server) putFile(w http.ResponseWriter, r *http.Request) error {
	p, err := jailPath(r)
	if err != nil {
		return err
	}
	q, err := query(r, "mode", "user", "type", "target")
	if err != nil {
		return err
	}
	opts := model.WriteOptions{User: q.Get("user")}
	if m := q.Get("mode"); m != "" {
		v, err := strconv.ParseUint(m, 8, 32)
		if err != nil || v > 0o7777 {
			return errdefs.Invalidf("query parameter mode: %q is not octal permission bits (0000-7777)", m)
		}
		opts.Mode = uint32(v)
	}
	id := r.PathValue("id")
	var info *model.FileInfo
	if q.Has("target") && q.Get("type") != "symlink" {
		return errdefs.Invalidf("query parameter target: only with type=symlink")
	}
	switch t := q.Get("type"); t {
	case "symlink":
		target := q.Get("target")
		switch {
		case r.ContentLength > 0:
			return errdefs.Invalidf("request body: must be empty with type=symlink")
		case opts.Mode != 0:
			return errdefs.Invalidf("query parameter mode: a symbolic link has no mode of its own")
		case !initproto.ValidLinkTarget(target):
			return errdefs.Invalidf("query parameter target: the link's target, 1 to %d bytes without NUL, is required with type=symlink", initproto.MaxLinkTarget)
		}
		info, err = s.svc.Symlink(r.Context(), id, p, target, opts)
	case "dir":
		if r.ContentLength > 0 {
			return errdefs.Invalidf("request body: must be empty with type=dir")
		}
		info, err = s.svc.Mkdir(r.Context(), id, p, opts)
	case "", "file":
		if r.ContentLength > MaxUpload {
			return errdefs.New(errdefs.ErrTooLarge, "upload: %d bytes is over the limit of %d bytes", r.ContentLength, MaxUpload)
		}
		body := &uploadReader{r: http.MaxBytesReader(w, r.Body, MaxUpload)}
		info, err = s.svc.WriteFile(r.Context(), id, p, body, opts)
		switch {
		case body.tooBig:
			return errdefs.New(errdefs.ErrTooLarge, "upload: over the limit of %d bytes", MaxUpload)
		case err != nil && body.readErr != nil && HTTPStatus(err) == http.StatusInternalServerError:
			// The upload broke off; that is the client's doing, not ours.
			return errdefs.Wrap(errdefs.ErrInvalid, body.readErr, "upload: reading the request body")
		}
	default:
		return errdefs.Invalidf("query parameter type: %q (expected file, dir or symlink)", t)
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, info)
	return nil
}

func (s *server) deleteFile(w http.ResponseWriter, r *http.Request) error {
	p, err := jailPath(r)
	if err != nil {
		return err
	}
	q, err := query(r, "recursive")
	if err != nil {
		return err
	}
	rec, err := boolParam(q, "recursive")
	if err != nil {
		return err
	}
	if err := s.svc.Remove(r.Context(), r.PathValue("id"), p, rec); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
