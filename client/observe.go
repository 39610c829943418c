package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/agentjail/agentjail/internal/model"
)

// Observation types.
type (
	// Report is the whole observation of a jail.
	Report = model.Report
	// ProcessTree is a jail's observed process tree.
	ProcessTree = model.ProcessTree
	// ObservedProcess is one process of a ProcessTree.
	ObservedProcess = model.Process
	// FsDiff lists what a jail changed in its root filesystem.
	FsDiff = model.FsDiff
	// Change is one entry of an FsDiff.
	Change = model.Change
)

// Event is one event of a jail's stream: its sequence number, type and
// JSON object (the same as a line of the JSONL files).
type Event struct {
	Seq  uint64
	Type string
	Data json.RawMessage
}

// Events reads the jail's event stream from sequence number since (0: the
// oldest event the daemon still holds), restricted to types (none: all),
// calling fn for each event. Without follow it ends after the events held
// at the time of the call; with follow it ends when the jail stops, ctx is
// done, or fn returns an error.
func (c *Client) Events(ctx context.Context, ref string, since uint64, types []string, follow bool, fn func(Event) error) error {
	q := url.Values{}
	if !follow {
		q.Set("follow", "false")
	}
	if len(types) > 0 {
		q.Set("type", strings.Join(types, ","))
	}
	if since > 0 {
		q.Set("since", strconv.FormatUint(since, 10))
	}
	resp, err := c.do(ctx, request{method: http.MethodGet, path: jailURL(ref) + "/events", query: q})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var ev Event
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case len(line) == 0:
			if ev.Type != "" {
				if ev.Type == "end" {
					return nil
				}
				if err := fn(ev); err != nil {
					return err
				}
			}
			ev = Event{}
		case bytes.HasPrefix(line, []byte("id: ")):
			ev.Seq, _ = strconv.ParseUint(string(line[4:]), 10, 64)
		case bytes.HasPrefix(line, []byte("event: ")):
			ev.Type = string(line[7:])
		case bytes.HasPrefix(line, []byte("data: ")):
			ev.Data = append(json.RawMessage(nil), line[6:]...)
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("event stream: %w", err)
	}
	return ctx.Err()
}

// Report returns the jail's whole observation.
func (c *Client) Report(ctx context.Context, ref string) (*Report, error) {
	var r Report
	return &r, c.call(ctx, http.MethodGet, jailURL(ref)+"/report", nil, &r)
}

// Processes returns the jail's observed process tree.
func (c *Client) Processes(ctx context.Context, ref string) (*ProcessTree, error) {
	var t ProcessTree
	return &t, c.call(ctx, http.MethodGet, jailURL(ref)+"/processes", nil, &t)
}

// FsDiff returns what the jail changed in its root filesystem.
func (c *Client) FsDiff(ctx context.Context, ref string) (*FsDiff, error) {
	var d FsDiff
	return &d, c.call(ctx, http.MethodGet, jailURL(ref)+"/fs/diff", nil, &d)
}

// NetworkLog returns the jail's network record, one JSON object per line.
func (c *Client) NetworkLog(ctx context.Context, ref string) (io.ReadCloser, error) {
	resp, err := c.do(ctx, request{method: http.MethodGet, path: jailURL(ref) + "/network/log"})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// UpdateNetwork replaces the jail's network policy.
func (c *Client) UpdateNetwork(ctx context.Context, ref string, n Network) (*Jail, error) {
	var j Jail
	return &j, c.call(ctx, http.MethodPut, jailURL(ref)+"/network", n, &j)
}
