package initclient

import (
	"context"
	"errors"
	"io"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/initproto"
)

// NewKeepAlive returns a client of the init that d reaches which keeps up
// to maxIdle connections open between calls (initproto's keep-alive
// connections), so that a call does not pay for connecting: Exec without
// stdin and the calls answered by one frame reuse them; the others (file
// streams, terminals, detached commands, watches, ReadyForCheckpoint) still
// connect for themselves. An init that predates keep-alive connections is
// served as by New. Close releases the idle connections.
//
// Init closes the idle connections itself while it readies for a
// checkpoint (ReadyForCheckpoint, from any client); a call that finds its
// connection closed that way without an answer runs again on a new one.
func NewKeepAlive(d Dialer, maxIdle int) *Client {
	return &Client{dialer: d, pool: &pool{max: max(maxIdle, 1)}}
}

// Close closes the client's idle connections; calls still running close
// theirs when they end, and later calls connect for themselves. It
// returns nil.
func (c *Client) Close() error {
	if c.pool != nil {
		for _, cn := range c.pool.close() {
			cn.Conn.Close()
		}
	}
	return nil
}

// pool holds a client's idle keep-alive connections.
type pool struct {
	mu     sync.Mutex
	idle   []*conn
	max    int
	closed bool
	// legacy is set once init answered that it does not know keep-alive
	// connections.
	legacy bool
}

// take returns an idle connection whose peer has not closed it, or nil.
// Those init closed are dropped.
func (p *pool) take() *conn {
	for {
		p.mu.Lock()
		n := len(p.idle)
		if n == 0 {
			p.mu.Unlock()
			return nil
		}
		cn := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		if !peerClosed(cn) {
			return cn
		}
		cn.Conn.Close()
	}
}

// add keeps cn for a later call; false when the pool is closed or full.
func (p *pool) add(cn *conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.idle) >= p.max {
		return false
	}
	p.idle = append(p.idle, cn)
	return true
}

// close empties the pool for good and returns what it held.
func (p *pool) close() []*conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	return idle
}

// keepAlive reports whether new connections are to be keep-alive ones.
func (p *pool) keepAlive() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.closed && !p.legacy
}

// setLegacy records an init without keep-alive connections.
func (p *pool) setLegacy() {
	p.mu.Lock()
	p.legacy = true
	p.mu.Unlock()
}

// peerClosed reports whether init closed its end of an idle connection
// (it reads EOF or fails), peeking without consuming or blocking.
func peerClosed(cn *conn) bool {
	if cn.r.Buffered() > 0 {
		return true // nothing is due on an idle connection
	}
	sc, ok := cn.Conn.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	closed := false
	if err := rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		closed = n > 0 || err == nil || !errors.Is(err, unix.EAGAIN)
	}); err != nil {
		return true
	}
	return closed
}

// get returns a connection for a call that may run on a keep-alive one
// (plain false): an idle one, or a new one that asks for keep-alive with
// the call's request.
func (c *Client) get(ctx context.Context, plain bool) (*conn, error) {
	keep := c.pool != nil && !plain && c.pool.keepAlive()
	if keep {
		if cn := c.pool.take(); cn != nil {
			cn.reused = true
			cn.watch()
			return cn, nil
		}
	}
	cn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	cn.keep, cn.pending = keep, keep
	return cn, nil
}

// put returns cn, whose call ended cleanly, to the pool, or closes it.
func (c *Client) put(cn *conn) {
	if c.pool == nil || !cn.keep || cn.deadErr() != nil || !cn.unwatch() || !c.pool.add(cn) {
		cn.Close()
	}
}

// errNotRun is the failure of a request on a keep-alive connection that
// init closed before reading it: the request did not run.
var errNotRun = errors.New("init closed the idle connection before reading the request")

// errLegacy is init's refusal of a keep-alive connection.
var errLegacy = errors.New("init does not keep connections open")

// keepAliveFrame asks init to keep a connection open.
var keepAliveFrame = initproto.AppendFrame(nil, initproto.MsgKeepAlive, nil)

// exchange sends a request frame on cn (behind the keep-alive request on a
// new keep-alive connection) and reads the first frame of the answer.
func (cn *conn) exchange(frame []byte) (initproto.MsgType, []byte, error) {
	if cn.pending {
		frame = append(append(make([]byte, 0, len(keepAliveFrame)+len(frame)), keepAliveFrame...), frame...)
	}
	if _, err := cn.Write(frame); err != nil {
		if cn.reused && closedByPeer(err) {
			return 0, nil, errNotRun
		}
		return 0, nil, err
	}
	if cn.pending {
		t, payload, err := cn.read()
		if err != nil {
			return 0, nil, err
		}
		switch t {
		case initproto.MsgOK:
		case initproto.MsgError:
			var e initproto.Error
			if derr := initproto.Decode(t, payload, &e); derr == nil && e.Kind == initproto.KindInvalid {
				return 0, nil, errLegacy
			}
			cn.keep = false
			return t, payload, nil // refused (e.g. the peer check): the error is the answer
		default:
			return 0, nil, unexpected("keep-alive", t)
		}
		cn.pending = false
		cn.reused = true // from here, a close without an answer means not run
	}
	t, payload, err := cn.read()
	if err != nil && cn.reused && closedByPeer(err) {
		return 0, nil, errNotRun
	}
	return t, payload, err
}

// closedByPeer reports whether err is the end of a connection the peer
// closed.
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, unix.ECONNRESET) || errors.Is(err, unix.EPIPE)
}

// start sends a request of type t on a connection for it (see get) and
// returns the connection with the first frame of the answer. A request
// init did not run because it closed an idle connection is sent again, on
// a plain connection.
func (c *Client) start(ctx context.Context, op string, t initproto.MsgType, req any, plain bool) (*conn, initproto.MsgType, []byte, error) {
	frame, err := encodeFrame(t, req)
	if err != nil {
		return nil, 0, nil, err
	}
	for {
		cn, err := c.get(ctx, plain)
		if err != nil {
			return nil, 0, nil, err
		}
		stop := guard(ctx, cn)
		rt, payload, err := cn.exchange(frame)
		if stop() {
			cn.Close()
			return nil, 0, nil, ctx.Err()
		}
		if err == nil {
			return cn, rt, payload, nil
		}
		cn.Close()
		switch {
		case errors.Is(err, errLegacy):
			c.pool.setLegacy()
		case errors.Is(err, errNotRun) && !plain:
			plain = true
		default:
			return nil, 0, nil, ioError(ctx, cn, op, err)
		}
	}
}

// encodeFrame encodes a JSON frame (an empty payload when v is nil).
func encodeFrame(t initproto.MsgType, v any) ([]byte, error) {
	var buf frameBuffer
	if err := initproto.WriteJSON(&buf, t, v); err != nil {
		return nil, err
	}
	return buf, nil
}

// frameBuffer collects written frames.
type frameBuffer []byte

func (b *frameBuffer) Write(p []byte) (int, error) {
	*b = append(*b, p...)
	return len(p), nil
}
