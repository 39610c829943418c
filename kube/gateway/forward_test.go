package gateway

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"
)

// TestForwardAnswersWhileRequestStreams: a node that answers as soon as it
// has read the message it needs, and streams on (as the E2B process stream
// does), is heard through the gateway while the client's request body is
// still open. The gateway's server must leave the request body to the
// transport when it writes the answer's head: taking it over there (to
// drain and close it) held the head back here, and when the body had
// already ended it closed the body under the transport's last read of it,
// which tore down the connection to the node and cut the stream.
func TestForwardAnswersWhileRequestStreams(t *testing.T) {
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		br := bufio.NewReader(r.Body)
		line, err := br.ReadString('\n')
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rc := http.NewResponseController(w)
		_ = rc.EnableFullDuplex()
		io.WriteString(w, "got "+line)
		if rc.Flush() != nil {
			return
		}
		rest, _ := io.ReadAll(br)
		io.WriteString(w, "then "+string(rest))
	}))
	defer node.Close()
	u, err := url.Parse(node.URL)
	if err != nil {
		t.Fatal(err)
	}
	g := &Gateway{where: newLocations(maxLocations), log: slog.New(slog.DiscardHandler)}
	n := agentNode{name: "n1", api: u, ready: true}
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.forward(w, r, n, r.URL.Path, "")
	}))
	defer front.Close()

	// The bound only ends a failing run: a passing one answers at once.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pr, pw := io.Pipe()
	defer pw.Close()
	// The client's transport waits for the body it sends to end.
	context.AfterFunc(ctx, func() { pw.CloseWithError(ctx.Err()) })
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, front.URL+"/stream", pr)
	if err != nil {
		t.Fatal(err)
	}
	go pw.Write([]byte("hello\n"))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("no answer while the request body was open: %v", err)
	}
	defer res.Body.Close()
	br := bufio.NewReader(res.Body)
	first, err := br.ReadString('\n')
	if err != nil || first != "got hello\n" {
		t.Fatalf("first part of the stream: %q, %v", first, err)
	}
	go func() {
		pw.Write([]byte("more"))
		pw.Close()
	}()
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "then more" {
		t.Fatalf("rest of the stream: %q, %v", rest, err)
	}
	if res.Header.Get(NodeHeader) != "n1" {
		t.Fatalf("answer not marked with its node: %v", res.Header)
	}
}
