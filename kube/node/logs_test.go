package node

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/virtual-kubelet/virtual-kubelet/node/api"
)

func readAll(t *testing.T, l *containerLog, opts api.ContainerLogOpts) string {
	t.Helper()
	rc := l.read(context.Background(), opts)
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestContainerLog(t *testing.T) {
	l, err := openLog(filepath.Join(t.TempDir(), "c.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	for _, w := range []struct{ stream, data string }{
		{"stdout", "one\ntw"}, {"stderr", "err\n"}, {"stdout", "o\nthree\nunfinished"},
	} {
		if err := l.write(w.stream, []byte(w.data)); err != nil {
			t.Fatal(err)
		}
	}
	if got := readAll(t, l, api.ContainerLogOpts{}); got != "one\nerr\ntwo\nthree\n" {
		t.Fatalf("log %q", got)
	}
	if got := readAll(t, l, api.ContainerLogOpts{Tail: 2}); got != "two\nthree\n" {
		t.Fatalf("tail 2: %q", got)
	}
	if got := readAll(t, l, api.ContainerLogOpts{LimitBytes: 6}); got != "one\ner" {
		t.Fatalf("limit 6: %q", got)
	}
	if got := readAll(t, l, api.ContainerLogOpts{Timestamps: true}); !strings.HasSuffix(strings.Split(got, "\n")[0], "Z one") {
		t.Fatalf("timestamps: %q", got)
	}
	// Follow: what comes later, until the log ends.
	rc := l.read(context.Background(), api.ContainerLogOpts{Follow: true, Tail: 1})
	defer rc.Close()
	buf := make([]byte, 64)
	n, err := io.ReadAtLeast(rc, buf, len("three\n"))
	if err != nil || string(buf[:n]) != "three\n" {
		t.Fatalf("follow: %q %v", buf[:n], err)
	}
	if err := l.write("stdout", []byte("!\nfour\n")); err != nil {
		t.Fatal(err)
	}
	l.end()
	rest, err := io.ReadAll(rc)
	if err != nil || string(rest) != "unfinished!\nfour\n" {
		t.Fatalf("follow after: %q %v", rest, err)
	}
	// A line longer than maxLogLine is cut into parts.
	if err := l.write("stdout", []byte(strings.Repeat("x", maxLogLine+10)+"\n")); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, l, api.ContainerLogOpts{Tail: 1}); got != strings.Repeat("x", 10)+"\n" {
		t.Fatalf("the last part of a long line: %d bytes", len(got))
	}
}
