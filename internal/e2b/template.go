package e2b

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/agentjail/agentjail/internal/apikey"
	"github.com/agentjail/agentjail/internal/atomicfile"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
)

// Templates: the SDK's Template.build. A build runs in a jail of its base
// image (fromImage, or the image of another template), step by step (RUN,
// COPY of the files the SDK uploaded, ENV, WORKDIR, USER), and is
// committed as an image of the daemon's store with the steps' env, work
// dir and user in its config. A template with a start command is also a
// snapshot: the command is started in a jail of the new image, the ready
// command polled until it succeeds, and the jail snapshotted with its
// processes, so each sandbox of the template restores it running. A
// sandbox names a template by id or NAME[:TAG].

// Images is what template builds need of the image store (*jail.Manager
// implements it). Errors carry errdefs kinds.
type Images interface {
	// GetImage is the store's image ref names (ErrNotFound when none).
	GetImage(ctx context.Context, ref string) (*model.Image, error)
	// PullImage fetches ref into the store with auth (nil: the daemon's
	// docker config).
	PullImage(ctx context.Context, ref string, auth *model.RegistryAuth, progress func(model.PullProgress)) (*model.Image, error)
	// Commit writes a running jail's changes as a new image on top of its
	// own, tagged req.Ref, its config amended by req.Changes.
	Commit(ctx context.Context, jail string, req model.CommitRequest) (*model.Image, error)
	// RemoveImage untags ref (and removes the image once nothing uses it).
	RemoveImage(ctx context.Context, ref string, force bool) (model.ImageRemoval, error)
}

// Build states, as the SDK reads them.
const (
	buildWaiting  = "waiting"
	buildBuilding = "building"
	buildReady    = "ready"
	buildError    = "error"
)

// Limits of template builds.
const (
	// maxTemplateUpload bounds one COPY step's uploaded archive.
	maxTemplateUpload = 1 << 30
	// maxSteps bounds a build's steps.
	maxSteps = 512
	// maxBuildLog bounds the log entries kept of one build.
	maxBuildLog = 5000
	// maxLogLine bounds one log entry's message.
	maxLogLine = 4096
	// buildTimeout bounds a whole build.
	buildTimeout = 2 * time.Hour
	// readyTimeout bounds the wait for a start command's ready check.
	readyTimeout = 10 * time.Minute
	// waitingTimeout is how long a build asked for may wait for its start.
	waitingTimeout = time.Hour
	// maxBuilds is how many builds run at once; the rest wait.
	maxBuilds = 2
	// defaultTag is the tag a build gets when it names none.
	defaultTag = "default"
)

var (
	templateNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}(/[a-z0-9][a-z0-9._-]{0,62})?$`)
	templateTagRE  = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)
	filesHashRE    = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// templateRecord is a template as kept in DATA_DIR/e2b/templates/{id}.json.
type templateRecord struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Tenant    string    `json:"tenant"`
	KeyID     string    `json:"key_id"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// Tags name ready builds by their tag.
	Tags map[string]tagRecord `json:"tags,omitempty"`
	// Builds are the template's builds, oldest first.
	Builds []*buildRecord `json:"builds"`
}

// tagRecord is a tag's build.
type tagRecord struct {
	Build string    `json:"build"`
	At    time.Time `json:"at"`
}

// buildRecord is one build of a template.
type buildRecord struct {
	ID       string `json:"id"`
	Status   string `json:"status"`
	CPUCount int    `json:"cpu_count,omitempty"`
	MemoryMB int    `json:"memory_mb,omitempty"`
	// Tags go to the build when it is ready.
	Tags []string `json:"tags"`
	// UploadToken authorizes the uploads of the build's COPY files.
	UploadToken string `json:"upload_token"`
	// Image is the built image's tag; Snapshot, for a template with a
	// start command, the snapshot its sandboxes restore.
	Image    string `json:"image,omitempty"`
	Snapshot string `json:"snapshot,omitempty"`
	// StartCmd and ReadyCmd are the template's start and ready commands
	// (its snapshot runs the first): a sandbox that cannot restore the
	// snapshot (it mounts volumes) runs them in a jail of the image.
	StartCmd string `json:"start_cmd,omitempty"`
	ReadyCmd string `json:"ready_cmd,omitempty"`
	// Key identifies what the build made (its base image and
	// instructions); a later build of the template with the same key
	// reuses its image and snapshot.
	Key string `json:"key,omitempty"`
	// Jails are the jails the build made (for cleanup after a crash).
	Jails      []string     `json:"jails,omitempty"`
	Reason     *buildReason `json:"reason,omitempty"`
	Log        []logEntry   `json:"log,omitempty"`
	CreatedAt  time.Time    `json:"created_at"`
	UpdatedAt  time.Time    `json:"updated_at"`
	FinishedAt *time.Time   `json:"finished_at,omitempty"`
}

// buildReason says why a build failed, and at which step.
type buildReason struct {
	Message string `json:"message"`
	Step    string `json:"step,omitempty"`
}

// logEntry is one line of a build's log.
type logEntry struct {
	Time    time.Time `json:"timestamp"`
	Level   string    `json:"level"`
	Message string    `json:"message"`
	Step    string    `json:"step,omitempty"`
}

// templates holds the templates and runs their builds.
type templates struct {
	dir     string // records
	files   string // uploaded COPY archives, by template
	slots   chan struct{}
	mu      sync.Mutex
	byID    map[string]*templateRecord
	running map[string]*runningBuild // by build id
	// inUse counts the builds under way that use an uploaded archive.
	inUse map[string]int
	wg    sync.WaitGroup
}

// runningBuild is a build under way: cancel stops it, done is closed
// once it has cleaned up.
type runningBuild struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// openTemplates loads the template records of dataDir. Builds a crash
// interrupted are marked failed; their jails are returned for removal.
func openTemplates(dataDir string) (*templates, []string, error) {
	t := &templates{dir: filepath.Join(dataDir, "e2b", "templates"), files: filepath.Join(dataDir, "e2b", "template-files"),
		slots: make(chan struct{}, maxBuilds), byID: map[string]*templateRecord{}, running: map[string]*runningBuild{}, inUse: map[string]int{}}
	for _, d := range []string{t.dir, t.files} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, nil, fmt.Errorf("e2b: %w", err)
		}
	}
	ents, err := os.ReadDir(t.dir)
	if err != nil {
		return nil, nil, fmt.Errorf("e2b: %w", err)
	}
	var orphans []string
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(t.dir, e.Name()))
		if err != nil {
			return nil, nil, fmt.Errorf("e2b: %w", err)
		}
		var r templateRecord
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, nil, fmt.Errorf("e2b: %s: %w", e.Name(), err)
		}
		changed := false
		for _, b := range r.Builds {
			if b.Status == buildWaiting || b.Status == buildBuilding {
				b.Status, b.Reason = buildError, &buildReason{Message: "the daemon stopped during the build"}
				orphans = append(orphans, b.Jails...)
				changed = true
			}
		}
		t.byID[r.ID] = &r
		if changed {
			if err := t.save(&r); err != nil {
				return nil, nil, err
			}
		}
	}
	return t, orphans, nil
}

// save writes r; callers hold t.mu or own r exclusively.
func (t *templates) save(r *templateRecord) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(t.dir, r.ID+".json"), data, 0o600); err != nil {
		return fmt.Errorf("e2b: %w", err)
	}
	return nil
}

// filePath is where the archive of a COPY step is kept.
func (t *templates) filePath(tpl, hash string) string {
	return filepath.Join(t.files, tpl, hash)
}

// seesTemplate reports whether c may use r.
func (c caller) seesTemplate(r *templateRecord) bool {
	return c.key.Role == apikey.RoleAdmin || c.key.Tenant == r.Tenant
}

// lookup finds the template ref names for c: its id, or its name (the
// caller's own tenant's first). ErrNotFound when there is none.
func (t *templates) lookup(c caller, ref string) (*templateRecord, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lookupLocked(c, ref)
}

// lookupLocked is lookup for callers that hold t.mu.
func (t *templates) lookupLocked(c caller, ref string) (*templateRecord, error) {
	if r, ok := t.byID[ref]; ok && c.seesTemplate(r) {
		return r, nil
	}
	var found *templateRecord
	for _, r := range t.byID {
		if r.Name == ref && c.seesTemplate(r) && (found == nil || r.Tenant == c.key.Tenant) {
			found = r
		}
	}
	if found == nil {
		return nil, errdefs.NotFoundf("template %q not found", ref)
	}
	return found, nil
}

// splitTemplateRef splits NAME[:TAG].
func splitTemplateRef(ref string) (name, tag string) {
	name, tag, _ = strings.Cut(ref, ":")
	return name, tag
}

// resolve returns the build a sandbox of ref (an id or NAME, with an
// optional :TAG) starts from: the tag's, else the default tag's, else
// the newest ready build. (nil, nil) when ref names no template.
func (t *templates) resolve(c caller, ref string) (*buildRecord, error) {
	name, tag := splitTemplateRef(ref)
	r, err := t.lookup(c, name)
	if err != nil {
		return nil, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	want := tag
	if want == "" {
		want = defaultTag
	}
	if tr, ok := r.Tags[want]; ok {
		if b := r.build(tr.Build); b != nil && b.Status == buildReady {
			return b, nil
		}
	}
	if tag != "" {
		return nil, errdefs.NotFoundf("template %s has no tag %q", r.Name, tag)
	}
	for i := len(r.Builds) - 1; i >= 0; i-- {
		if r.Builds[i].Status == buildReady {
			return r.Builds[i], nil
		}
	}
	return nil, errdefs.Conflictf("template %s has no finished build yet", r.Name)
}

func (r *templateRecord) build(id string) *buildRecord {
	for _, b := range r.Builds {
		if b.ID == id {
			return b
		}
	}
	return nil
}

// requestBody is the body of POST /v3/templates.
type requestBody struct {
	Name          string   `json:"name"`
	Alias         string   `json:"alias"`
	Tags          []string `json:"tags"`
	CPUCount      int      `json:"cpuCount"`
	MemoryMB      int      `json:"memoryMB"`
	MinFreeDiskMB int      `json:"minFreeDiskMb"`
}

// postTemplate starts a build of a template (made on its first build):
// the SDK uploads the COPY steps' files, then starts the build.
func (s *Service) postTemplate(c caller, w http.ResponseWriter, r *http.Request) error {
	if s.opts.Images == nil {
		return errdefs.NotImplementedf("this daemon does not build templates")
	}
	var b requestBody
	if err := decode(r, &b); err != nil {
		return err
	}
	ref := b.Name
	if ref == "" {
		ref = b.Alias
	}
	name, tag := splitTemplateRef(ref)
	if !templateNameRE.MatchString(name) || name == defaultTemplate {
		return errdefs.Invalidf("name: %q is not a template name (lower-case letters, digits, '.', '_', '-', an optional namespace/, at most 63 characters; not %q), with an optional :TAG", ref, defaultTemplate)
	}
	tags := slices.Clone(b.Tags)
	if tag != "" {
		tags = append(tags, tag)
	}
	if len(tags) == 0 {
		tags = []string{defaultTag}
	}
	slices.Sort(tags)
	tags = slices.Compact(tags)
	for _, tg := range tags {
		if !templateTagRE.MatchString(tg) {
			return errdefs.Invalidf("tags: %q is not a tag (letters, digits, '.', '_', '-', at most 128)", tg)
		}
	}
	if b.CPUCount < 0 || b.MemoryMB < 0 || b.MinFreeDiskMB < 0 {
		return errdefs.Invalidf("cpuCount, memoryMB and minFreeDiskMb must not be negative")
	}
	t := s.templates
	now := time.Now().UTC()
	bld := &buildRecord{ID: uuid.NewString(), Status: buildWaiting, CPUCount: b.CPUCount, MemoryMB: b.MemoryMB, Tags: tags,
		UploadToken: newToken(), CreatedAt: now, UpdatedAt: now}
	t.mu.Lock()
	defer t.mu.Unlock()
	rec, err := t.lookupLocked(c, name)
	if err != nil || rec.Tenant != c.key.Tenant {
		rec = &templateRecord{ID: newSandboxID(), Name: name, Tenant: c.key.Tenant, KeyID: c.key.ID, CreatedAt: now}
	}
	// A build asked for and never started (its client went away) is over.
	for _, ob := range rec.Builds {
		if ob.Status == buildWaiting && t.running[ob.ID] == nil && now.Sub(ob.CreatedAt) > waitingTimeout {
			ob.Status, ob.Reason, ob.UpdatedAt = buildError, &buildReason{Message: "the build was never started"}, now
		}
	}
	prev := rec.Builds
	rec.Builds = append(rec.Builds, bld)
	rec.UpdatedAt = now
	if err := t.save(rec); err != nil {
		rec.Builds = prev
		return err
	}
	t.byID[rec.ID] = rec
	writeJSON(w, http.StatusAccepted, map[string]any{
		"templateID": rec.ID, "buildID": bld.ID, "tags": tags, "names": []string{rec.Name}, "aliases": []string{rec.Name}, "public": false,
	})
	return nil
}

// ownTemplate is the template id names, if c may change it.
func (s *Service) ownTemplate(c caller, id string) (*templateRecord, error) {
	if s.opts.Images == nil {
		return nil, errdefs.NotImplementedf("this daemon does not build templates")
	}
	r, err := s.templates.lookup(c, id)
	if err != nil || r.ID != id {
		return nil, errdefs.NotFoundf("template %q not found", id)
	}
	return r, nil
}

// waitingBuild is the build of template id that waits for its start.
func (s *Service) waitingBuild(c caller, id, build string) (*templateRecord, *buildRecord, error) {
	r, err := s.ownTemplate(c, id)
	if err != nil {
		return nil, nil, err
	}
	s.templates.mu.Lock()
	defer s.templates.mu.Unlock()
	b := r.build(build)
	if b == nil {
		return nil, nil, errdefs.NotFoundf("build %q of template %s not found", build, id)
	}
	if b.Status != buildWaiting || s.templates.running[b.ID] != nil {
		return nil, nil, errdefs.Conflictf("build %s of template %s has already started", build, id)
	}
	return r, b, nil
}

// getFileLink answers whether the archive of a COPY step is there, and
// where to upload it if not (a URL of this daemon, authorized by the
// newest waiting build's token).
func (s *Service) getFileLink(c caller, w http.ResponseWriter, r *http.Request) error {
	rec, err := s.ownTemplate(c, r.PathValue("id"))
	if err != nil {
		return err
	}
	hash := r.PathValue("hash")
	if !filesHashRE.MatchString(hash) {
		return errdefs.Invalidf("hash: %q is not a SHA-256 in hex", hash)
	}
	s.templates.mu.Lock()
	var token string
	for _, b := range rec.Builds {
		if b.Status == buildWaiting {
			token = b.UploadToken
		}
	}
	s.templates.mu.Unlock()
	if token == "" {
		return errdefs.Conflictf("template %s has no build waiting for its files", rec.ID)
	}
	out := map[string]any{"present": false}
	if p := s.templates.filePath(rec.ID, hash); os.Chtimes(p, time.Time{}, time.Now()) == nil {
		// Marked as asked for: kept for the build being prepared.
		out["present"] = true
	}
	// The URL is the daemon's as the caller reached it (through a proxy
	// or the cluster's gateway: the host it names).
	scheme, host := "http", r.Host
	if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
		scheme = "https"
	}
	if h := r.Header.Get("X-Forwarded-Host"); h != "" {
		host = h
	}
	out["url"] = scheme + "://" + host + s.opts.Prefix + "/templates/" + rec.ID + "/files/" + hash + "?token=" + token
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// putFile receives the archive of a COPY step (gzip'd tar or tar), sent
// by the SDK to the URL getFileLink gave, authorized by its token (HEAD
// only checks the token).
func (s *Service) putFile(w http.ResponseWriter, r *http.Request) {
	err := func() error {
		if s.opts.Images == nil {
			return errdefs.NotImplementedf("this daemon does not build templates")
		}
		id, hash, token := r.PathValue("id"), r.PathValue("hash"), r.URL.Query().Get("token")
		if !filesHashRE.MatchString(hash) {
			return errdefs.Invalidf("hash: %q is not a SHA-256 in hex", hash)
		}
		t := s.templates
		if !t.uploadAuthorized(id, token) {
			return errdefs.New(errdefs.ErrUnauthorized, "upload of template %s: no waiting build's token", id)
		}
		if r.Method == http.MethodHead {
			// A gateway asking which node holds the template.
			return nil
		}
		if r.ContentLength > maxTemplateUpload {
			return errdefs.New(errdefs.ErrTooLarge, "upload: %d bytes, over %d", r.ContentLength, maxTemplateUpload)
		}
		dst := t.filePath(id, hash)
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return err
		}
		f, err := os.CreateTemp(filepath.Dir(dst), ".upload-*")
		if err != nil {
			return err
		}
		defer os.Remove(f.Name())
		n, err := io.Copy(f, io.LimitReader(r.Body, maxTemplateUpload+1))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return errdefs.Wrap(errdefs.ErrInvalid, err, "upload")
		}
		if n > maxTemplateUpload {
			return errdefs.New(errdefs.ErrTooLarge, "upload: over %d bytes", maxTemplateUpload)
		}
		return os.Rename(f.Name(), dst)
	}()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// uploadAuthorized reports whether token is that of a waiting build of
// template id.
func (t *templates) uploadAuthorized(id, token string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	ok := false
	if rec := t.byID[id]; rec != nil && token != "" {
		for _, b := range rec.Builds {
			if b.Status == buildWaiting && subtle.ConstantTimeCompare([]byte(token), []byte(b.UploadToken)) == 1 {
				ok = true
			}
		}
	}
	return ok
}

// buildBody is the body of POST /v2/templates/{id}/builds/{build}.
type buildBody struct {
	FromImage         string          `json:"fromImage"`
	FromTemplate      string          `json:"fromTemplate"`
	FromImageRegistry *registryConfig `json:"fromImageRegistry"`
	StartCmd          string          `json:"startCmd"`
	ReadyCmd          string          `json:"readyCmd"`
	Force             bool            `json:"force"`
	Steps             []buildStep     `json:"steps"`
}

// registryConfig is the credentials of a build's base image: a user name
// and password ("registry", the SDK's fromImage with credentials), a GCP
// service account key ("gcp", fromGCPRegistry) or AWS keys ("aws",
// fromAWSRegistry). They are used for the pull and neither logged nor
// kept.
type registryConfig struct {
	Type               string `json:"type"`
	Username           string `json:"username"`
	Password           string `json:"password"`
	ServiceAccountJSON string `json:"serviceAccountJson"`
}

// auth is what the pull presents: a GCP key is the password of the user
// _json_key, as Google's registries take it.
func (rc *registryConfig) auth() (*model.RegistryAuth, error) {
	switch rc.Type {
	case "registry":
		if rc.Username == "" || rc.Password == "" {
			return nil, errdefs.Invalidf("fromImageRegistry: a username and a password are both required")
		}
		return &model.RegistryAuth{Username: rc.Username, Password: rc.Password}, nil
	case "gcp":
		if !json.Valid([]byte(rc.ServiceAccountJSON)) {
			return nil, errdefs.Invalidf("fromImageRegistry: serviceAccountJson is not a JSON service account key")
		}
		return &model.RegistryAuth{Username: "_json_key", Password: rc.ServiceAccountJSON}, nil
	case "aws":
		return nil, errdefs.NotImplementedf("fromImageRegistry: AWS keys (fromAWSRegistry) are not supported: give the registry's user name and password (fromImage with credentials; for ECR, the user AWS and a password from aws ecr get-login-password), or let the daemon pull with its docker config")
	default:
		return nil, errdefs.Invalidf("fromImageRegistry: unknown type %q (registry, gcp or aws)", rc.Type)
	}
}

// buildStep is one instruction of a build.
type buildStep struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash"`
	Force     bool     `json:"force"`
}

// postBuild checks a build's instructions and starts it.
func (s *Service) postBuild(c caller, w http.ResponseWriter, r *http.Request) error {
	rec, bld, err := s.waitingBuild(c, r.PathValue("id"), r.PathValue("build"))
	if err != nil {
		return err
	}
	spec, err := s.buildSpecOf(c, r, rec, bld)
	if err != nil {
		// The refused build is over: it does not stay waiting.
		s.finishBuild(buildSpec{template: rec.ID, build: bld.ID}, "", "", err)
		return err
	}
	t := s.templates
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), buildTimeout)
	rb := &runningBuild{cancel: cancel, done: make(chan struct{})}
	t.mu.Lock()
	if t.running[bld.ID] != nil {
		t.mu.Unlock()
		cancel()
		return errdefs.Conflictf("build %s has already started", bld.ID)
	}
	t.running[bld.ID] = rb
	files := spec.files(t)
	for _, f := range files {
		t.inUse[f]++
	}
	t.wg.Add(1)
	t.mu.Unlock()
	go func() {
		defer t.wg.Done()
		defer close(rb.done)
		defer cancel()
		s.runBuild(ctx, spec)
		t.mu.Lock()
		delete(t.running, bld.ID)
		for _, f := range files {
			if t.inUse[f]--; t.inUse[f] <= 0 {
				delete(t.inUse, f)
			}
		}
		t.mu.Unlock()
	}()
	w.WriteHeader(http.StatusAccepted)
	return nil
}

// buildSpecOf reads and checks the instructions of a build.
func (s *Service) buildSpecOf(c caller, r *http.Request, rec *templateRecord, bld *buildRecord) (buildSpec, error) {
	var b buildBody
	if err := decode(r, &b); err != nil {
		return buildSpec{}, err
	}
	if (b.FromImage == "") == (b.FromTemplate == "") {
		return buildSpec{}, errdefs.Invalidf("exactly one of fromImage and fromTemplate must be given")
	}
	var auth *model.RegistryAuth
	if b.FromImageRegistry != nil {
		if b.FromImage == "" {
			return buildSpec{}, errdefs.Invalidf("fromImageRegistry: credentials are for a base image (fromImage)")
		}
		var err error
		if auth, err = b.FromImageRegistry.auth(); err != nil {
			return buildSpec{}, err
		}
	}
	if len(b.Steps) > maxSteps {
		return buildSpec{}, errdefs.Invalidf("steps: %d, at most %d", len(b.Steps), maxSteps)
	}
	for i, st := range b.Steps {
		if err := s.checkStep(rec.ID, st); err != nil {
			return buildSpec{}, fmt.Errorf("steps[%d]: %w", i, err)
		}
	}
	spec := buildSpec{template: rec.ID, name: rec.Name, build: bld.ID, body: b, auth: auth, caller: c, cpu: bld.CPUCount, memoryMB: bld.MemoryMB}
	if b.FromTemplate != "" {
		base, err := s.templates.resolve(c, b.FromTemplate)
		if err != nil {
			return buildSpec{}, fmt.Errorf("fromTemplate: %w", err)
		}
		if base == nil {
			if b.FromTemplate == defaultTemplate {
				return buildSpec{}, errdefs.Invalidf("fromTemplate: %q is the daemon's default jail, not an image; build from an image (fromImage)", defaultTemplate)
			}
			return buildSpec{}, errdefs.NotFoundf("fromTemplate: template %q not found", b.FromTemplate)
		}
		spec.baseImage = base.Image
	}
	return spec, nil
}

// files are the uploaded archives the build's COPY steps use.
func (spec buildSpec) files(t *templates) []string {
	var out []string
	for _, st := range spec.body.Steps {
		if st.Type == "COPY" {
			out = append(out, t.filePath(spec.template, st.FilesHash))
		}
	}
	return out
}

// checkStep refuses a step the builder cannot run.
func (s *Service) checkStep(tpl string, st buildStep) error {
	switch st.Type {
	case "RUN":
		if len(st.Args) < 1 || len(st.Args) > 2 || st.Args[0] == "" {
			return errdefs.Invalidf("RUN takes a command and an optional user")
		}
	case "COPY":
		if len(st.Args) < 2 || len(st.Args) > 4 || st.Args[0] == "" || st.Args[1] == "" {
			return errdefs.Invalidf("COPY takes a source, a destination, an optional user and mode")
		}
		if len(st.Args) == 4 && st.Args[3] != "" {
			if _, err := parseMode(st.Args[3]); err != nil {
				return err
			}
		}
		if !filesHashRE.MatchString(st.FilesHash) {
			return errdefs.Invalidf("COPY %s: filesHash %q is not a SHA-256 in hex", st.Args[0], st.FilesHash)
		}
		if _, err := os.Stat(s.templates.filePath(tpl, st.FilesHash)); err != nil {
			return errdefs.Invalidf("COPY %s: its files (%s) were not uploaded", st.Args[0], st.FilesHash)
		}
	case "ENV":
		if len(st.Args) == 0 || len(st.Args)%2 != 0 {
			return errdefs.Invalidf("ENV takes name, value pairs")
		}
		for i := 0; i < len(st.Args); i += 2 {
			if n := st.Args[i]; n == "" || strings.ContainsAny(n, "= \t\n") {
				return errdefs.Invalidf("ENV: %q is not a variable name", n)
			}
		}
	case "WORKDIR", "USER":
		if len(st.Args) != 1 || st.Args[0] == "" {
			return errdefs.Invalidf("%s takes one argument", st.Type)
		}
	default:
		return errdefs.Invalidf("type %q is not a build step agentjail runs (RUN, COPY, ENV, WORKDIR, USER)", st.Type)
	}
	return nil
}

// getBuildStatus answers a build's status and its log from logsOffset.
func (s *Service) getBuildStatus(c caller, w http.ResponseWriter, r *http.Request) error {
	rec, err := s.templates.lookup(c, r.PathValue("id"))
	if err != nil || rec.ID != r.PathValue("id") {
		return errdefs.NotFoundf("template %q not found", r.PathValue("id"))
	}
	offset := 0
	if v := r.URL.Query().Get("logsOffset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return errdefs.Invalidf("logsOffset: %q is not a non-negative integer", v)
		}
		offset = n
	}
	s.templates.mu.Lock()
	defer s.templates.mu.Unlock()
	b := rec.build(r.PathValue("build"))
	if b == nil {
		return errdefs.NotFoundf("build %q of template %s not found", r.PathValue("build"), rec.ID)
	}
	entries := []map[string]any{}
	for _, e := range b.Log[min(offset, len(b.Log)):] {
		entries = append(entries, e.json())
	}
	out := map[string]any{"buildID": b.ID, "templateID": rec.ID, "status": b.Status, "logEntries": entries, "logs": []string{}}
	if b.Reason != nil {
		reason := map[string]any{"message": b.Reason.Message, "logEntries": []any{}}
		if b.Reason.Step != "" {
			reason["step"] = b.Reason.Step
		}
		out["reason"] = reason
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (e logEntry) json() map[string]any {
	out := map[string]any{"timestamp": e.Time.Format(time.RFC3339Nano), "level": e.Level, "message": e.Message}
	if e.Step != "" {
		out["step"] = e.Step
	}
	return out
}

// getTemplateSub serves GET /templates/aliases/{alias} and GET
// /templates/{id}/tags (one pattern: the two overlap).
func (s *Service) getTemplateSub(c caller, w http.ResponseWriter, r *http.Request) error {
	a, b := r.PathValue("a"), r.PathValue("b")
	switch {
	case a == "aliases":
		rec, err := s.templates.lookup(c, b)
		if err != nil || rec.Name != b {
			return errdefs.NotFoundf("template %q not found", b)
		}
		writeJSON(w, http.StatusOK, map[string]any{"templateID": rec.ID, "public": false})
		return nil
	case b == "tags":
		rec, err := s.templates.lookup(c, a)
		if err != nil {
			return err
		}
		s.templates.mu.Lock()
		out := []map[string]any{}
		for _, tg := range slices.Sorted(maps.Keys(rec.Tags)) {
			out = append(out, map[string]any{"tag": tg, "buildID": rec.Tags[tg].Build, "createdAt": rec.Tags[tg].At.Format(time.RFC3339Nano)})
		}
		s.templates.mu.Unlock()
		writeJSON(w, http.StatusOK, out)
		return nil
	}
	return errdefs.NotFoundf("no route for GET %s", r.URL.Path)
}

// listTemplates answers the caller's templates.
func (s *Service) listTemplates(c caller, w http.ResponseWriter, r *http.Request) error {
	t := s.templates
	t.mu.Lock()
	var recs []*templateRecord
	for _, rec := range t.byID {
		if c.seesTemplate(rec) {
			recs = append(recs, rec)
		}
	}
	slices.SortFunc(recs, func(a, b *templateRecord) int { return a.CreatedAt.Compare(b.CreatedAt) })
	out := []map[string]any{}
	for _, rec := range recs {
		out = append(out, rec.infoJSON())
	}
	t.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
	return nil
}

// getTemplate answers one template with its builds.
func (s *Service) getTemplate(c caller, w http.ResponseWriter, r *http.Request) error {
	rec, err := s.templates.lookup(c, r.PathValue("id"))
	if err != nil {
		return err
	}
	s.templates.mu.Lock()
	defer s.templates.mu.Unlock()
	out := rec.infoJSON()
	builds := []map[string]any{}
	for _, b := range rec.Builds {
		bj := map[string]any{"buildID": b.ID, "status": b.Status, "cpuCount": b.CPUCount, "memoryMB": b.MemoryMB,
			"createdAt": b.CreatedAt.Format(time.RFC3339Nano), "updatedAt": b.UpdatedAt.Format(time.RFC3339Nano)}
		if b.FinishedAt != nil {
			bj["finishedAt"] = b.FinishedAt.Format(time.RFC3339Nano)
		}
		builds = append(builds, bj)
	}
	out["builds"] = builds
	writeJSON(w, http.StatusOK, out)
	return nil
}

// infoJSON is a template as the API lists it; callers hold t.mu.
func (r *templateRecord) infoJSON() map[string]any {
	out := map[string]any{"templateID": r.ID, "names": []string{r.Name}, "aliases": []string{r.Name}, "public": false,
		"createdAt": r.CreatedAt.Format(time.RFC3339Nano), "updatedAt": r.UpdatedAt.Format(time.RFC3339Nano),
		"createdBy": nil, "lastSpawnedAt": nil, "spawnCount": 0, "buildCount": len(r.Builds), "envdVersion": envdVersion,
		"cpuCount": 0, "memoryMB": 0, "diskSizeMB": 0, "buildStatus": buildWaiting}
	if n := len(r.Builds); n > 0 {
		last := r.Builds[n-1]
		out["buildID"], out["buildStatus"], out["cpuCount"], out["memoryMB"] = last.ID, last.Status, last.CPUCount, last.MemoryMB
	}
	return out
}

// tagsBody is the body of POST and DELETE /templates/tags.
type tagsBody struct {
	Target string   `json:"target"`
	Name   string   `json:"name"`
	Tags   []string `json:"tags"`
}

// postTags points tags at the build a NAME:TAG target names.
func (s *Service) postTags(c caller, w http.ResponseWriter, r *http.Request) error {
	var b tagsBody
	if err := decode(r, &b); err != nil {
		return err
	}
	name, tag := splitTemplateRef(b.Target)
	if name == "" || len(b.Tags) == 0 {
		return errdefs.Invalidf("target (NAME:TAG) and tags are required")
	}
	for _, tg := range b.Tags {
		if !templateTagRE.MatchString(tg) {
			return errdefs.Invalidf("tags: %q is not a tag (letters, digits, '.', '_', '-', at most 128)", tg)
		}
	}
	rec, err := s.templates.lookup(c, name)
	if err != nil {
		return err
	}
	bld, err := s.templates.resolve(c, rec.ID+":"+tag)
	if err != nil {
		return err
	}
	t := s.templates
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now().UTC()
	old := maps.Clone(rec.Tags)
	if rec.Tags == nil {
		rec.Tags = map[string]tagRecord{}
	}
	for _, tg := range b.Tags {
		rec.Tags[tg] = tagRecord{Build: bld.ID, At: now}
	}
	if err := t.save(rec); err != nil {
		rec.Tags = old
		return err
	}
	writeJSON(w, http.StatusCreated, map[string]any{"buildID": bld.ID, "tags": b.Tags})
	return nil
}

// deleteTags removes tags from a template.
func (s *Service) deleteTags(c caller, w http.ResponseWriter, r *http.Request) error {
	var b tagsBody
	if err := decode(r, &b); err != nil {
		return err
	}
	if b.Name == "" || len(b.Tags) == 0 {
		return errdefs.Invalidf("name and tags are required")
	}
	rec, err := s.templates.lookup(c, b.Name)
	if err != nil {
		return err
	}
	t := s.templates
	t.mu.Lock()
	defer t.mu.Unlock()
	old := maps.Clone(rec.Tags)
	for _, tg := range b.Tags {
		if _, ok := rec.Tags[tg]; !ok {
			rec.Tags = old
			return errdefs.NotFoundf("template %s has no tag %q", rec.Name, tg)
		}
		delete(rec.Tags, tg)
	}
	if err := t.save(rec); err != nil {
		rec.Tags = old
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// deleteTemplate removes a template: its running build is stopped, its
// images untagged (removed once no sandbox uses them), its snapshots and
// uploaded files deleted.
func (s *Service) deleteTemplate(ctx context.Context, rec *templateRecord) error {
	t := s.templates
	t.mu.Lock()
	var stopping []*runningBuild
	for _, b := range rec.Builds {
		if rb := t.running[b.ID]; rb != nil {
			rb.cancel()
			stopping = append(stopping, rb)
		}
	}
	t.mu.Unlock()
	// A stopped build finishes its cleanup before the template goes.
	for _, rb := range stopping {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-rb.done:
		}
	}
	t.mu.Lock()
	builds := slices.Clone(rec.Builds)
	t.mu.Unlock()
	if err := s.removeBuilds(ctx, builds); err != nil {
		return err
	}
	t.mu.Lock()
	delete(t.byID, rec.ID)
	t.mu.Unlock()
	if err := os.RemoveAll(filepath.Join(t.files, rec.ID)); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(t.dir, rec.ID+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// sandboxConfig is the jail configuration of a sandbox of build b.
func (b *buildRecord) sandboxConfig() config.Config {
	return imageJailConfig(b.Image, b.CPUCount, b.MemoryMB)
}

// imageJailConfig is the configuration of a jail of image with the CPUs
// and memory a build asked for (0: the daemon's defaults).
func imageJailConfig(image string, cpus, memoryMB int) config.Config {
	var cfg config.Config
	cfg.Isolation.Filesystem.Rootfs = config.RootfsImagePrefix + image
	if cpus > 0 {
		cfg.Isolation.Resources.CPUPeriod = 100000
		cfg.Isolation.Resources.CPUQuota = int64(cpus) * 100000
	}
	if memoryMB > 0 {
		cfg.Isolation.Resources.MemoryBytes = int64(memoryMB) << 20
	}
	return cfg
}
