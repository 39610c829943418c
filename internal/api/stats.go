package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
)

// Intervals of GET /stats.
const (
	defaultStatsInterval = time.Second
	minStatsInterval     = 250 * time.Millisecond
	maxStatsInterval     = time.Minute
)

// StatsSample is one event of GET /stats: every jail, each running one
// with its live usage, at one moment.
type StatsSample struct {
	// TS is when the sample was taken.
	TS time.Time `json:"ts"`
	// IntervalMs is the stream's interval (CPU use is the difference of
	// two samples' cpu_time_ns over it).
	IntervalMs int64         `json:"interval_ms"`
	Jails      []*model.Jail `json:"jails"`
}

// stats streams StatsSample events (GET /stats?interval_ms=N): the list
// of jails with live usage, at once and then every interval, so a page
// sees jails come, go, change state and use resources without asking
// again. With follow=false it sends one sample and ends.
func (s *server) stats(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	interval := defaultStatsInterval
	if v := q.Get("interval_ms"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		d := time.Duration(n) * time.Millisecond
		if err != nil || d < minStatsInterval || d > maxStatsInterval {
			return errdefs.Invalidf("interval_ms: %q must be a number of milliseconds between %d and %d", v, minStatsInterval.Milliseconds(), maxStatsInterval.Milliseconds())
		}
		interval = d
	}
	follow, err := followParam(q)
	if err != nil {
		return err
	}
	// The first sample is taken before the response begins, so a failing
	// one is an ordinary error answer.
	sample, err := s.sample(r, interval)
	if err != nil {
		return err
	}
	rc, bw := startEventStream(w, 32<<10)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		b, err := json.Marshal(sample)
		if err != nil {
			return err
		}
		bw.WriteString("event: stats\ndata: ")
		bw.Write(b)
		bw.WriteString("\n\n")
		if bw.Flush() != nil || rc.Flush() != nil || !follow {
			return nil
		}
		select {
		case <-r.Context().Done():
			return nil
		case <-t.C:
		}
		if sample, err = s.sample(r, interval); err != nil {
			s.log.Warn("stats stream", "err", err)
			return nil
		}
	}
}

// sample lists the jails with the live stats of the running ones.
func (s *server) sample(r *http.Request, interval time.Duration) (*StatsSample, error) {
	list, err := s.svc.List(r.Context())
	if err != nil {
		return nil, err
	}
	out := &StatsSample{TS: time.Now().UTC(), IntervalMs: interval.Milliseconds(), Jails: make([]*model.Jail, 0, len(list))}
	for _, j := range list {
		if j.Status == model.StateRunning {
			// A jail destroyed meanwhile is simply left out.
			if full, err := s.svc.Get(r.Context(), j.ID); err == nil {
				j = full
			} else if errors.Is(err, errdefs.ErrNotFound) {
				continue
			}
		}
		out.Jails = append(out.Jails, j)
	}
	return out, nil
}
