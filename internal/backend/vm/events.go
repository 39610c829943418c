package vm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"time"

	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/backend/vm/vmproto"
	"github.com/agentjail/agentjail/internal/observe"
)

// eventsIdle is how often the sink hears that the source is idle.
const eventsIdle = 250 * time.Millisecond

// eventsConnect bounds one attempt to reach the guest's event stream
// (a machine being restored is paused until its restore resumes it); the
// next attempt connects afresh.
const eventsConnect = 30 * time.Second

// maxEventLine bounds one event from the guest.
const maxEventLine = 1 << 20

var _ backend.EventSource = (*Backend)(nil)

// Events implements backend.EventSource: the guest reports the jail's
// process starts, programs and exits from inside the machine (the host's
// observers see only QEMU). They are read from the guest's KindEvents
// stream once the guest serves, reconnected when the control session is
// (a snapshot parks it), until stop.
func (b *Backend) Events(inst backend.Instance, st backend.Status, sink observe.Sink) (func() error, error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	sess := b.session(inst)
	go func() {
		defer close(done)
		select {
		case <-sess.ready:
		case <-ctx.Done():
			return
		}
		for ctx.Err() == nil {
			actx, acancel := context.WithTimeout(ctx, eventsConnect)
			c, err := sess.stream(actx, vmproto.KindEvents)
			acancel()
			if err == nil {
				stopClose := context.AfterFunc(ctx, func() { c.Close() })
				b.readEvents(c, sink)
				stopClose()
				c.Close()
			}
			t := time.NewTimer(time.Second)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
	}()
	return func() error {
		cancel()
		<-done
		return nil
	}, nil
}

// readEvents hands the events on c to sink until c ends.
func (b *Backend) readEvents(c interface {
	Read([]byte) (int, error)
	SetReadDeadline(time.Time) error
}, sink observe.Sink) {
	rd := bufio.NewReaderSize(c, 64<<10)
	var ev observe.Event
	var line []byte
	for {
		c.SetReadDeadline(time.Now().Add(eventsIdle))
		part, err := rd.ReadSlice('\n')
		if len(line)+len(part) <= maxEventLine {
			line = append(line, part...)
		}
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			sink.Idle()
			continue
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err != nil:
			return
		}
		var pe vmproto.ProcEvent
		err = json.Unmarshal(line, &pe)
		line = line[:0]
		if err != nil {
			continue
		}
		ev = observe.Event{TS: pe.TS}
		if pe.Op == vmproto.OpLost {
			ev.Type, ev.Lost, ev.Source = observe.TypeLost, pe.Lost, observe.LostKernel
		} else {
			ev.Type, ev.Op = observe.TypeProc, pe.Op
			ev.PID, ev.TID, ev.PPID, ev.Comm = pe.PID, pe.PID, pe.PPID, pe.Comm
			ev.Thread, ev.Exe, ev.Argv, ev.Cwd = pe.Thread, pe.Exe, pe.Argv, pe.Cwd
			ev.UID, ev.GID, ev.ExitCode, ev.Signal = pe.UID, pe.GID, pe.ExitCode, pe.Signal
		}
		sink.Handle(&ev)
	}
}
