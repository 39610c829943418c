package e2b

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
)

// buildSpec is a build to run.
type buildSpec struct {
	template, name, build string
	body                  buildBody
	// auth is the base image's registry credentials (nil: the daemon's).
	auth          *model.RegistryAuth
	caller        caller
	cpu, memoryMB int
	// baseImage is the image of the fromTemplate base ("" with fromImage).
	baseImage string
}

// builder runs one build: the state its steps change.
type builder struct {
	s    *Service
	spec buildSpec
	jail string
	// env, workdir and user are what ENV, WORKDIR and USER set so far.
	env     []string
	workdir string
	user    string
}

// stepError is a build's failure at a step ("base", "finalize", or the
// step's number: its index in the SDK's stack traces).
type stepError struct {
	step string
	err  error
}

func (e *stepError) Error() string { return e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

func atStep(step string, err error) error {
	if err == nil {
		return nil
	}
	var se *stepError
	if errors.As(err, &se) {
		return err
	}
	return &stepError{step: step, err: err}
}

// runBuild runs spec's build to its end, ready or failed, and records it.
func (s *Service) runBuild(ctx context.Context, spec buildSpec) {
	t := s.templates
	select {
	case t.slots <- struct{}{}:
		defer func() { <-t.slots }()
	case <-ctx.Done():
		s.finishBuild(spec, "", "", atStep("base", ctx.Err()))
		return
	}
	s.setBuildStatus(spec, buildBuilding)
	b := &builder{s: s, spec: spec}
	img, snap, err := b.run(ctx)
	s.finishBuild(spec, img, snap, err)
}

// run builds the image (and the snapshot of its start command).
func (b *builder) run(ctx context.Context) (image, snapshot string, err error) {
	spec := b.spec
	s := b.s
	ctx = withCaller(ctx, spec.caller)
	base := spec.baseImage
	if base == "" {
		img, err := b.baseImage(ctx, spec.body.FromImage, spec.body.Force)
		if err != nil {
			return "", "", atStep("base", err)
		}
		base = img.ID
	} else {
		b.logf("info", "base", "Building on template %s", spec.body.FromTemplate)
	}
	if key := spec.key(base); key != "" {
		from := s.reusable(ctx, spec, key)
		s.updateBuild(spec, func(r *buildRecord) { r.Key = key })
		if from != nil {
			b.logf("info", "finalize", "Unchanged since build %s: using its image %s", from.ID, from.Image)
			return from.Image, from.Snapshot, nil
		}
	}
	cfg := imageJailConfig(base, spec.cpu, spec.memoryMB)
	cfg.Isolation.Network = (&netSettings{Internet: true}).policy(config.NetBridge, nil)
	j, err := b.newJail(ctx, cfg, "build")
	if err != nil {
		return "", "", atStep("base", err)
	}
	b.jail = j
	defer b.destroy(j)
	for i, st := range spec.body.Steps {
		step := strconv.Itoa(i + 1)
		b.logf("info", step, "[%d/%d] %s %s", i+1, len(spec.body.Steps), st.Type, strings.Join(st.Args, " "))
		if err := b.step(ctx, step, st); err != nil {
			return "", "", atStep(step, err)
		}
	}
	tag := "agentjail.template/" + spec.template + ":" + spec.build
	changes := &model.ImageConfig{Env: b.env, WorkingDir: b.workdir, User: b.user}
	img, err := s.opts.Images.Commit(ctx, j, model.CommitRequest{Ref: tag, Comment: "template " + spec.name + ", build " + spec.build, Changes: changes})
	if err != nil {
		return "", "", atStep("finalize", fmt.Errorf("committing the image: %w", err))
	}
	b.logf("info", "finalize", "Image %s (%s)", tag, img.ID)
	if spec.body.StartCmd == "" {
		return tag, "", nil
	}
	snap, err := b.startSnapshot(ctx, tag, cfg)
	if err != nil {
		if _, rerr := s.opts.Images.RemoveImage(context.WithoutCancel(ctx), tag, false); rerr != nil {
			s.log.Error("removing the image of a failed template build", "image", tag, "err", rerr)
		}
		return "", "", atStep("finalize", err)
	}
	return tag, snap, nil
}

// baseImage is the image ref names: the store's, as a Dockerfile's FROM
// takes a local image, unless force (skipCache) asks for a pull; else
// pulled, each layer's end in the log.
func (b *builder) baseImage(ctx context.Context, ref string, force bool) (*model.Image, error) {
	if !force {
		img, err := b.s.opts.Images.GetImage(ctx, ref)
		if err == nil {
			b.logf("info", "base", "Using %s (%s) from the daemon's store", ref, img.ID)
			return img, nil
		}
		if !errors.Is(err, errdefs.ErrNotFound) {
			return nil, fmt.Errorf("looking up %s: %w", ref, err)
		}
	}
	b.logf("info", "base", "Pulling %s", ref)
	img, err := b.s.opts.Images.PullImage(ctx, ref, b.spec.auth, func(p model.PullProgress) {
		switch p.Status {
		case "exists", "done":
			b.logf("info", "base", "Layer %s: %s", p.Layer, p.Status)
		case "failed":
			b.logf("error", "base", "Layer %s: %s", p.Layer, p.Error)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("pulling %s: %w", ref, err)
	}
	return img, nil
}

// newJail creates and records a jail of the build.
func (b *builder) newJail(ctx context.Context, cfg config.Config, role string) (string, error) {
	name := fmt.Sprintf("e2b-%s-%s-%s", role, b.spec.template, b.spec.build[:8])
	j, err := b.s.jails.Create(ctx, model.CreateRequest{Name: name, Config: cfg})
	if err != nil {
		return "", err
	}
	b.s.updateBuild(b.spec, func(r *buildRecord) { r.Jails = append(r.Jails, j.ID) })
	return j.ID, nil
}

// destroy removes a jail of the build, whatever the build's context.
func (b *builder) destroy(j string) {
	ctx, cancel := context.WithTimeout(withCaller(context.Background(), b.spec.caller), opTimeout)
	defer cancel()
	if err := b.s.jails.Destroy(ctx, j); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		b.s.log.Error("destroying a template build's jail", "jail", j, "err", err)
	}
}

// step runs one instruction in the build's jail.
func (b *builder) step(ctx context.Context, step string, st buildStep) error {
	switch st.Type {
	case "RUN":
		user := b.user
		if len(st.Args) > 1 && st.Args[1] != "" {
			user = st.Args[1]
		}
		return b.exec(ctx, step, []string{"/bin/sh", "-c", st.Args[0]}, user)
	case "COPY":
		return b.copy(ctx, step, st)
	case "ENV":
		for i := 0; i < len(st.Args); i += 2 {
			name := st.Args[i]
			b.env = slices.DeleteFunc(b.env, func(kv string) bool { return strings.HasPrefix(kv, name+"=") })
			b.env = append(b.env, name+"="+st.Args[i+1])
		}
		return nil
	case "WORKDIR":
		b.workdir = b.abs(st.Args[0])
		_, err := b.s.jails.Mkdir(ctx, b.jail, b.workdir, model.WriteOptions{User: b.user})
		return err
	case "USER":
		b.user = st.Args[0]
		return nil
	}
	return errdefs.Invalidf("unknown step %q", st.Type)
}

// abs resolves p against the work dir.
func (b *builder) abs(p string) string {
	if path.IsAbs(p) {
		return path.Clean(p)
	}
	wd := b.workdir
	if wd == "" {
		wd = "/"
	}
	return path.Join(wd, p)
}

// exec runs argv in the build's jail with the build's environment, its
// output going to the log; a failure names the exit status.
func (b *builder) exec(ctx context.Context, step string, argv []string, user string) error {
	env := map[string]string{}
	for _, kv := range b.env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	lw := &logWriter{b: b, step: step}
	res, err := b.s.jails.Exec(ctx, b.jail, model.ExecRequest{Cmd: argv, Env: env, Cwd: b.workdir, User: user},
		func(stream string, data []byte) error { lw.write(data); return nil })
	lw.flush()
	if err != nil {
		return err
	}
	if res.ExitCode != 0 || res.Signal != "" {
		what := "exit code " + strconv.Itoa(res.ExitCode)
		if res.Signal != "" {
			what = "signal " + res.Signal
		}
		return fmt.Errorf("%q failed with %s", strings.Join(argv[2:], " "), what)
	}
	return nil
}

// logWriter turns command output into log lines.
type logWriter struct {
	b    *builder
	step string
	buf  []byte
}

func (w *logWriter) write(p []byte) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.b.logf("info", w.step, "%s", w.buf[:i])
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) > maxLogLine {
		w.flush()
	}
}

func (w *logWriter) flush() {
	if len(w.buf) > 0 {
		w.b.logf("info", w.step, "%s", w.buf)
		w.buf = nil
	}
}

// copy unpacks a COPY step's uploaded archive into the jail. As in a
// Dockerfile, a directory's contents go into the destination, and a file
// goes to the destination itself unless it ends in "/" or the source is
// a pattern (then into it, by its own name).
func (b *builder) copy(ctx context.Context, step string, st buildStep) error {
	src := strings.TrimPrefix(path.Clean(st.Args[0]), "./")
	dest := b.abs(st.Args[1])
	intoDir := strings.HasSuffix(st.Args[1], "/") || strings.ContainsAny(src, "*?[")
	var user string
	var mode uint32
	if len(st.Args) > 2 {
		user = st.Args[2]
	}
	if user == "" {
		user = b.user
	}
	if len(st.Args) > 3 && st.Args[3] != "" {
		m, err := parseMode(st.Args[3])
		if err != nil {
			return err
		}
		mode = m
	}
	f, err := os.Open(b.s.templates.filePath(b.spec.template, st.FilesHash))
	if err != nil {
		return fmt.Errorf("the files of COPY %s: %w", src, err)
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return errdefs.Invalidf("COPY %s: %v", src, err)
		}
		defer zr.Close()
		r = zr
	}
	tr := tar.NewReader(r)
	copied := 0
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return errdefs.Invalidf("COPY %s: the uploaded archive: %v", src, err)
		}
		name := strings.TrimSuffix(strings.TrimPrefix(path.Clean("/"+hdr.Name), "/"), "/")
		if name == "" || name != strings.TrimSuffix(strings.TrimPrefix(hdr.Name, "./"), "/") {
			return errdefs.Invalidf("COPY %s: the archive's entry %q is not a clean relative path", src, hdr.Name)
		}
		target, ok := copyTarget(src, name, dest, intoDir, hdr.Typeflag == tar.TypeDir)
		if !ok {
			continue
		}
		if err := b.place(ctx, hdr, tr, target, user, mode); err != nil {
			return fmt.Errorf("COPY %s → %s: %w", name, target, err)
		}
		copied++
	}
	if copied == 0 {
		return errdefs.Invalidf("COPY %s: the uploaded archive holds nothing it names", src)
	}
	b.logf("info", step, "Copied %d entries to %s", copied, dest)
	return nil
}

// copyTarget is where the archive's entry name goes for a COPY of src to
// dest: false when src does not match it. The match is the shortest
// leading part of name that src (a path or a pattern) matches.
func copyTarget(src, name, dest string, intoDir, isDir bool) (string, bool) {
	parts := strings.Split(name, "/")
	for i := 1; i <= len(parts); i++ {
		prefix := strings.Join(parts[:i], "/")
		if ok, _ := path.Match(src, prefix); !ok {
			continue
		}
		rest := strings.Join(parts[i:], "/")
		switch {
		case rest != "":
			// Inside a matched directory: its contents go into dest (into
			// dest/NAME for a pattern, as each match keeps its name).
			if strings.ContainsAny(src, "*?[") {
				return path.Join(dest, parts[i-1], rest), true
			}
			return path.Join(dest, rest), true
		case isDir && !strings.ContainsAny(src, "*?["):
			return dest, true
		case intoDir:
			return path.Join(dest, parts[i-1]), true
		default:
			return dest, true
		}
	}
	return "", false
}

// place writes one archive entry at target in the jail.
func (b *builder) place(ctx context.Context, hdr *tar.Header, r io.Reader, target, user string, mode uint32) error {
	j := b.s.jails
	switch hdr.Typeflag {
	case tar.TypeDir:
		_, err := j.Mkdir(ctx, b.jail, target, model.WriteOptions{User: user, Mode: uint32(hdr.Mode & 0o7777)})
		return err
	case tar.TypeReg:
		m := uint32(hdr.Mode & 0o7777)
		if mode != 0 {
			m = mode
		}
		_, err := j.WriteFile(ctx, b.jail, target, r, model.WriteOptions{User: user, Mode: m})
		return err
	case tar.TypeSymlink:
		return b.exec(ctx, "", []string{"/bin/sh", "-c", `ln -sfn -- "$0" "$1"`, hdr.Linkname, target}, user)
	}
	return errdefs.Invalidf("%q: a %s entry; COPY takes files, directories and symbolic links", hdr.Name, tarType(hdr.Typeflag))
}

func tarType(t byte) string {
	switch t {
	case tar.TypeLink:
		return "hard link"
	case tar.TypeChar, tar.TypeBlock:
		return "device"
	case tar.TypeFifo:
		return "fifo"
	}
	return "type " + strconv.Quote(string(t))
}

// parseMode reads a COPY mode ("0755").
func parseMode(s string) (uint32, error) {
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, errdefs.Invalidf("mode %q is not an octal file mode", s)
	}
	return uint32(m), nil
}

// startSnapshot starts the template's start command in a jail of its new
// image, waits until the ready command succeeds, and snapshots the jail
// with its processes.
func (b *builder) startSnapshot(ctx context.Context, image string, build config.Config) (string, error) {
	spec := b.spec
	cfg := build
	cfg.Isolation.Filesystem.Rootfs = config.RootfsImagePrefix + image
	j, err := b.newJail(ctx, cfg, "start")
	if err != nil {
		return "", err
	}
	defer b.destroy(j)
	b.jail = j
	b.logf("info", "finalize", "Starting %s", spec.body.StartCmd)
	if ready := spec.body.ReadyCmd; ready != "" {
		b.logf("info", "finalize", "Waiting for %s", ready)
	}
	if err := b.s.startTemplate(ctx, j, spec.body.StartCmd, spec.body.ReadyCmd); err != nil {
		return "", err
	}
	snap, err := b.s.snapshot(ctx, j, model.SnapshotRequest{Name: fmt.Sprintf("e2b-template-%s-%s", spec.template, spec.build[:8]), Mode: model.SnapshotFull})
	if err != nil {
		return "", fmt.Errorf("snapshotting the started template: %w", err)
	}
	b.logf("info", "finalize", "Snapshot %s with the start command running", snap.ID)
	return snap.ID, nil
}

// key identifies what a build of spec on base (an image id) makes: the
// base, every step with its uploaded files' hash, the start and ready
// commands and the resources; "" when the build must run anyway
// (skipCache, or a step forced).
func (spec buildSpec) key(base string) string {
	if spec.body.Force || slices.ContainsFunc(spec.body.Steps, func(st buildStep) bool { return st.Force }) {
		return ""
	}
	data, _ := json.Marshal(struct {
		Base           string
		Steps          []buildStep
		Start, Ready   string
		CPUs, MemoryMB int
	}{base, spec.body.Steps, spec.body.StartCmd, spec.body.ReadyCmd, spec.cpu, spec.memoryMB})
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// reusable returns a copy of the newest ready build of spec's template
// with key whose image is still in the store, or nil.
func (s *Service) reusable(ctx context.Context, spec buildSpec, key string) *buildRecord {
	t := s.templates
	t.mu.Lock()
	var from *buildRecord
	if rec := t.byID[spec.template]; rec != nil {
		for i := len(rec.Builds) - 1; i >= 0 && from == nil; i-- {
			if b := rec.Builds[i]; b.Key == key && b.Status == buildReady && b.Image != "" {
				c := *b
				from = &c
			}
		}
	}
	t.mu.Unlock()
	if from == nil {
		return nil
	}
	if _, err := s.opts.Images.GetImage(ctx, from.Image); err != nil {
		return nil
	}
	return from
}

// startTemplate starts a template's start command in jail j, where it
// outlives the call as a sandbox's commands do, and waits until the ready
// command (if any) succeeds, for at most readyTimeout.
func (s *Service) startTemplate(ctx context.Context, j, start, ready string) error {
	proc, err := s.jails.StartProcess(ctx, j, model.ExecRequest{Cmd: []string{"/bin/sh", "-c", start}}, false, nil)
	if err != nil {
		return fmt.Errorf("the start command: %w", err)
	}
	proc.Close()
	if ready == "" {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for {
		res, err := s.jails.Exec(rctx, j, model.ExecRequest{Cmd: []string{"/bin/sh", "-c", ready}, TimeoutMs: 10_000}, nil)
		if err == nil && res.ExitCode == 0 && res.Signal == "" {
			return nil
		}
		if rctx.Err() != nil {
			return fmt.Errorf("the ready command %q did not succeed within %s", ready, readyTimeout)
		}
		select {
		case <-rctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// logf adds a line to the build's log.
func (b *builder) logf(level, step, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if len(msg) > maxLogLine {
		msg = msg[:maxLogLine] + "…"
	}
	e := logEntry{Time: time.Now().UTC(), Level: level, Message: msg, Step: step}
	b.s.updateBuild(b.spec, func(r *buildRecord) {
		switch {
		case len(r.Log) < maxBuildLog:
			r.Log = append(r.Log, e)
		case len(r.Log) == maxBuildLog:
			r.Log = append(r.Log, logEntry{Time: e.Time, Level: "warn", Message: fmt.Sprintf("(the log keeps %d lines; the rest are left out)", maxBuildLog)})
		}
	})
}

// updateBuild changes a build's record in memory (saved at its end).
func (s *Service) updateBuild(spec buildSpec, f func(*buildRecord)) {
	t := s.templates
	t.mu.Lock()
	defer t.mu.Unlock()
	if rec := t.byID[spec.template]; rec != nil {
		if b := rec.build(spec.build); b != nil {
			f(b)
			b.UpdatedAt = time.Now().UTC()
		}
	}
}

// setBuildStatus records a build's new status.
func (s *Service) setBuildStatus(spec buildSpec, status string) {
	s.updateBuild(spec, func(b *buildRecord) { b.Status = status })
	s.saveTemplate(spec.template)
}

func (s *Service) saveTemplate(id string) {
	t := s.templates
	t.mu.Lock()
	defer t.mu.Unlock()
	if rec := t.byID[id]; rec != nil {
		if err := t.save(rec); err != nil {
			s.log.Error("saving a template", "template", id, "err", err)
		}
	}
}

// finishBuild records a build's end: ready, its tags moved to it, or
// failed with the reason. Then the template sheds what no build needs:
// builds past the newest keepBuilds (unless tagged or under way, their
// images and snapshots removed), and uploaded archives this build did not
// use that no build under way uses either.
func (s *Service) finishBuild(spec buildSpec, image, snapshot string, err error) {
	t := s.templates
	t.mu.Lock()
	rec := t.byID[spec.template]
	if rec == nil {
		t.mu.Unlock()
		return // deleted meanwhile
	}
	b := rec.build(spec.build)
	now := time.Now().UTC()
	b.UpdatedAt, b.FinishedAt = now, &now
	if err != nil {
		b.Status = buildError
		step := ""
		var se *stepError
		if errors.As(err, &se) {
			step = se.step
		}
		msg := err.Error()
		if errors.Is(err, context.DeadlineExceeded) {
			msg = fmt.Sprintf("the build did not finish within %s", buildTimeout)
		} else if errors.Is(err, context.Canceled) {
			msg = "the build was stopped"
		}
		b.Reason = &buildReason{Message: msg, Step: step}
		b.Log = append(b.Log, logEntry{Time: now, Level: "error", Message: msg, Step: step})
	} else {
		b.Status, b.Image, b.Snapshot = buildReady, image, snapshot
		if snapshot != "" {
			b.StartCmd, b.ReadyCmd = spec.body.StartCmd, spec.body.ReadyCmd
		}
		if rec.Tags == nil {
			rec.Tags = map[string]tagRecord{}
		}
		for _, tg := range b.Tags {
			rec.Tags[tg] = tagRecord{Build: b.ID, At: now}
		}
		b.Log = append(b.Log, logEntry{Time: now, Level: "info", Message: "Template " + rec.Name + " is ready (tags " + strings.Join(b.Tags, ", ") + ")", Step: "finalize"})
	}
	rec.UpdatedAt = now
	dropped := t.trim(rec)
	if err := t.save(rec); err != nil {
		s.log.Error("saving a template", "template", rec.ID, "err", err)
	}
	t.pruneFiles(rec.ID, spec.body.Steps, b.CreatedAt)
	t.mu.Unlock()
	ctx, cancel := context.WithTimeout(withCaller(context.Background(), spec.caller), opTimeout)
	defer cancel()
	if err := s.removeBuilds(ctx, dropped); err != nil {
		s.log.Warn("removing old template builds", "template", spec.template, "err", err)
	}
}

// keepBuilds is how many builds of a template are kept besides the tagged
// ones and those under way.
const keepBuilds = 10

// trim drops the builds of rec past the newest keepBuilds that no tag
// names and that are over, and returns them; callers hold t.mu.
func (t *templates) trim(rec *templateRecord) []*buildRecord {
	tagged := map[string]bool{}
	for _, tr := range rec.Tags {
		tagged[tr.Build] = true
	}
	var kept, dropped []*buildRecord
	others := 0
	for i := len(rec.Builds) - 1; i >= 0; i-- {
		b := rec.Builds[i]
		switch {
		case tagged[b.ID] || b.Status == buildWaiting || b.Status == buildBuilding:
			kept = append(kept, b)
		case others < keepBuilds:
			others++
			kept = append(kept, b)
		default:
			dropped = append(dropped, b)
		}
	}
	slices.Reverse(kept)
	rec.Builds = kept
	// An image or snapshot a kept build reuses stays.
	for _, d := range dropped {
		for _, k := range kept {
			if d.Image == k.Image {
				d.Image = ""
			}
			if d.Snapshot == k.Snapshot {
				d.Snapshot = ""
			}
		}
	}
	return dropped
}

// removeBuilds removes the images (untagged: removed once no sandbox
// uses them) and snapshots of builds a template no longer keeps.
func (s *Service) removeBuilds(ctx context.Context, builds []*buildRecord) error {
	var errs []error
	for _, b := range builds {
		if b.Image != "" {
			if _, err := s.opts.Images.RemoveImage(ctx, b.Image, false); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				errs = append(errs, err)
			}
		}
		if b.Snapshot != "" {
			if err := s.jails.DeleteSnapshot(ctx, b.Snapshot); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// pruneFiles removes the uploaded archives of template tpl that steps do
// not use, no build under way uses, and that were not uploaded or asked
// for since since (a build being prepared may need those); callers hold
// t.mu.
func (t *templates) pruneFiles(tpl string, steps []buildStep, since time.Time) {
	used := map[string]bool{}
	for _, st := range steps {
		used[st.FilesHash] = true
	}
	ents, _ := os.ReadDir(filepath.Join(t.files, tpl))
	for _, e := range ents {
		p := t.filePath(tpl, e.Name())
		info, err := e.Info()
		if err != nil || used[e.Name()] || t.inUse[p] > 0 || !info.ModTime().Before(since) {
			continue
		}
		_ = os.Remove(p)
	}
}
