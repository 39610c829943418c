package api

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/observe"
)

// historyBatch is how many stored events one "history" event carries.
const historyBatch = 1000

// sseHeartbeat is how often an idle event stream sends a comment line so
// proxies do not close it.
const sseHeartbeat = 15 * time.Second

// events streams a jail's events as Server-Sent Events
// (GET /jails/{id}/events?type=syscall,file&since=SEQ). Each event's SSE id
// is its sequence number, so a reconnecting client resumes with
// Last-Event-ID; a client that falls behind the ring gets a "notice" event
// telling how many it missed instead of slowing the jail. With
// follow=false the stream ends once the events held at the time of the
// request are sent. With history=N (and no Last-Event-ID) the stream
// first sends the last N events stored in the jail's event files, oldest
// first, as "history" events whose data is a JSON array of up to
// historyBatch of them, then a "history-end" event with their count, then
// the live events newer than the last of them.
func (s *server) events(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	var types []string
	if t := q.Get("type"); t != "" {
		types = strings.Split(t, ",")
	}
	var after uint64
	since := q.Get("since")
	if le := r.Header.Get("Last-Event-ID"); le != "" {
		since = le
	}
	if since != "" {
		n, err := strconv.ParseUint(since, 10, 64)
		if err != nil {
			return errdefs.Invalidf("since: %q is not an event sequence number", since)
		}
		after = n
	}
	follow, err := followParam(q)
	if err != nil {
		return err
	}
	histN, err := parseHistory(q.Get("history"))
	if err != nil {
		return err
	}
	if r.Header.Get("Last-Event-ID") != "" {
		histN = 0 // a reconnecting client has the history
	}
	sub, last, err := s.svc.Events(r.Context(), r.PathValue("id"), after, types)
	if err != nil {
		return err
	}
	var hist []storedLine
	if histN > 0 {
		if hist, err = s.history(r.Context(), r.PathValue("id"), types, histN); err != nil {
			return err
		}
	}
	rc, bw := startEventStream(w, 64<<10)
	flush := func() error {
		if err := bw.Flush(); err != nil {
			return err
		}
		return rc.Flush()
	}
	if _, err := bw.WriteString(": agentjail event stream\n\n"); err != nil {
		return nil
	}
	if flush() != nil {
		return nil
	}
	line := make([]byte, 0, 1024)
	var histEnd int64 // live events up to this time were in the history
	if histN > 0 {
		// The stored events go in batches (a JSON array per SSE event):
		// a page parses 100 000 of them in a few calls, not one each.
		for i := 0; i < len(hist); i += historyBatch {
			line = append(line[:0], "event: history\ndata: ["...)
			for k, l := range hist[i:min(i+historyBatch, len(hist))] {
				if k > 0 {
					line = append(line, ',')
				}
				line = append(line, l.line...)
			}
			line = append(line, "]\n\n"...)
			if _, werr := bw.Write(line); werr != nil {
				return nil
			}
		}
		if len(hist) > 0 {
			histEnd = hist[len(hist)-1].ts
		}
		if _, werr := fmt.Fprintf(bw, "event: history-end\ndata: {\"type\":\"history-end\",\"count\":%d}\n\n", len(hist)); werr != nil {
			return nil
		}
		if flush() != nil {
			return nil
		}
	}
	buf := make([]observe.Event, 0, 256)
	end := func(msg string) {
		_, _ = fmt.Fprintf(bw, "event: end\ndata: {\"type\":\"end\",\"message\":%q}\n\n", msg)
		_ = flush()
	}
	if !follow && last <= after {
		end("no events after the requested one")
		return nil
	}
	wait := sseHeartbeat
	if !follow {
		// Filtered-out events also move the subscription on: look at its
		// position often so a filtered stream ends promptly.
		wait = 100 * time.Millisecond
	}
	for {
		ctx, cancel := context.WithTimeout(r.Context(), wait)
		evs, err := sub.Next(ctx, buf[:0])
		cancel()
		for i := range evs {
			ev := &evs[i]
			if ev.TS <= histEnd && ev.Type != observe.TypeNotice {
				continue
			}
			line = line[:0]
			line = append(line, "id: "...)
			line = strconv.AppendUint(line, ev.Seq, 10)
			line = append(line, "\nevent: "...)
			line = append(line, ev.Type.String()...)
			line = append(line, "\ndata: "...)
			line = ev.AppendJSON(line)
			line = append(line, "\n\n"...)
			if _, werr := bw.Write(line); werr != nil {
				return nil
			}
		}
		if !follow && sub.Position() >= last {
			end("all events held at the time of the request were sent")
			return nil
		}
		switch {
		case errors.Is(err, observe.ErrBusClosed):
			end("the jail stopped")
			return nil
		case r.Context().Err() != nil:
			return nil
		case errors.Is(err, context.DeadlineExceeded):
			if follow {
				if _, werr := bw.WriteString(": ping\n\n"); werr != nil {
					return nil
				}
			}
		case err != nil:
			s.log.Error("event stream", "err", err)
			return nil
		}
		if flush() != nil {
			return nil
		}
	}
}

// processes answers the jail's observed process tree.
func (s *server) processes(w http.ResponseWriter, r *http.Request) error {
	t, err := s.svc.Processes(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, t)
	return nil
}

// fsDiff answers what the jail changed in its root filesystem.
func (s *server) fsDiff(w http.ResponseWriter, r *http.Request) error {
	text, err := textParam(r)
	if err != nil {
		return err
	}
	d, err := s.svc.FsDiff(r.Context(), r.PathValue("id"), text)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, d)
	return nil
}

// report answers the whole observation of the jail.
func (s *server) report(w http.ResponseWriter, r *http.Request) error {
	rep, err := s.svc.Report(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, rep)
	return nil
}

// startEventStream answers 200 with a server-sent event stream that no
// proxy buffers, and returns the response's controller (to flush) and a
// writer of size bytes in front of it.
func startEventStream(w http.ResponseWriter, size int) (*http.ResponseController, *bufio.Writer) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	return http.NewResponseController(w), bufio.NewWriterSize(w, size)
}
