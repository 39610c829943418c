package integration

import (
	"bytes"
	"net/http"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape reads GET /metrics with c and parses it with the Prometheus
// text parser.
func scrape(t *testing.T, c *client) map[string]*dto.MetricFamily {
	t.Helper()
	r := c.do(t, "GET", "/metrics", nil)
	if r.status != http.StatusOK {
		t.Fatalf("GET /metrics: %s", r)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(r.body))
	if err != nil {
		t.Fatalf("parsing the metrics: %v\n%s", err, r.body)
	}
	return fams
}

// sample returns the value of the family's series whose labels include
// want (summed over the matching series), and how many series matched.
func sample(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, int) {
	f := fams[name]
	if f == nil {
		return 0, 0
	}
	var sum float64
	n := 0
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			match = match && labels[k] == v
		}
		if !match {
			continue
		}
		n++
		switch {
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum, n
}

// TestMetrics: GET /metrics, parsed with the Prometheus text parser, moves
// as jails are made, run commands and go: jails by state and level,
// operation latencies, event lines written, and per-jail gauges that
// exist only while their jail does. Only admins may read them.
func TestMetrics(t *testing.T) {
	d := shared(t)
	before := scrape(t, d.api)
	running0, _ := sample(before, "agentjail_jails", map[string]string{"state": "running", "level": "container"})
	creates0, _ := sample(before, "agentjail_operation_duration_seconds", map[string]string{"op": "create", "outcome": "ok"})
	execs0, _ := sample(before, "agentjail_operation_duration_seconds", map[string]string{"op": "exec", "outcome": "ok"})

	j := d.createJail(t, nil)
	d.mustSh(t, j.ID, "echo metrics; head -c 1000000 /dev/zero > /tmp/fill")
	mid := scrape(t, d.api)
	if v, _ := sample(mid, "agentjail_jails", map[string]string{"state": "running", "level": "container"}); v != running0+1 {
		t.Errorf("running container jails: %v after a create, %v before", v, running0)
	}
	if v, _ := sample(mid, "agentjail_operation_duration_seconds", map[string]string{"op": "create", "outcome": "ok"}); v != creates0+1 {
		t.Errorf("create latencies observed: %v, before %v", v, creates0)
	}
	if v, _ := sample(mid, "agentjail_operation_duration_seconds", map[string]string{"op": "exec", "outcome": "ok"}); v < execs0+1 {
		t.Errorf("exec latencies observed: %v, before %v", v, execs0)
	}
	mem, n := sample(mid, "agentjail_jail_memory_bytes", map[string]string{"jail": j.ID})
	if n != 1 || mem <= 0 {
		t.Errorf("the jail's memory gauge: %d series, %v bytes", n, mem)
	}
	if v, n := sample(mid, "agentjail_jail_cpu_seconds_total", map[string]string{"jail": j.ID, "name": j.Name, "tenant": "default"}); n != 1 || v <= 0 {
		t.Errorf("the jail's CPU counter: %d series, %v s", n, v)
	}
	if v, _ := sample(mid, "agentjail_events_written_total", map[string]string{"stream": "processes"}); v <= 0 {
		t.Errorf("no process event lines written: %v", v)
	}
	if _, n := sample(mid, "agentjail_events_dropped_total", map[string]string{"stream": "syscalls"}); n != 1 {
		t.Errorf("no dropped-lines series for syscalls")
	}
	if _, n := sample(mid, "go_goroutines", nil); n != 1 {
		t.Errorf("no Go runtime metrics")
	}

	d.destroy(t, j.ID)
	after := scrape(t, d.api)
	if _, n := sample(after, "agentjail_jail_memory_bytes", map[string]string{"jail": j.ID}); n != 0 {
		t.Errorf("a destroyed jail keeps %d memory series", n)
	}
	if v, _ := sample(after, "agentjail_jails", map[string]string{"state": "running", "level": "container"}); v != running0 {
		t.Errorf("running container jails after the destroy: %v, want %v", v, running0)
	}
	if v, _ := sample(after, "agentjail_operation_duration_seconds", map[string]string{"op": "destroy"}); v < 1 {
		t.Errorf("no destroy latency observed")
	}

	u := d.makeKey(t, "metrics-user", "user")
	if r := d.as(u.Secret).do(t, "GET", "/metrics", nil); r.status != http.StatusForbidden {
		t.Errorf("a user key reads the metrics: %s", r)
	}
}
