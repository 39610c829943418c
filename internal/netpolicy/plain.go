package netpolicy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Plain HTTP from a jail is forwarded by the daemon's own HTTP/1.1 client
// instead of http.Transport, so the proxy holds the upstream socket: the
// body of a response of known length is then spliced from the upstream
// socket to the jail's socket inside the kernel (clientConn.ReadFrom)
// instead of being copied through the daemon. Requests and responses are
// still written and parsed by net/http. TLS upstreams (inspected HTTPS)
// keep using http.Transport.

const (
	plainIdlePerHost   = 16
	plainIdleTimeout   = 90 * time.Second
	plainHeaderTimeout = 5 * time.Minute
)

// plainConn is one upstream connection for plain HTTP.
type plainConn struct {
	tc   *net.TCPConn
	br   *bufio.Reader
	bw   *bufio.Writer
	key  string // host:port as asked by the jail
	gen  uint64 // the pool's generation when it was dialed
	idle time.Time
	// stop ends the watch that aborts the connection when the request's
	// context ends; it reports false when the abort already happened.
	stop func() bool
	// sent, for a request with a body, reports the end of its writing,
	// which goes on while the answer is read; nil for one without.
	sent chan error
	// bodyErr is the request body's read error, which ends the wait for
	// an answer that will not come.
	bodyErr atomic.Pointer[error]
}

// alive reports whether an idle connection can carry another request:
// the upstream has neither closed it nor sent anything unasked.
func (pc *plainConn) alive() bool {
	raw, err := pc.tc.SyscallConn()
	if err != nil {
		return false
	}
	ok := false
	raw.Control(func(fd uintptr) {
		var b [1]byte
		_, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		ok = errors.Is(err, unix.EAGAIN)
	})
	return ok
}

// exchange writes req and reads the response head, skipping interim
// (1xx) responses. The connection is aborted if ctx ends before release.
// A request body is written while the answer is read (full duplex): an
// upstream may answer before the request ends (a stream, an upload's
// progress, an early refusal), and its answer must not wait for that end.
func (pc *plainConn) exchange(ctx context.Context, req *http.Request) (*http.Response, error) {
	pc.stop = context.AfterFunc(ctx, func() { pc.tc.SetDeadline(time.Unix(1, 0)) })
	pc.tc.SetReadDeadline(time.Now().Add(plainHeaderTimeout))
	pc.sent = nil
	pc.bodyErr.Store(nil)
	if req.Body == nil || req.Body == http.NoBody {
		if err := pc.write(req); err != nil {
			return nil, err
		}
	} else {
		req.Body = &upBody{ReadCloser: req.Body, pc: pc}
		sent := make(chan error, 1)
		pc.sent = sent
		go func() { sent <- pc.write(req) }()
	}
	for {
		resp, err := http.ReadResponse(pc.br, req)
		if err != nil {
			if berr := pc.bodyErr.Load(); berr != nil {
				err = fmt.Errorf("read the request body: %w", *berr)
			}
			return nil, err
		}
		if resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			continue
		}
		pc.tc.SetReadDeadline(time.Time{})
		return resp, nil
	}
}

// write sends req whole.
func (pc *plainConn) write(req *http.Request) error {
	if err := req.Write(pc.bw); err != nil {
		return err
	}
	return pc.bw.Flush()
}

// requestSent reports whether the request was written whole. One still
// being written when its answer has ended leaves the connection unfit
// for another.
func (pc *plainConn) requestSent() bool {
	if pc.sent == nil {
		return true
	}
	select {
	case err := <-pc.sent:
		return err == nil
	default:
		return false
	}
}

// upBody is a request body on its way to a plain upstream. When it fails
// to read, the exchange stops waiting for the answer.
type upBody struct {
	io.ReadCloser
	pc *plainConn
}

func (b *upBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		b.pc.bodyErr.CompareAndSwap(nil, &err)
		b.pc.tc.SetReadDeadline(time.Unix(1, 0))
	}
	return n, err
}

// plainPool keeps a jail's idle upstream connections for plain HTTP, per
// host:port.
type plainPool struct {
	mu     sync.Mutex
	idle   map[string][]*plainConn
	closed bool
	// gen counts closeIdle calls: a connection dialed before the last
	// one (under an earlier policy) is not kept once its request ends.
	gen uint64
}

// get returns an idle connection to key that is still usable, or nil.
func (p *plainPool) get(key string) *plainConn {
	for {
		p.mu.Lock()
		l := p.idle[key]
		if len(l) == 0 {
			p.mu.Unlock()
			return nil
		}
		pc := l[len(l)-1]
		p.idle[key] = l[:len(l)-1]
		p.mu.Unlock()
		if time.Since(pc.idle) < plainIdleTimeout && pc.alive() {
			return pc
		}
		pc.tc.Close()
	}
}

// put keeps pc for reuse, or closes it when the pool is full or closed.
func (p *plainPool) put(pc *plainConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || pc.gen != p.gen || len(p.idle[pc.key]) >= plainIdlePerHost {
		pc.tc.Close()
		return
	}
	if p.idle == nil {
		p.idle = map[string][]*plainConn{}
	}
	pc.idle = time.Now()
	p.idle[pc.key] = append(p.idle[pc.key], pc)
}

// generation returns the pool's current generation.
func (p *plainPool) generation() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gen
}

// closeIdle closes every idle connection; with final, the pool keeps no
// connection from then on.
func (p *plainPool) closeIdle(final bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.idle {
		for _, pc := range l {
			pc.tc.Close()
		}
	}
	p.idle = nil
	p.gen++
	p.closed = p.closed || final
}

// plainRoundTrip sends req to host:port over an idle connection of the
// jail's or a new one its policy allows, and returns the response head.
// The caller reads the body from the returned connection and then calls
// releasePlain. A request that found a reused connection closed by the
// upstream is sent again on another when that is safe.
func (m *Manager) plainRoundTrip(ctx context.Context, js *jailState, req *http.Request, host string, port int) (*http.Response, *plainConn, error) {
	key := net.JoinHostPort(host, strconv.Itoa(port))
	for {
		pc := js.up.plain.get(key)
		reused := pc != nil
		if !reused {
			gen := js.up.plain.generation() // before the dial, which obeys the policy of that moment
			c, _, err := m.dialAllowed(ctx, js, host, netip.Addr{}, port)
			if err != nil {
				return nil, nil, err
			}
			tc, ok := c.(*net.TCPConn)
			if !ok {
				c.Close()
				return nil, nil, fmt.Errorf("upstream %s: not a TCP connection", key)
			}
			pc = &plainConn{tc: tc, br: bufio.NewReaderSize(tc, 64<<10), bw: bufio.NewWriterSize(tc, 64<<10), key: key, gen: gen}
		}
		resp, err := pc.exchange(ctx, req)
		if err == nil {
			return resp, pc, nil
		}
		pc.stop()
		pc.tc.Close()
		if !reused || !replayable(req, err) || ctx.Err() != nil {
			return nil, nil, err
		}
	}
}

// replayable reports whether req, which failed with err on a kept-alive
// connection, may be sent again: it has no body to have been consumed, its
// method is idempotent, and the failure is the upstream having closed the
// connection.
func replayable(req *http.Request, err error) bool {
	if req.Body != nil && req.Body != http.NoBody {
		return false
	}
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
	default:
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// releasePlain returns pc to the jail's pool when complete says its
// response was read to the end and the exchange allows another; it
// closes pc otherwise.
func (js *jailState) releasePlain(pc *plainConn, complete bool) {
	if !pc.stop() || !complete || pc.br.Buffered() > 0 || !pc.requestSent() {
		pc.tc.Close()
		return
	}
	pc.tc.SetDeadline(time.Time{})
	js.up.plain.put(pc)
}

// copyPlainBody writes the body of resp, read from pc, to w, and reports
// the bytes written and whether the body was read to its end. A body of
// known length is spliced from the upstream socket after the bytes the
// reader had already buffered.
func copyPlainBody(w http.ResponseWriter, resp *http.Response, pc *plainConn) (int64, bool, error) {
	if resp.Body == http.NoBody {
		return 0, true, nil
	}
	if resp.ContentLength <= 0 || len(resp.TransferEncoding) > 0 {
		n, err := copyBody(w, resp.Body)
		return n, err == nil, err
	}
	k := min(int64(pc.br.Buffered()), resp.ContentLength)
	n, err := io.CopyN(struct{ io.Writer }{w}, pc.br, k)
	if err != nil {
		return n, false, err
	}
	// The server's ReadFrom hands the socket-to-socket copy to the jail's
	// connection (clientConn.ReadFrom), which splices.
	rest := &io.LimitedReader{R: pc.tc, N: resp.ContentLength - k}
	m, err := io.Copy(w, rest)
	n += m
	if err == nil && rest.N > 0 {
		err = io.ErrUnexpectedEOF
	}
	return n, err == nil, err
}
