package initclient_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/initd"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/testenv"
)

// fuzzEnv is a server whose root is refilled for every fuzz input (reset):
// the root has /etc/passwd, /etc/group, /work with a file, a directory, a
// blocked directory and symbolic links that point out of the root
// (relative, absolute, to the outside directory by its host path) and to
// themselves. outside, next to the root, holds a secret.
type fuzzEnv struct {
	dir, root, outside, sock string
	c                        *initclient.Client
	logs                     *lockedBuffer
	logged                   int // length of logs at reset
	before                   map[string]string
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// newFuzzEnv starts the server once per fuzzing process; its root stays
// the same directory (init holds it open) and reset refills it.
func newFuzzEnv(f *testing.F) *fuzzEnv {
	f.Helper()
	testenv.RequireRoot(f)
	dir := f.TempDir()
	e := &fuzzEnv{dir: dir, root: filepath.Join(dir, "root"), outside: filepath.Join(dir, "outside"), sock: filepath.Join(dir, "init.sock"), logs: &lockedBuffer{}}
	mustMkdir(f, e.root, 0o755)
	mustMkdir(f, e.outside, 0o755)
	mustWrite(f, filepath.Join(e.outside, "secret"), secret, 0o644)
	srv, err := initd.NewServer(initd.Options{
		Config: initproto.InitConfig{JailID: "fuzz", DefaultUser: "agent", Workspace: "/work", BlockedPaths: []string{"/work/blocked"}},
		Root:   e.root,
		Log:    log.New(e.logs, "", 0),
	})
	if err != nil {
		f.Fatal(err)
	}
	l, err := net.Listen("unix", e.sock)
	if err != nil {
		f.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	e.c = initclient.New(initclient.UnixSocket(e.sock))
	f.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			f.Errorf("shutdown: %v", err)
		}
		if err := <-served; err != nil {
			f.Errorf("serve: %v", err)
		}
	})
	return e
}

// reset empties the root and fills it again, and records what lies
// outside it.
func (e *fuzzEnv) reset(t *testing.T) {
	t.Helper()
	entries, err := os.ReadDir(e.root)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range entries {
		if err := os.RemoveAll(filepath.Join(e.root, d.Name())); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(e.root, 0o755); err != nil {
		t.Fatal(err)
	}
	mustMkdir(t, filepath.Join(e.root, "etc"), 0o755)
	mustWrite(t, filepath.Join(e.root, "etc/passwd"), testPasswd, 0o644)
	mustWrite(t, filepath.Join(e.root, "etc/group"), testGroup, 0o644)
	mustMkdir(t, filepath.Join(e.root, "work/dir/sub"), 0o755)
	mustMkdir(t, filepath.Join(e.root, "work/blocked"), 0o755)
	mustWrite(t, filepath.Join(e.root, "work/file"), "inside\n", 0o644)
	mustWrite(t, filepath.Join(e.root, "work/blocked/hidden"), "hidden\n", 0o644)
	for link, target := range map[string]string{
		"work/out-rel": "../../outside",
		"work/out-abs": e.outside,
		"work/up":      "../../../../..",
		"work/loop":    "loop",
		"work/dir/to":  "/work/out-rel/secret",
	} {
		if err := os.Symlink(target, filepath.Join(e.root, link)); err != nil {
			t.Fatal(err)
		}
	}
	e.before = tree(t, e.dir, e.root)
	e.logged = len(e.logs.String())
}

// tree describes everything under dir except the root: each path with
// its type, mode and, for files, content.
func tree(t *testing.T, dir, skip string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == skip {
			return filepath.SkipDir
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		desc := info.Mode().String()
		if info.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += " " + string(b)
		}
		out[p] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// check asserts what must hold after any input: nothing outside the
// root changed, init logged no panic, and it still answers.
func (e *fuzzEnv) check(t *testing.T) {
	t.Helper()
	after := tree(t, e.dir, e.root)
	for p, d := range e.before {
		if after[p] != d {
			t.Fatalf("%s outside the root changed: %q, was %q", p, after[p], d)
		}
	}
	for p := range after {
		if _, ok := e.before[p]; !ok {
			t.Fatalf("%s was created outside the root", p)
		}
	}
	if l := e.logs.String()[e.logged:]; strings.Contains(l, "panic") {
		t.Fatalf("init panicked:\n%s", l)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.c.Ping(ctx); err != nil {
		t.Fatalf("init no longer answers: %v", err)
	}
}

// preciseError fails unless err carries an error kind (what the API turns
// into a 4xx); an error without one would be a 500.
func preciseError(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil && errdefs.Code(err) == "internal" {
		t.Fatalf("%s: an error without a kind: %v", what, err)
	}
}

// FuzzFilePaths runs the file operations of the control protocol with
// arbitrary jail paths through the real client and init: paths with "..",
// symbolic links out of the root, NUL bytes, blocked paths. Nothing
// outside init's root is read, created or changed; every refusal carries
// an error kind; init keeps answering.
func FuzzFilePaths(f *testing.F) {
	e := newFuzzEnv(f)
	for _, s := range []struct {
		op     uint8
		p1, p2 string
	}{
		{0, "/work/out-rel/secret", ""},
		{1, "/work/out-abs", ""},
		{2, "/../../outside/secret", ""},
		{2, "/work/dir/to", ""},
		{3, "/work/out-rel/new", ""},
		{3, "/work/up/tmp/x", ""},
		{4, "/work/out-abs/d", ""},
		{5, "/work/out-rel", ""},
		{5, "/work/up", ""},
		{6, "/work/file", "/work/out-rel/secret"},
		{6, "/work/out-rel/secret", "/work/stolen"},
		{7, "/work/blocked/hidden", ""},
		{2, "/work/blocked/../blocked/hidden", ""},
		{1, "/work/loop/x", ""},
		{3, "/work/a\x00b", ""},
		{0, "work/file", ""},
	} {
		f.Add(s.op, s.p1, s.p2, []byte("data"), uint16(0o644), "", true)
	}
	f.Add(uint8(3), "/work/new", "", []byte{}, uint16(0o7777), "tester", true)
	f.Add(uint8(4), "/work/a/b/c", "", []byte{}, uint16(0o700), "4321", true)
	f.Add(uint8(7), "/work/file", "", []byte{}, uint16(0), "nobody-here", false)
	f.Fuzz(func(t *testing.T, op uint8, p1, p2 string, data []byte, mode uint16, user string, flag bool) {
		e.reset(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		opts := initproto.WriteOptions{Mode: uint32(mode), User: user, MkdirParents: flag}
		var err error
		var infos []initproto.FileInfo
		switch op % 8 {
		case 0:
			var fi initproto.FileInfo
			fi, err = e.c.Stat(ctx, p1)
			infos = append(infos, fi)
		case 1:
			infos, err = e.c.ReadDir(ctx, p1)
		case 2:
			var rc io.ReadCloser
			var fi initproto.FileInfo
			fi, rc, err = e.c.ReadFile(ctx, p1)
			if err == nil {
				var b []byte
				b, err = io.ReadAll(rc)
				rc.Close()
				if bytes.Contains(b, []byte(secret)) || bytes.Contains(b, []byte("hidden")) {
					t.Fatalf("read %q: %q, from outside the root or a blocked path", p1, b)
				}
			}
			infos = append(infos, fi)
		case 3:
			_, err = e.c.WriteFile(ctx, p1, bytes.NewReader(data), opts)
		case 4:
			_, err = e.c.Mkdir(ctx, p1, opts)
		case 5:
			err = e.c.Remove(ctx, p1, flag)
		case 6:
			err = e.c.Rename(ctx, p1, p2)
		case 7:
			_, _, err = e.c.Access(ctx, p1, flag, user)
		}
		if ctx.Err() != nil {
			t.Fatalf("op %d %q %q: no answer within 10s", op%8, p1, p2)
		}
		preciseError(t, fmt.Sprintf("op %d %q %q", op%8, p1, p2), err)
		for _, fi := range infos {
			if fi.Name == "secret" || fi.Name == "hidden" {
				t.Fatalf("op %d %q: shows %+v from outside the root or a blocked path", op%8, p1, fi)
			}
		}
		e.check(t)
	})
}

// FuzzInitProtocol writes an arbitrary request frame and arbitrary bytes
// after it to init's control socket, then ends its side of the
// connection. Init answers with well-formed frames of reply types and
// closes the connection within a bound (a watch stays open until the
// client leaves), its error frames carry a kind other than internal,
// nothing outside its root changes, and it keeps answering. Requests that
// start commands (exec, shims) are left to the exec tests.
func FuzzInitProtocol(f *testing.F) {
	e := newFuzzEnv(f)
	frame := func(t initproto.MsgType, p string) []byte { return initproto.AppendFrame(nil, t, []byte(p)) }
	f.Add(byte(initproto.MsgPing), []byte(""), []byte{})
	f.Add(byte(initproto.MsgStat), []byte(`{"path":"/work/out-rel/secret"}`), []byte{})
	f.Add(byte(initproto.MsgReadDir), []byte(`{"path":"/work"}`), []byte{})
	f.Add(byte(initproto.MsgListDir), []byte(`{"path":"/work","limit":2}`), []byte{})
	f.Add(byte(initproto.MsgReadFile), []byte(`{"path":"/work/file"}`), []byte{})
	f.Add(byte(initproto.MsgWriteFile), []byte(`{"path":"/work/new","mode":384,"mkdir_parents":true}`),
		append(frame(initproto.MsgData, "abc"), frame(initproto.MsgEOF, "")...))
	f.Add(byte(initproto.MsgWriteFile), []byte(`{"path":"/work/new2"}`), frame(initproto.MsgData, "cut short"))
	f.Add(byte(initproto.MsgWriteFile), []byte(`{"path":"/work/new3"}`), frame(initproto.MsgStdin, "wrong type"))
	f.Add(byte(initproto.MsgMkdir), []byte(`{"path":"/work/d/e","mkdir_parents":true,"user":"tester"}`), []byte{})
	f.Add(byte(initproto.MsgSymlink), []byte(`{"path":"/work/ln","target":"../../out-abs/x","user":"tester"}`), []byte{})
	f.Add(byte(initproto.MsgRemove), []byte(`{"path":"/work/dir","recursive":true}`), []byte{})
	f.Add(byte(initproto.MsgRename), []byte(`{"from":"/work/file","to":"/work/out-abs/x"}`), []byte{})
	f.Add(byte(initproto.MsgAccess), []byte(`{"path":"/work/file","write":true,"user":"1000"}`), []byte{})
	f.Add(byte(initproto.MsgSignal), []byte(`{"pid":1,"signal":"KILL"}`), []byte{})
	f.Add(byte(initproto.MsgKill), []byte(`{"pid":1}`), []byte{})
	f.Add(byte(initproto.MsgAttach), []byte(`{"pid":1}`), []byte{})
	f.Add(byte(initproto.MsgInput), []byte(`{"pid":1,"data":"aGk="}`), []byte{})
	f.Add(byte(initproto.MsgSetSize), []byte(`{"pid":1,"rows":24,"cols":80}`), []byte{})
	f.Add(byte(initproto.MsgWatch), []byte(`{"path":"/work","recursive":true}`), []byte{})
	f.Add(byte(initproto.MsgList), []byte(""), []byte{})
	f.Add(byte(initproto.MsgSessions), []byte(""), []byte{})
	f.Add(byte(0xee), []byte("{}"), []byte{})
	f.Add(byte(initproto.MsgStat), []byte(`{"path":`), []byte{})
	f.Fuzz(func(t *testing.T, typ byte, payload, rest []byte) {
		mt := initproto.MsgType(typ)
		if mt == initproto.MsgExec || mt == initproto.MsgShims || len(payload) > initproto.MaxPayload {
			return
		}
		e.reset(t)
		nc, err := net.Dial("unix", e.sock)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		if _, err := nc.Write(append(initproto.AppendFrame(nil, mt, payload), rest...)); err != nil {
			t.Fatalf("write: %v", err)
		}
		if err := nc.(*net.UnixConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		bound := 10 * time.Second
		if mt == initproto.MsgWatch {
			bound = 300 * time.Millisecond
		}
		nc.SetReadDeadline(time.Now().Add(bound))
		for {
			rt, p, err := initproto.ReadFrame(nc, nil)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				var ne net.Error
				if mt == initproto.MsgWatch && errors.As(err, &ne) && ne.Timeout() {
					break
				}
				t.Fatalf("%s request: reading the answer: %v", mt, err)
			}
			switch rt {
			case initproto.MsgOK, initproto.MsgData, initproto.MsgEOF, initproto.MsgStarted,
				initproto.MsgStdout, initproto.MsgStderr, initproto.MsgExit:
			case initproto.MsgError:
				var pe initproto.Error
				if err := initproto.Decode(rt, p, &pe); err != nil {
					t.Fatalf("%s request: error frame %q: %v", mt, p, err)
				}
				if pe.Kind == initproto.KindInternal || pe.Kind == "" {
					t.Fatalf("%s request %q: an error without a precise kind: %+v", mt, payload, pe)
				}
			default:
				t.Fatalf("%s request: init sent a %s frame", mt, rt)
			}
		}
		nc.Close()
		e.check(t)
	})
}
