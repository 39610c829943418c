package e2b

import (
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/agentjail/agentjail/internal/e2b/envd/filesystem/filesystemconnect"
	"github.com/agentjail/agentjail/internal/e2b/envd/process/processconnect"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
)

// envdPort is the port the SDK names for the sandbox plane itself.
const envdPort = "49983"

// maxUpload bounds one uploaded file.
const maxUpload = 1 << 30

// maxRPCMessage bounds one RPC message (stdin input comes in them).
const maxRPCMessage = 16 << 20

type ctxKey struct{}

// sandboxFrom returns the sandbox a sandbox-plane request was routed to.
func sandboxFrom(ctx context.Context) *sandbox {
	sb, _ := ctx.Value(ctxKey{}).(*sandbox)
	return sb
}

// envdHandler is the sandbox plane: routing by E2b-Sandbox-Id, the access
// token, and the services.
func (s *Service) envdHandler() http.Handler {
	mux := http.NewServeMux()
	opts := []connect.HandlerOption{connect.WithCompressMinBytes(1024), connect.WithReadMaxBytes(maxRPCMessage)}
	mux.Handle(processconnect.NewProcessHandler(&processService{s: s}, opts...))
	mux.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{s: s}, opts...))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("GET /metrics", s.envdMetrics)
	mux.HandleFunc("GET /files", s.envdFiles)
	mux.HandleFunc("POST /files", s.envdFiles)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeAPIError(w, http.StatusNotImplemented, "agentjail's sandbox plane does not support "+r.Method+" "+r.URL.Path+" (see docs/e2b.md)")
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("E2b-Sandbox-Id")
		sb := s.runningSandbox(w, r, id)
		if sb == nil {
			return
		}
		if p := r.Header.Get("E2b-Sandbox-Port"); p != "" && p != envdPort {
			s.forwardPort(w, r, sb, p)
			return
		}
		files := r.URL.Path == "/files"
		public := (r.URL.Path == "/health" && r.Method == http.MethodGet) || files
		if !public && !tokenOK(r.Header.Get("X-Access-Token"), sb) {
			writeAPIError(w, http.StatusUnauthorized, "missing or invalid X-Access-Token for sandbox "+id)
			return
		}
		mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, sb)))
	})
}

// forwardPort serves a request for port p of sandbox sb (what E2B's edge
// does for E2b-Sandbox-Port): it needs the sandbox's access token, which,
// like the routing headers, does not reach the jail.
func (s *Service) forwardPort(w http.ResponseWriter, r *http.Request, sb *sandbox, p string) {
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 {
		writeAPIError(w, http.StatusBadRequest, "E2b-Sandbox-Port: "+strconv.Quote(p)+" is not a port (1-65535)")
		return
	}
	if !tokenOK(r.Header.Get("X-Access-Token"), sb) {
		writeAPIError(w, http.StatusUnauthorized, "missing or invalid X-Access-Token for sandbox "+sb.snapshot().ID)
		return
	}
	s.toPort(w, r, sb, port)
}

// toPort serves an authorized request from port of sandbox sb. The
// credentials and routing headers are removed; the Host header is the
// sandbox's maskRequestHost, if it has one.
func (s *Service) toPort(w http.ResponseWriter, r *http.Request, sb *sandbox, port int) {
	if s.opts.Ports == nil {
		writeAPIError(w, http.StatusNotImplemented, "this daemon does not forward sandbox ports (port "+strconv.Itoa(port)+")")
		return
	}
	rec := sb.snapshot()
	j, err := s.jails.Get(r.Context(), rec.JailID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := r.Clone(r.Context())
	for _, h := range []string{"X-Access-Token", "E2b-Sandbox-Id", "E2b-Sandbox-Port", trafficTokenHeader} {
		out.Header.Del(h)
	}
	if h := rec.Network.requestHost(port); h != "" {
		out.Host = h
	}
	s.opts.Ports.Forward(w, out, j, port)
}

// runningSandbox returns the running sandbox id for request r, resuming
// it first when it is paused and was created with autoResume; else it
// answers 502 as E2B's edge does and returns nil.
func (s *Service) runningSandbox(w http.ResponseWriter, r *http.Request, id string) *sandbox {
	sb := s.sandboxByID(id)
	if sb != nil {
		rec := sb.snapshot()
		if rec.State == statePaused && rec.AutoResume {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), opTimeout)
			err := s.resume(ctx, sb, rec.resumeTimeout())
			cancel()
			if err != nil {
				s.log.Error("resuming an e2b sandbox on a request", "sandbox", id, "err", err)
				s.writeError(w, r, err)
				return nil
			}
			s.log.Info("e2b sandbox resumed by a request", "sandbox", id)
		}
	}
	if sb == nil || sb.snapshot().State != stateRunning {
		writeJSON(w, http.StatusBadGateway, map[string]any{"message": "The sandbox was not found", "sandboxId": id, "code": http.StatusBadGateway})
		return nil
	}
	return sb
}

func tokenOK(tok string, sb *sandbox) bool {
	want := sb.snapshot().Token
	return tok != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(want)) == 1
}

// envdMetrics serves GET /metrics of envd: the sandbox's resource use.
func (s *Service) envdMetrics(w http.ResponseWriter, r *http.Request) {
	sb := sandboxFrom(r.Context())
	m, err := s.metrics(r.Context(), sb)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"ts": time.Now().Unix(), "cpu_count": m["cpuCount"], "cpu_used_pct": m["cpuUsedPct"],
		"mem_total": m["memTotal"], "mem_used": m["memUsed"], "disk_used": m["diskUsed"], "disk_total": m["diskTotal"],
	})
}

// signature is the SDK's signature of a presigned /files URL.
func signature(p, op, user, token string, expiration int64) string {
	s := p + ":" + op + ":" + user + ":" + token
	if expiration != 0 {
		s += ":" + strconv.FormatInt(expiration, 10)
	}
	sum := sha256.Sum256([]byte(s))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// filesAuth finds the sandbox of a /files request and checks its
// credentials: the access token, or a signature of the request (the
// presigned URLs the SDK builds carry no sandbox id: every running
// sandbox's token is tried).
func (s *Service) filesAuth(r *http.Request) (*sandbox, error) {
	q := r.URL.Query()
	sb := sandboxFrom(r.Context())
	if tok := r.Header.Get("X-Access-Token"); tok != "" {
		if sb != nil && tokenOK(tok, sb) {
			return sb, nil
		}
		return nil, errdefs.New(errdefs.ErrUnauthorized, "invalid X-Access-Token")
	}
	sig := q.Get("signature")
	if sig == "" {
		return nil, errdefs.New(errdefs.ErrUnauthorized, "missing X-Access-Token or signature")
	}
	var exp int64
	if e := q.Get("signature_expiration"); e != "" {
		n, err := strconv.ParseInt(e, 10, 64)
		if err != nil {
			return nil, errdefs.New(errdefs.ErrUnauthorized, "signature_expiration: %q is not a unix time", e)
		}
		if time.Now().Unix() > n {
			return nil, errdefs.New(errdefs.ErrUnauthorized, "the signature expired")
		}
		exp = n
	}
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	candidates := []*sandbox{sb}
	if sb == nil {
		s.mu.Lock()
		candidates = candidates[:0]
		for _, x := range s.sandboxes {
			candidates = append(candidates, x)
		}
		s.mu.Unlock()
	}
	for _, c := range candidates {
		rec := c.snapshot()
		if rec.State != stateRunning {
			continue
		}
		want := signature(q.Get("path"), op, q.Get("username"), rec.Token, exp)
		if subtle.ConstantTimeCompare([]byte(sig), []byte(want)) == 1 {
			return c, nil
		}
	}
	return nil, errdefs.New(errdefs.ErrUnauthorized, "invalid signature")
}

// envdFiles serves GET and POST /files (also at the root, for presigned
// URLs).
func (s *Service) envdFiles(w http.ResponseWriter, r *http.Request) {
	sb, err := s.filesAuth(r)
	if err == nil {
		if r.Method == http.MethodGet {
			err = s.download(w, r, sb)
		} else if r.Method == http.MethodPost {
			err = s.upload(w, r, sb)
		} else {
			err = errdefs.New(errdefs.ErrInvalid, "%s is not allowed on /files", r.Method)
		}
	}
	if err != nil {
		s.writeFilesError(w, r, err)
	}
}

// writeFilesError answers a /files error with envd's statuses (404
// FileNotFoundError, 400 InvalidArgumentError, 507 NotEnoughSpaceError).
func (s *Service) writeFilesError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, errdefs.ErrTooLarge) && strings.Contains(err.Error(), "no space") {
		writeAPIError(w, http.StatusInsufficientStorage, err.Error())
		return
	}
	if errors.Is(err, errdefs.ErrUnprocessable) {
		writeAPIError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.writeError(w, r, err)
}

func (s *Service) download(w http.ResponseWriter, r *http.Request, sb *sandbox) error {
	q := r.URL.Query()
	rec := sb.snapshot()
	p, err := s.resolvePath(r.Context(), sb, q.Get("path"), q.Get("username"))
	if err != nil {
		return err
	}
	fi, rc, err := s.jails.ReadFile(r.Context(), rec.JailID, p)
	if err != nil {
		return err
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": fi.Name}))
	var out io.Writer = w
	if acceptsGzip(r) && fi.Size > 1024 {
		w.Header().Set("Content-Encoding", "gzip")
		gz := gzip.NewWriter(w)
		defer gz.Close()
		out = gz
	} else {
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size, 10))
	}
	w.WriteHeader(http.StatusOK)
	_, _ = io.Copy(out, rc)
	return nil
}

func acceptsGzip(r *http.Request) bool {
	for _, e := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		if strings.TrimSpace(strings.SplitN(e, ";", 2)[0]) == "gzip" {
			return true
		}
	}
	return false
}

// entryInfoJSON is one written file in the answer of POST /files.
type entryInfoJSON struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

func (s *Service) upload(w http.ResponseWriter, r *http.Request, sb *sandbox) error {
	q := r.URL.Query()
	user := q.Get("username")
	var body io.Reader = http.MaxBytesReader(w, r.Body, maxUpload)
	if r.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(body)
		if err != nil {
			return errdefs.Invalidf("gzip body: %v", err)
		}
		defer gz.Close()
		body = io.LimitReader(gz, maxUpload)
	}
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []entryInfoJSON
	write := func(target string, data io.Reader) error {
		p, err := s.resolvePath(r.Context(), sb, target, user)
		if err != nil {
			return err
		}
		fi, err := s.jails.WriteFile(r.Context(), sb.snapshot().JailID, p, data, model.WriteOptions{User: user})
		if err != nil {
			return err
		}
		out = append(out, entryInfoJSON{Path: fi.Path, Name: fi.Name, Type: "file"})
		return nil
	}
	if mt == "multipart/form-data" {
		mr := multipart.NewReader(body, params["boundary"])
		for {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return errdefs.Invalidf("multipart body: %v", err)
			}
			if part.FormName() != "file" {
				continue
			}
			target := q.Get("path")
			if target == "" {
				// Go's FileName drops directories; the SDK sends the full
				// target path as the file name.
				_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
				target = dp["filename"]
			}
			if target == "" {
				return errdefs.Invalidf("a file part names no path (neither ?path= nor a filename)")
			}
			if err := write(target, part); err != nil {
				return err
			}
		}
	} else {
		if q.Get("path") == "" {
			return errdefs.Invalidf("path: required for an %s upload", mt)
		}
		if err := write(q.Get("path"), body); err != nil {
			return err
		}
	}
	if len(out) == 0 {
		return errdefs.Invalidf("the upload holds no file")
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// resolvePath makes p absolute for user: a relative path or "~" is taken
// from the user's home directory.
func (s *Service) resolvePath(ctx context.Context, sb *sandbox, p, user string) (string, error) {
	if p == "" {
		return "", errdefs.Invalidf("path: required")
	}
	if strings.HasPrefix(p, "/") {
		return path.Clean(p), nil
	}
	home, err := s.home(ctx, sb, user)
	if err != nil {
		return "", err
	}
	if p == "~" {
		return home, nil
	}
	p = strings.TrimPrefix(p, "~/")
	return path.Join(home, p), nil
}

// home is user's home directory in the sandbox (the default user's for
// ""), asked of the jail once per jail and user.
func (s *Service) home(ctx context.Context, sb *sandbox, user string) (string, error) {
	jail := sb.snapshot().JailID
	sb.mu.Lock()
	h, ok := sb.homes[jail+"\x00"+user]
	sb.mu.Unlock()
	if ok {
		return h, nil
	}
	res, err := s.jails.Exec(ctx, jail, model.ExecRequest{Cmd: []string{"/bin/sh", "-c", `printf %s "$HOME"`}, User: user, Cwd: "/", TimeoutMs: 10000}, nil)
	if err != nil {
		if errors.Is(err, errdefs.ErrInvalid) {
			return "", errdefs.Wrap(errdefs.ErrUnauthorized, err, "user %q", user)
		}
		return "", err
	}
	if res.ExitCode != 0 || !strings.HasPrefix(res.Stdout, "/") {
		return "", fmt.Errorf("home directory of %q: %q (exit %d)", user, res.Stdout, res.ExitCode)
	}
	sb.mu.Lock()
	if len(sb.homes) < maxHomes {
		sb.homes[jail+"\x00"+user] = res.Stdout
	}
	sb.mu.Unlock()
	return res.Stdout, nil
}

// maxHomes bounds the home directories a sandbox remembers.
const maxHomes = 64

// basicUser is the user named by a request's Basic authorization (the
// SDK sends "Basic base64(user:)"), or "".
func basicUser(h http.Header) string {
	a := h.Get("Authorization")
	v, ok := strings.CutPrefix(a, "Basic ")
	if !ok {
		return ""
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(v))
	if err != nil {
		return ""
	}
	u, _, _ := strings.Cut(string(b), ":")
	return u
}
