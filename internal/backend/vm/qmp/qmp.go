// Package qmp is a small client of the QEMU Machine Protocol: JSON
// commands and replies over the unix socket of a QEMU process started with
// -qmp unix:PATH,server=on,wait=off. It speaks the capabilities handshake,
// runs one command at a time, and keeps the asynchronous events it sees
// for callers that wait for one.
package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// maxLine bounds one message from QEMU.
const maxLine = 4 << 20

// Error is an error QEMU answered a command with.
type Error struct {
	Command string
	Class   string `json:"class"`
	Desc    string `json:"desc"`
}

func (e *Error) Error() string { return fmt.Sprintf("qmp %s: %s: %s", e.Command, e.Class, e.Desc) }

// Event is an asynchronous QMP event.
type Event struct {
	Name string          `json:"event"`
	Data json.RawMessage `json:"data"`
}

// Conn is a QMP connection. Its methods are safe for concurrent use;
// commands run one at a time.
type Conn struct {
	c  net.Conn
	mu sync.Mutex // one command at a time
	rd *bufio.Reader

	evMu   sync.Mutex
	events []Event
}

// Dial connects to the QMP socket at path and negotiates capabilities,
// within ctx.
func Dial(ctx context.Context, path string) (*Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("qmp: %w", err)
	}
	q := &Conn{c: c, rd: bufio.NewReaderSize(c, 64<<10)}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	// The greeting, then the handshake.
	if _, err := q.readMsg(); err != nil {
		c.Close()
		return nil, fmt.Errorf("qmp greeting: %w", err)
	}
	c.SetDeadline(time.Time{})
	if _, err := q.Execute(ctx, "qmp_capabilities", nil); err != nil {
		c.Close()
		return nil, err
	}
	return q, nil
}

// Close closes the connection.
func (q *Conn) Close() error { return q.c.Close() }

type message struct {
	Return json.RawMessage `json:"return"`
	Error  *Error          `json:"error"`
	Event  string          `json:"event"`
	Data   json.RawMessage `json:"data"`
	QMP    json.RawMessage `json:"QMP"`
}

func (q *Conn) readMsg() (*message, error) {
	line, err := q.rd.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		buf := append([]byte(nil), line...)
		for errors.Is(err, bufio.ErrBufferFull) && len(buf) < maxLine {
			line, err = q.rd.ReadSlice('\n')
			buf = append(buf, line...)
		}
		line = buf
	}
	if err != nil {
		return nil, err
	}
	var m message
	if err := json.Unmarshal(line, &m); err != nil {
		return nil, fmt.Errorf("qmp: bad message %q: %w", line, err)
	}
	return &m, nil
}

// Execute runs command with args (nil: none) and returns its "return"
// value. A reply of QEMU's error is an *Error. ctx bounds the wait.
func (q *Conn) Execute(ctx context.Context, command string, args any) (json.RawMessage, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	req := map[string]any{"execute": command}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(time.Minute)
	}
	q.c.SetDeadline(dl)
	defer q.c.SetDeadline(time.Time{})
	if _, err := q.c.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("qmp %s: %w", command, err)
	}
	for {
		m, err := q.readMsg()
		if err != nil {
			return nil, fmt.Errorf("qmp %s: %w", command, err)
		}
		switch {
		case m.Event != "":
			q.evMu.Lock()
			q.events = append(q.events, Event{Name: m.Event, Data: m.Data})
			if len(q.events) > 256 {
				q.events = q.events[len(q.events)-256:]
			}
			q.evMu.Unlock()
		case m.Error != nil:
			m.Error.Command = command
			return nil, m.Error
		default:
			return m.Return, nil
		}
	}
}

// Run is Execute for a command whose return value does not matter.
func (q *Conn) Run(ctx context.Context, command string, args any) error {
	_, err := q.Execute(ctx, command, args)
	return err
}

// MigrationStatus is the state of the last migration (query-migrate).
type MigrationStatus struct {
	Status string `json:"status"`
	Error  string `json:"error-desc"`
}

// WaitMigration polls query-migrate until the migration completed or
// failed, every interval, within ctx.
func (q *Conn) WaitMigration(ctx context.Context, interval time.Duration) error {
	for {
		raw, err := q.Execute(ctx, "query-migrate", nil)
		if err != nil {
			return err
		}
		var st MigrationStatus
		if err := json.Unmarshal(raw, &st); err != nil {
			return fmt.Errorf("qmp query-migrate: %w", err)
		}
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", st.Status, st.Error)
		}
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("migration still %s: %w", st.Status, ctx.Err())
		case <-t.C:
		}
	}
}

// Status returns the VM's run state (query-status), e.g. "running",
// "paused", "inmigrate", "postmigrate".
func (q *Conn) Status(ctx context.Context) (string, error) {
	raw, err := q.Execute(ctx, "query-status", nil)
	if err != nil {
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return "", fmt.Errorf("qmp query-status: %w", err)
	}
	return st.Status, nil
}
