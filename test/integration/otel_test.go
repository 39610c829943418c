package integration

import (
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	collogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is a minimal OTLP/HTTP receiver: it decodes the protobuf
// export requests of traces and logs and keeps what they carry.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []*tracepb.Span
	// logs are the log records' bodies by the jail id of their resource.
	logs map[string][]string
}

func (o *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil || r.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "want a protobuf body", http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	switch r.URL.Path {
	case "/v1/traces":
		var req coltrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, rs := range req.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				o.spans = append(o.spans, ss.GetSpans()...)
			}
		}
		b, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(b)
	case "/v1/logs":
		var req collogs.ExportLogsServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, rl := range req.GetResourceLogs() {
			jail := attr(rl.GetResource().GetAttributes(), "agentjail.jail.id")
			for _, sl := range rl.GetScopeLogs() {
				for _, lr := range sl.GetLogRecords() {
					o.logs[jail] = append(o.logs[jail], lr.GetBody().GetStringValue())
				}
			}
		}
		b, _ := proto.Marshal(&collogs.ExportLogsServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(b)
	default:
		http.NotFound(w, r)
	}
}

func attr(kvs []*commonpb.KeyValue, key string) string {
	for _, kv := range kvs {
		if kv.GetKey() == key {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

// tree returns the span named root whose attribute key is value and the
// spans below it, as "parent > child" lines; "" when there is none yet.
func (o *otlpReceiver) tree(root, key, value string) (map[string]*tracepb.Span, []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var top *tracepb.Span
	for _, s := range o.spans {
		if s.GetName() == root && attr(s.GetAttributes(), key) == value {
			top = s
		}
	}
	if top == nil {
		return nil, nil
	}
	byID := map[string]*tracepb.Span{hex.EncodeToString(top.GetSpanId()): top}
	var edges []string
	for grew := true; grew; {
		grew = false
		for _, s := range o.spans {
			id := hex.EncodeToString(s.GetSpanId())
			if byID[id] != nil {
				continue
			}
			if p := byID[hex.EncodeToString(s.GetParentSpanId())]; p != nil && string(s.GetTraceId()) == string(top.GetTraceId()) {
				byID[id] = s
				edges = append(edges, p.GetName()+" > "+s.GetName())
				grew = true
			}
		}
	}
	named := map[string]*tracepb.Span{}
	for _, s := range byID {
		named[s.GetName()] = s
	}
	return named, edges
}

// TestOTLPExport: with --otlp-endpoint, a receiver the test runs gets the
// spans of a create (the request's span, the manager's create, the
// backend's prepare and start, init's readiness below the start) and of
// an exec (request, manager, the call into init), each the child of the
// one before, and the jail's events as logs under a resource naming the
// jail.
func TestOTLPExport(t *testing.T) {
	rcv := &otlpReceiver{logs: map[string][]string{}}
	srv := httptest.NewServer(rcv)
	t.Cleanup(srv.Close)
	d := newDaemon(t, "--otlp-endpoint", srv.URL, "--warm-jails", "0")
	j := d.createJail(t, nil)
	d.mustSh(t, j.ID, "echo traced")

	wantEdges := map[string][]string{
		"POST /jails":           {"POST /jails > jail.create", "jail.create > backend.prepare", "jail.create > backend.start", "backend.start > init.ready"},
		"POST /jails/{id}/exec": {"POST /jails/{id}/exec > jail.exec", "jail.exec > init.exec"},
	}
	keys := map[string][2]string{
		"POST /jails":           {"http.route", "/jails"},
		"POST /jails/{id}/exec": {"agentjail.jail.id", j.ID},
	}
	for root, want := range wantEdges {
		err := waitFor(30*time.Second, func() error {
			named, edges := rcv.tree(root, keys[root][0], keys[root][1])
			for _, e := range want {
				if !strings.Contains(strings.Join(edges, "\n"), e) {
					return fmt.Errorf("no %q among the spans received below %s: %v", e, root, edges)
				}
			}
			if root == "POST /jails" && attr(named["jail.create"].GetAttributes(), "agentjail.jail.id") != j.ID {
				return fmt.Errorf("jail.create does not name the jail: %v", named["jail.create"].GetAttributes())
			}
			if named[root].GetKind() != tracepb.Span_SPAN_KIND_SERVER {
				return fmt.Errorf("%s is not a server span", root)
			}
			return nil
		})
		if err != nil {
			t.Error(err)
		}
	}
	if err := waitFor(30*time.Second, func() error {
		rcv.mu.Lock()
		defer rcv.mu.Unlock()
		for _, body := range rcv.logs[j.ID] {
			if strings.Contains(body, `"type":"proc"`) && strings.Contains(body, "echo") {
				return nil
			}
		}
		return fmt.Errorf("no process event of the exec among %d logs of the jail's resource", len(rcv.logs[j.ID]))
	}); err != nil {
		t.Error(err)
	}
}
