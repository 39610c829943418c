package gateway

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/agentjail/agentjail/internal/duplextest"
)

// TestForwardIsFullDuplex: a node that answers as soon as it has read the
// message it needs, and streams on (as the E2B process stream does), is
// heard through the gateway while the client's request body is still open,
// and its stream is not cut when that body ends.
func TestForwardIsFullDuplex(t *testing.T) {
	node := httptest.NewServer(duplextest.Handler())
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
	if h := duplextest.Check(t, front.URL+"/stream", nil); h.Get(NodeHeader) != "n1" {
		t.Fatalf("answer not marked with its node: %v", h)
	}
}
