// Package metrics is the daemon's Prometheus instrumentation, on a
// registry of its own (not the global one): operation latencies,
// requests, the network policy's proxy bytes and refusals, the event
// writers' lines written and dropped, and, read at scrape time, the jails
// by state and level, each running jail's CPU, memory and disk, and the
// pool of ready jails.
//
// Label sets are bounded: operations, routes, streams, verdicts and
// states are fixed sets; the per-jail gauges are produced at each scrape
// from the jails that exist then (at most MaxJailSeries), so nothing
// accumulates as jails come and go.
package metrics

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/netpolicy"
	"github.com/agentjail/agentjail/internal/observe"
)

// Source is what the metrics read at scrape time; *jail.Manager
// implements it.
type Source interface {
	// List returns every jail, without live stats.
	List(ctx context.Context) ([]*model.Jail, error)
	// Get returns one jail with its live stats when it runs.
	Get(ctx context.Context, ref string) (*model.Jail, error)
	// Health reports the daemon's state (the ready-jail pool among it).
	Health(ctx context.Context) model.Health
}

// MaxJailSeries bounds the jails whose own gauges one scrape reports.
const MaxJailSeries = 1000

// scrapeTimeout bounds the reading of the jails at a scrape.
const scrapeTimeout = 10 * time.Second

// Metrics holds the daemon's collectors. A nil *Metrics records nothing.
type Metrics struct {
	reg      *prometheus.Registry
	ops      *prometheus.HistogramVec
	requests *prometheus.CounterVec
	netBytes *prometheus.CounterVec
	refused  *prometheus.CounterVec
}

// Ops are the operations whose latency is recorded (the op label).
var Ops = []string{"create", "exec", "snapshot", "restore", "branch", "destroy"}

// New makes the metrics and registers them, with the Go runtime's and the
// process's, on a registry of their own. The jails are read once Watch
// names their source.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		ops: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "agentjail_operation_duration_seconds",
			Help: "How long jail operations took, by operation (create, exec, snapshot, restore, branch, destroy) and outcome.",
			// 1 ms to ~65 s.
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 17),
		}, []string{"op", "outcome"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentjail_api_requests_total",
			Help: "API requests by route (the route's pattern) and status class.",
		}, []string{"route", "class"}),
		netBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentjail_proxy_bytes_total",
			Help: "Bytes the network policy's proxies carried for jails, by direction (out: sent by the jail) and path (http_proxy, connect, socks5, transparent).",
		}, []string{"direction", "via"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentjail_net_refused_total",
			Help: "Connections and DNS queries the network policy refused, by verdict (block, limit) and path (kernel, dns, proxies).",
		}, []string{"verdict", "via"}),
	}
	m.reg.MustRegister(m.ops, m.requests, m.netBytes, m.refused,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		eventsCollector{})
	return m
}

// Watch reads the jails and the pool of ready jails from src at each
// scrape.
func (m *Metrics) Watch(src Source) { m.reg.MustRegister(&scrapeCollector{src: src}) }

// Registry is the metrics' registry.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg, MaxRequestsInFlight: 4, Timeout: 2 * scrapeTimeout})
}

// Observe records that operation op took d and failed or not.
func (m *Metrics) Observe(op string, d time.Duration, failed bool) {
	if m == nil {
		return
	}
	outcome := "ok"
	if failed {
		outcome = "error"
	}
	m.ops.WithLabelValues(op, outcome).Observe(d.Seconds())
}

// Request counts an API request to route answered with status.
func (m *Metrics) Request(route string, status int) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(route, strconv.Itoa(status/100)+"xx").Inc()
}

// Net accounts one network policy record: proxied bytes, refusals.
func (m *Metrics) Net(ev netpolicy.ConnEvent) {
	if m == nil {
		return
	}
	via := ev.Via
	switch via {
	case netpolicy.ViaKernel, netpolicy.ViaDNS, netpolicy.ViaTransparent, netpolicy.ViaHTTPProxy, netpolicy.ViaConnect, netpolicy.ViaSOCKS:
	default:
		via = "other"
	}
	switch ev.Verdict {
	case netpolicy.VerdictBlock, netpolicy.VerdictLimit:
		m.refused.WithLabelValues(ev.Verdict, via).Inc()
	}
	if via != netpolicy.ViaKernel && via != netpolicy.ViaDNS {
		if ev.BytesOut > 0 {
			m.netBytes.WithLabelValues("out", via).Add(float64(ev.BytesOut))
		}
		if ev.BytesIn > 0 {
			m.netBytes.WithLabelValues("in", via).Add(float64(ev.BytesIn))
		}
	}
}

// scrapeCollector reads the jails, the event writers and the pool at
// each scrape.
type scrapeCollector struct {
	src Source
}

var (
	jailsDesc = prometheus.NewDesc("agentjail_jails", "Jails by state and isolation level.", []string{"state", "level"}, nil)
	cpuDesc   = prometheus.NewDesc("agentjail_jail_cpu_seconds_total", "CPU time a running jail's processes used.", []string{"jail", "name", "tenant"}, nil)
	memDesc   = prometheus.NewDesc("agentjail_jail_memory_bytes", "A running jail's memory use.", []string{"jail", "name", "tenant"}, nil)
	memLimit  = prometheus.NewDesc("agentjail_jail_memory_limit_bytes", "A running jail's memory limit.", []string{"jail", "name", "tenant"}, nil)
	diskDesc  = prometheus.NewDesc("agentjail_jail_disk_used_bytes", "What a running jail's writable layer holds.", []string{"jail", "name", "tenant"}, nil)
	pidsDesc  = prometheus.NewDesc("agentjail_jail_pids", "A running jail's processes.", []string{"jail", "name", "tenant"}, nil)
	written   = prometheus.NewDesc("agentjail_events_written_total", "Event lines written to the jails' JSONL files, by stream.", []string{"stream"}, nil)
	dropped   = prometheus.NewDesc("agentjail_events_dropped_total", "Event lines dropped (the disk was slower than the stream, or refused them), by stream.", []string{"stream"}, nil)
	warmSize  = prometheus.NewDesc("agentjail_warm_pool_size", "How many ready jails the daemon keeps.", nil, nil)
	warmReady = prometheus.NewDesc("agentjail_warm_pool_ready", "How many ready jails there are now.", nil, nil)
	warmTaken = prometheus.NewDesc("agentjail_warm_pool_taken_total", "Creates served from the pool of ready jails.", nil, nil)
	truncDesc = prometheus.NewDesc("agentjail_jail_series_truncated", "1 when more jails ran than the per-jail series a scrape reports.", nil, nil)
)

// eventsCollector reads the event writers' totals at each scrape.
type eventsCollector struct{}

func (eventsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- written
	ch <- dropped
}

func (eventsCollector) Collect(ch chan<- prometheus.Metric) {
	for _, t := range observe.StreamTotals() {
		ch <- prometheus.MustNewConstMetric(written, prometheus.CounterValue, float64(t.Written), t.Stream)
		ch <- prometheus.MustNewConstMetric(dropped, prometheus.CounterValue, float64(t.Dropped), t.Stream)
	}
}

func (c *scrapeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{jailsDesc, cpuDesc, memDesc, memLimit, diskDesc, pidsDesc, warmSize, warmReady, warmTaken, truncDesc} {
		ch <- d
	}
}

func (c *scrapeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	h := c.src.Health(ctx)
	if h.Warm != nil {
		ch <- prometheus.MustNewConstMetric(warmSize, prometheus.GaugeValue, float64(h.Warm.Size))
		ch <- prometheus.MustNewConstMetric(warmReady, prometheus.GaugeValue, float64(h.Warm.Ready))
		ch <- prometheus.MustNewConstMetric(warmTaken, prometheus.CounterValue, float64(h.Warm.Taken))
	}
	jails, err := c.src.List(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(jailsDesc, err)
		return
	}
	type key struct{ state, level string }
	counts := map[key]int{}
	series, truncated := 0, 0.0
	for _, j := range jails {
		counts[key{string(j.Status), j.Config.Isolation.Level}]++
		if j.Status != model.StateRunning {
			continue
		}
		if series == MaxJailSeries {
			truncated = 1
			continue
		}
		live, err := c.src.Get(ctx, j.ID)
		if err != nil || live.Stats == nil {
			continue
		}
		series++
		st, labels := live.Stats, []string{j.ID, j.Name, j.Tenant}
		ch <- prometheus.MustNewConstMetric(cpuDesc, prometheus.CounterValue, float64(st.CPUTimeNs)/1e9, labels...)
		ch <- prometheus.MustNewConstMetric(memDesc, prometheus.GaugeValue, float64(st.MemoryBytes), labels...)
		ch <- prometheus.MustNewConstMetric(memLimit, prometheus.GaugeValue, float64(st.MemoryLimitBytes), labels...)
		ch <- prometheus.MustNewConstMetric(diskDesc, prometheus.GaugeValue, float64(st.DiskUsedBytes), labels...)
		ch <- prometheus.MustNewConstMetric(pidsDesc, prometheus.GaugeValue, float64(st.Pids), labels...)
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(jailsDesc, prometheus.GaugeValue, float64(n), k.state, k.level)
	}
	ch <- prometheus.MustNewConstMetric(truncDesc, prometheus.GaugeValue, truncated)
}
