package netns

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/testenv"
)

// inNS runs fn on a locked thread moved into ns; the thread is discarded.
func inNS(t *testing.T, ns vnetns.NsHandle, fn func() error) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := vnetns.Set(ns); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

func mountedAt(t *testing.T, path string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(b), " "+path+" ")
}

func TestCreate(t *testing.T) {
	testenv.RequireRoot(t)
	path := filepath.Join(t.TempDir(), "run", "netns", "a")

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	self, err := vnetns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()

	if err := Create(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Remove(path) })
	if now, err := vnetns.Get(); err != nil || !now.Equal(self) {
		t.Fatalf("Create changed the caller's namespace (%v)", err)
	}
	if !Exists(path) {
		t.Fatal("Exists is false after Create")
	}
	if err := Create(path); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("second Create: %v, want ErrConflict", err)
	}

	ns, err := vnetns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if ns.Equal(self) {
		t.Fatal("the namespace is the caller's own")
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	if len(links) != 1 || links[0].Attrs().Name != "lo" {
		var names []string
		for _, l := range links {
			names = append(names, l.Attrs().Name)
		}
		t.Fatalf("interfaces in the namespace: %v, want only lo", names)
	}
	if links[0].Attrs().Flags&net.FlagUp == 0 {
		t.Fatal("lo is down")
	}

	// A TCP server on 127.0.0.1 inside answers a client inside.
	err = inNS(t, ns, func() error {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer ln.Close()
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			io.Copy(c, c)
		}()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return err
		}
		defer c.Close()
		if _, err := c.Write([]byte("ping")); err != nil {
			return err
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil {
			return err
		}
		if string(buf) != "ping" {
			return fmt.Errorf("echo %q", buf)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("loopback TCP inside the namespace: %v", err)
	}

	if err := Remove(path); err != nil {
		t.Fatal(err)
	}
	if Exists(path) || mountedAt(t, path) {
		t.Fatal("namespace still mounted after Remove")
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("path left after Remove: %v", err)
	}
	if err := Remove(path); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
}

func TestCreateConcurrent(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	const n = 20
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := filepath.Join(dir, fmt.Sprint(i))
			if err := Create(p); err != nil {
				t.Errorf("Create %s: %v", p, err)
				return
			}
			if !Exists(p) {
				t.Errorf("%s does not exist", p)
			}
			if err := Remove(p); err != nil {
				t.Errorf("Remove %s: %v", p, err)
			}
		}()
	}
	wg.Wait()
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("left behind: %v", ents)
	}
}

func TestCreateFailureLeavesNothing(t *testing.T) {
	testenv.RequireRoot(t)
	// The parent is a file: nothing can be made there.
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Create(filepath.Join(file, "ns")); err == nil {
		t.Fatal("Create under a file succeeded")
	}
	if err := Create("relative"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("relative path: %v, want ErrInvalid", err)
	}
	if Exists(file) {
		t.Fatal("a plain file reported as a namespace")
	}
}
