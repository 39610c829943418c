// Package duplextest checks that an HTTP/1 proxy is full duplex: an
// upstream that answers as soon as it has read the start of a request body
// is heard by the client while that body is still open, and the rest of
// the answer follows when the body ends.
//
// A Go HTTP/1 server drains and closes a request body that its handler has
// not read to the end when the handler writes the answer's head, unless the
// handler enables full duplex. A proxying handler then holds the head back
// until the client's body ends, and when the body has ended it can close
// the body under its transport's last read, which tears down the
// connection upstream and cuts the answer.
package duplextest

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"testing"
	"time"
)

// Handler is the upstream: it answers "got LINE" as soon as it has read the
// first line of the request body, and "then REST" when the body ends.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		_ = rc.EnableFullDuplex()
		br := bufio.NewReader(r.Body)
		line, err := br.ReadString('\n')
		if err != nil {
			http.Error(w, "no first line: "+err.Error(), http.StatusBadRequest)
			return
		}
		io.WriteString(w, "got "+line)
		if rc.Flush() != nil {
			return
		}
		rest, _ := io.ReadAll(br)
		io.WriteString(w, "then "+string(rest))
	})
}

// Check sends a POST to url through the proxy in front of Handler, with
// the request made ready by prepare (headers, Host), and fails t unless the
// first part of the answer arrives while the body is open and the rest
// after it ends. It returns the answer's header.
func Check(t *testing.T, url string, prepare func(*http.Request)) http.Header {
	t.Helper()
	// The bound only ends a failing run: a passing one answers at once.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pr, pw := io.Pipe()
	defer pw.Close()
	// The client's transport waits for the body it sends to end.
	context.AfterFunc(ctx, func() { pw.CloseWithError(ctx.Err()) })
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, pr)
	if err != nil {
		t.Fatal(err)
	}
	if prepare != nil {
		prepare(req)
	}
	go pw.Write([]byte("hello\n"))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("no answer while the request body was open: %v", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
		t.Fatalf("status %d: %s", res.StatusCode, b)
	}
	br := bufio.NewReader(res.Body)
	first, err := br.ReadString('\n')
	if err != nil || first != "got hello\n" {
		t.Fatalf("first part of the answer: %q, %v", first, err)
	}
	go func() {
		pw.Write([]byte("more"))
		pw.Close()
	}()
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "then more" {
		t.Fatalf("rest of the answer: %q, %v", rest, err)
	}
	return res.Header
}
