package netpolicy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
)

// services are the daemon's listeners on the daemon address.
type services struct {
	listeners []net.Listener
	udp       net.PacketConn
	http      *http.Server
	httpLn    *chanListener
	nflog     io.Closer
}

// connInfo describes a client connection handed to the HTTP server.
type connInfo struct {
	js      *jailState
	via     string
	orig    netip.AddrPort // original destination (transparent)
	tlsHost string         // inspected TLS: the name the client asked for
	// plainTunnel: a tunnel to a routed name carrying plain HTTP, read
	// as transparent HTTP (by Host header) once the tunnel is granted.
	plainTunnel bool
	tlsPort     int
	src         string
	handshake   time.Time
	// pid and comm own the jail's end of the connection (0, "" unknown).
	pid  int
	comm string
}

// clientConn is a connection from a jail, with what the daemon knows of it.
// It is counted against the jail's bound until it is closed.
type clientConn struct {
	net.Conn
	info    *connInfo
	r       io.Reader // replays peeked bytes, then reads Conn
	release sync.Once
	m       *Manager
}

// Close closes the connection and uncounts it.
func (c *clientConn) Close() error {
	c.release.Do(func() { c.m.releaseConn(c.info.js) })
	return c.Conn.Close()
}

func (c *clientConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// ReadFrom writes what r yields to the jail; from an upstream TCP socket
// (bounded by an io.LimitedReader) the kernel splices it.
func (c *clientConn) ReadFrom(r io.Reader) (int64, error) {
	if tc, ok := c.Conn.(*net.TCPConn); ok {
		return tc.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

// chanListener feeds connections to the HTTP server.
type chanListener struct {
	ch     chan net.Conn
	addr   net.Addr
	closed chan struct{}
	once   sync.Once
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error   { l.once.Do(func() { close(l.closed) }); return nil }
func (l *chanListener) Addr() net.Addr { return l.addr }

func (l *chanListener) push(c net.Conn) {
	select {
	case l.ch <- c:
	case <-l.closed:
		c.Close()
	}
}

type connKey struct{}

func (m *Manager) startServices(ctx context.Context) error {
	s := &services{}
	m.srv = s
	host := m.daemon.String()
	listen := func(port int, serve func(net.Conn)) error {
		lc := net.ListenConfig{Control: unpaced}
		ln, err := lc.Listen(ctx, "tcp4", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return fmt.Errorf("listening on %s:%d: %w", host, port, err)
		}
		s.listeners = append(s.listeners, ln)
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.acceptLoop(ln, serve)
		}()
		return nil
	}
	s.httpLn = &chanListener{ch: make(chan net.Conn), closed: make(chan struct{}),
		addr: &net.TCPAddr{IP: m.daemon.AsSlice(), Port: m.ports.Proxy}}
	s.http = &http.Server{
		Handler:           http.HandlerFunc(m.serveHTTP),
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          log.New(io.Discard, "", 0),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if tc, ok := c.(*tls.Conn); ok {
				c = tc.NetConn()
			}
			if cc, ok := c.(*clientConn); ok {
				return context.WithValue(ctx, connKey{}, cc.info)
			}
			return ctx
		},
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		_ = s.http.Serve(s.httpLn)
	}()
	for _, l := range []struct {
		port  int
		serve func(net.Conn)
	}{
		{m.ports.HTTP, m.serveTransparentHTTP},
		{m.ports.TLS, m.serveTransparentTLS},
		{m.ports.Proxy, m.serveExplicitHTTP},
		{m.ports.SOCKS, m.serveSOCKS},
		{m.ports.DNS, m.serveDNSStream},
	} {
		if err := listen(l.port, l.serve); err != nil {
			return err
		}
	}
	udp, err := net.ListenPacket("udp4", net.JoinHostPort(host, strconv.Itoa(m.ports.DNS)))
	if err != nil {
		return fmt.Errorf("listening on %s:%d/udp: %w", host, m.ports.DNS, err)
	}
	s.udp = udp
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.serveDNSPackets(udp)
	}()
	nl, err := m.startNflog()
	if err != nil {
		return err
	}
	s.nflog = nl
	return nil
}

func (m *Manager) stopServices() {
	s := m.srv
	if s == nil {
		return
	}
	for _, l := range s.listeners {
		l.Close()
	}
	if s.udp != nil {
		s.udp.Close()
	}
	if s.http != nil {
		s.http.Close()
		s.httpLn.Close()
	}
	if s.nflog != nil {
		s.nflog.Close()
	}
}

// acceptLoop accepts connections from attached jails; others are closed.
func (m *Manager) acceptLoop(ln net.Listener, serve func(net.Conn)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			m.log.Warn("accept", "addr", ln.Addr(), "err", err)
			select {
			case <-m.closing:
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		go serve(c)
	}
}

// unpaced makes the connections a listener accepts (they come from jails)
// use cubic congestion control. The link to a jail is a veth on this host,
// where a pacing congestion control (the host's default may be BBR) only
// adds idle time. Best effort: without cubic the host's default stays.
func unpaced(network, address string, c syscall.RawConn) error {
	return c.Control(func(fd uintptr) {
		_ = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, "cubic")
	})
}

// clientOf wraps an accepted connection with the jail it comes from, or
// closes it and returns nil when no attached jail has its address, or the
// jail or the daemon holds as many connections as it may (see conns.go).
// The caller closes the clientConn it returns.
func (m *Manager) clientOf(c net.Conn, via string) *clientConn {
	ap, err := netip.ParseAddrPort(c.RemoteAddr().String())
	var js *jailState
	if err == nil {
		js = m.jailByAddr(ap.Addr())
	}
	if js == nil {
		c.Close()
		return nil
	}
	dst := addressed(c)
	if why, ok := m.holdConn(js); !ok {
		m.refuseConn(js, c, via, ap, dst, why)
		return nil
	}
	info := &connInfo{js: js, via: via, src: ap.String()}
	if m.o.Owner != nil {
		info.pid, info.comm = m.o.Owner(js.id, "tcp", ap, dst)
	}
	return &clientConn{Conn: c, r: c, info: info, m: m}
}

// addressed is the destination a jail's connection had in the jail: the
// original one of a redirected connection, else the daemon's address it
// reached (not valid when neither is known).
func addressed(c net.Conn) netip.AddrPort {
	if ap, err := originalDst(c); err == nil {
		return ap
	}
	ap, _ := netip.ParseAddrPort(c.LocalAddr().String())
	return ap
}

// originalDst returns the destination a redirected connection had.
func originalDst(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, errors.New("not a TCP connection")
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var ap netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		var mr *unix.IPv6Mreq
		mr, serr = unix.GetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IP, unix.SO_ORIGINAL_DST)
		if serr == nil {
			b := mr.Multiaddr
			ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), uint16(b[2])<<8|uint16(b[3]))
		}
	})
	if err != nil {
		return ap, err
	}
	return ap, serr
}

func (m *Manager) serveTransparentHTTP(c net.Conn) {
	cc := m.clientOf(c, ViaTransparent)
	if cc == nil {
		return
	}
	orig, err := originalDst(c)
	if err != nil {
		m.log.Warn("transparent http: original destination", "err", err)
		cc.Close()
		return
	}
	cc.info.orig = orig
	m.srv.httpLn.push(cc)
}

func (m *Manager) serveExplicitHTTP(c net.Conn) {
	if cc := m.clientOf(c, ViaHTTPProxy); cc != nil {
		m.srv.httpLn.push(cc)
	}
}

func (m *Manager) serveTransparentTLS(c net.Conn) {
	cc := m.clientOf(c, ViaTransparent)
	if cc == nil {
		return
	}
	orig, err := originalDst(c)
	if err != nil {
		m.log.Warn("transparent tls: original destination", "err", err)
		cc.Close()
		return
	}
	cc.info.orig = orig
	c.SetReadDeadline(time.Now().Add(15 * time.Second))
	sni, peeked, err := peekSNI(c)
	c.SetReadDeadline(time.Time{})
	cc.r = io.MultiReader(bytes.NewReader(peeked), c)
	host := sni
	if err != nil {
		// Not TLS or truncated: decide by address; the stream is passed
		// through unchanged when allowed.
		host = ""
	}
	m.tunnel(cc, host, orig.Addr(), int(orig.Port()), nil)
}

// peekSNI reads a TLS ClientHello from c and returns its server name and
// the bytes read (to be replayed).
func peekSNI(c net.Conn) (string, []byte, error) {
	var buf bytes.Buffer
	var sni string
	errStop := errors.New("hello read")
	srv := tls.Server(readOnlyConn{r: io.TeeReader(c, &buf)}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			sni = h.ServerName
			return nil, errStop
		},
	})
	err := srv.Handshake()
	if errors.Is(err, errStop) {
		err = nil
	}
	return strings.ToLower(sni), buf.Bytes(), err
}

// readOnlyConn lets crypto/tls read a ClientHello without answering it.
type readOnlyConn struct{ r io.Reader }

func (c readOnlyConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (readOnlyConn) Write(p []byte) (int, error)        { return 0, io.ErrClosedPipe }
func (readOnlyConn) Close() error                       { return nil }
func (readOnlyConn) LocalAddr() net.Addr                { return nil }
func (readOnlyConn) RemoteAddr() net.Addr               { return nil }
func (readOnlyConn) SetDeadline(time.Time) error        { return nil }
func (readOnlyConn) SetReadDeadline(time.Time) error    { return nil }
func (readOnlyConn) SetWriteDeadline(t time.Time) error { return nil }

// tunnelReply answers the client's tunnel request (CONNECT, SOCKS5) once
// the outcome is known: err is nil on success.
type tunnelReply func(d Decision, verdict string, err error) error

// tunnel carries a TCP stream from a jail to host (or orig when host is
// empty) on port, after the policy allowed it: inspected when the policy
// says so and the port is 443, else spliced and recorded.
func (m *Manager) tunnel(cc *clientConn, host string, orig netip.Addr, port int, reply tunnelReply) {
	js := cc.info.js
	start := time.Now()
	ev := ConnEvent{Via: cc.info.via, Proto: "tcp", Src: cc.info.src, Host: host, Port: port, Pid: cc.info.pid, Comm: cc.info.comm}
	if orig.IsValid() {
		ev.Dst = netip.AddrPortFrom(orig, uint16(port)).String()
	}
	if port == 443 {
		ev.Proto = "tls"
	}
	finish := func(verdict string, d Decision, err error) {
		ev.Verdict, ev.Rule = verdict, d.Rule
		if err != nil {
			ev.Error = err.Error()
		}
		ev.DurNS = time.Since(start).Nanoseconds()
		m.record(js.id, ev)
	}
	refuse := func(verdict string, d Decision, err error) {
		if reply != nil {
			reply(d, verdict, err)
		} else if tc, ok := cc.Conn.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		cc.Close()
		finish(verdict, d, err)
	}
	d := m.decide(js, Target{Host: host, IP: orig, Port: port, Proto: ProtoTCP})
	if host != "" {
		d = m.decide(js, Target{Host: host, Port: port, Proto: ProtoTCP})
	}
	if !d.Allow {
		refuse(VerdictBlock, d, nil)
		return
	}
	if lim := m.admit(js); lim != "" {
		refuse(VerdictLimit, Decision{Rule: lim}, nil)
		return
	}
	if port != 443 && host != "" && js.hasRoute(host) {
		// Plain HTTP to a routed name through a tunnel (clients that
		// CONNECT even for http:// URLs): the proxy reads the requests
		// and sends them where the route says.
		if reply != nil {
			if err := reply(d, VerdictAllow, nil); err != nil {
				cc.Close()
				return
			}
		}
		cc.info.orig = netip.AddrPortFrom(RoutedAddr, uint16(port))
		cc.info.plainTunnel = true
		m.srv.httpLn.push(cc)
		return
	}
	if port == 443 && host != "" && js.pol().inspect(host) {
		if reply != nil {
			if err := reply(d, VerdictAllow, nil); err != nil {
				cc.Close()
				return
			}
		}
		m.inspectTLS(cc, host, port)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	up, dd, err := m.dialAllowed(ctx, js, host, orig, port)
	cancel()
	if err != nil {
		verdict := VerdictError
		if errors.Is(err, errdefs.ErrForbidden) {
			verdict, d = VerdictBlock, dd
		}
		refuse(verdict, d, err)
		return
	}
	ev.Dst = up.RemoteAddr().String()
	if reply != nil {
		if err := reply(d, VerdictAllow, nil); err != nil {
			up.Close()
			cc.Close()
			finish(VerdictError, d, err)
			return
		}
	}
	ev.BytesOut, ev.BytesIn = splice(cc, up)
	m.spend(js, ev.BytesOut+ev.BytesIn)
	finish(VerdictAllow, d, nil)
}

// splice copies both ways until both directions end, and returns the
// bytes sent by the client and by the upstream.
func splice(client *clientConn, up net.Conn) (out, in int64) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		in, _ = io.Copy(client.Conn, up)
		if tc, ok := client.Conn.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
	}()
	if r, ok := client.r.(*net.TCPConn); ok {
		out, _ = io.Copy(up, r)
	} else {
		out, _ = io.Copy(up, client.r)
	}
	if tc, ok := up.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	wg.Wait()
	client.Close()
	up.Close()
	return out, in
}

// inspectTLS terminates the client's TLS with a leaf of the daemon CA and
// hands the decrypted connection to the HTTP server.
func (m *Manager) inspectTLS(cc *clientConn, host string, port int) {
	js := cc.info.js
	cfg := &tls.Config{
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
			name := host
			if h.ServerName != "" {
				name = strings.ToLower(h.ServerName)
			}
			return m.ca.leaf(name)
		},
	}
	tc := tls.Server(cc, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	err := tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		m.record(js.id, ConnEvent{Via: cc.info.via, Proto: "tls", Src: cc.info.src, Host: host, Port: port, Pid: cc.info.pid, Comm: cc.info.comm,
			Verdict: VerdictError, Rule: "tls_inspection", Inspected: true,
			Error: "TLS inspection: the client refused the daemon's certificate (does it trust the agentjail CA?): " + err.Error()})
		tc.Close()
		return
	}
	cc.info.tlsHost, cc.info.tlsPort, cc.info.handshake = host, port, time.Now()
	m.srv.httpLn.push(tc)
}

// dialAllowed connects to host (resolved by the daemon) or, when host is
// empty or an address, to addr; every address is checked against the
// policy first. A refusal is an errdefs.ErrForbidden error, with the
// Decision that refused.
func (m *Manager) dialAllowed(ctx context.Context, js *jailState, host string, addr netip.Addr, port int) (net.Conn, Decision, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		addr, host = a, ""
	}
	var cands []netip.Addr
	if host == "" {
		if !addr.IsValid() {
			return nil, Decision{Rule: "default"}, errdefs.Forbiddenf("no destination")
		}
		cands = []netip.Addr{addr}
	} else {
		ips, err := m.o.Resolver.LookupNetIP(ctx, "ip", host)
		if err != nil {
			return nil, Decision{}, fmt.Errorf("resolving %s: %w", host, err)
		}
		cands = ips
	}
	var d Decision
	var lastErr error
	var dialer net.Dialer
	for _, ip := range cands {
		d = m.decide(js, Target{Host: host, IP: ip, Port: port, Proto: ProtoTCP})
		if !d.Allow {
			lastErr = errdefs.Forbiddenf("%s (%s) refused by rule %s", host, ip, d.Rule)
			continue
		}
		c, err := dialer.DialContext(ctx, "tcp", netip.AddrPortFrom(ip.Unmap(), uint16(port)).String())
		if err == nil {
			return c, d, nil
		}
		lastErr = err
	}
	if lastErr == nil {
		lastErr = fmt.Errorf("%s: no addresses", host)
	}
	return nil, d, lastErr
}

// upstream is a jail's HTTP client side: a transport whose every dial is
// checked against the jail's policy.
type upstream struct {
	transport *http.Transport // TLS upstreams
	plain     plainPool       // plain HTTP upstreams
}

func (m *Manager) newUpstream(js *jailState) *upstream {
	t := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			h, p, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			port, _ := strconv.Atoi(p)
			c, _, err := m.dialAllowed(ctx, js, h, netip.Addr{}, port)
			return c, err
		},
		TLSClientConfig:       &tls.Config{RootCAs: m.o.UpstreamRoots},
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   15 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute,
		DisableCompression:    true,
		ReadBufferSize:        64 << 10,
		WriteBufferSize:       64 << 10,
	}
	return &upstream{transport: t}
}

// closeIdle closes the idle upstream connections: after a policy change
// new requests connect anew; with final (the jail is gone) none is kept
// from then on.
func (u *upstream) closeIdle(final bool) {
	u.transport.CloseIdleConnections()
	u.plain.closeIdle(final)
}

func (js *jailState) limiter() *limiter {
	js.mu.Lock()
	defer js.mu.Unlock()
	return js.limits
}

// flushWriter flushes every write to the client.
type flushWriter struct{ http.ResponseWriter }

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.ResponseWriter.Write(p)
	if err == nil {
		err = http.NewResponseController(f.ResponseWriter).Flush()
	}
	return n, err
}

// copyBufs are the buffers response bodies are copied through.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// copyBody copies a response body to w through a 256 KiB buffer (not the
// server's 32 KiB ReadFrom path).
func copyBody(w io.Writer, body io.Reader) (int64, error) {
	buf := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(buf)
	return io.CopyBuffer(struct{ io.Writer }{w}, body, *buf)
}

// hopHeaders are not forwarded.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func stripHop(h http.Header) {
	for _, f := range h["Connection"] {
		for _, k := range strings.Split(f, ",") {
			h.Del(strings.TrimSpace(k))
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
}

// countingReader counts what is read through it.
type countingReader struct {
	r io.ReadCloser
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func (c *countingReader) Close() error { return c.r.Close() }

// serveHTTP proxies one HTTP request from a jail (transparent, explicit
// or decrypted by inspection).
func (m *Manager) serveHTTP(w http.ResponseWriter, r *http.Request) {
	ci, _ := r.Context().Value(connKey{}).(*connInfo)
	if ci == nil {
		http.Error(w, "agentjail: unknown client", http.StatusForbidden)
		return
	}
	js := ci.js
	if r.Method == http.MethodConnect {
		if ci.via != ViaHTTPProxy || ci.tlsHost != "" {
			http.Error(w, "agentjail: CONNECT only on the proxy port", http.StatusMethodNotAllowed)
			return
		}
		m.serveConnect(w, r, ci)
		return
	}
	// The request body goes on to the upstream while its answer streams
	// back: the server must not drain and close that body when the answer's
	// head is written (HTTP/1 does unless told), or the head waits for the
	// body's end and the transport's last read of the body can fail.
	_ = http.NewResponseController(w).EnableFullDuplex()
	start := time.Now()
	scheme, via := "http", ci.via
	var host string
	var port int
	switch {
	case ci.tlsHost != "":
		scheme, port = "https", ci.tlsPort
		host = hostOnly(r.Host)
		if host == "" {
			host = ci.tlsHost
		}
	case ci.via == ViaTransparent || ci.plainTunnel:
		host, port = hostOnly(r.Host), int(ci.orig.Port())
		if host == "" {
			host = ci.orig.Addr().String()
		}
	default:
		if !r.URL.IsAbs() || r.URL.Scheme != "http" {
			http.Error(w, "agentjail: the proxy takes absolute http:// URIs and CONNECT", http.StatusBadRequest)
			return
		}
		host, port = strings.ToLower(r.URL.Hostname()), 80
		if p := r.URL.Port(); p != "" {
			port, _ = strconv.Atoi(p)
		}
	}
	ev := ConnEvent{Via: via, Proto: scheme, Src: ci.src, Host: host, Port: port, Method: r.Method, Pid: ci.pid, Comm: ci.comm,
		Path: r.URL.Path, Inspected: ci.tlsHost != ""}
	finish := func(verdict, rule string, err error) {
		ev.Verdict, ev.Rule, ev.DurNS = verdict, rule, time.Since(start).Nanoseconds()
		if err != nil {
			ev.Error = err.Error()
		}
		m.record(js.id, ev)
	}
	d := m.decide(js, Target{Host: host, Port: port, Proto: ProtoTCP})
	if !d.Allow {
		ev.Status = http.StatusForbidden
		http.Error(w, fmt.Sprintf("agentjail: %s refused by network policy (rule %s)", host, d.Rule), http.StatusForbidden)
		finish(VerdictBlock, d.Rule, nil)
		return
	}
	if lim := m.admit(js); lim != "" {
		ev.Status = http.StatusTooManyRequests
		http.Error(w, "agentjail: rate limit exceeded ("+lim+")", http.StatusTooManyRequests)
		finish(VerdictLimit, lim, nil)
		return
	}
	out := r.Clone(r.Context())
	out.RequestURI = ""
	upScheme, upHost, upPort := scheme, host, port
	if rt, ok := js.pol().routeFor(host); ok {
		u, _ := config.ParseRouteURL(rt.URL) // checked when the policy was compiled
		upScheme, upHost = u.Scheme, strings.ToLower(u.Hostname())
		upPort = 80
		if upScheme == "https" {
			upPort = 443
		}
		if p := u.Port(); p != "" {
			upPort, _ = strconv.Atoi(p)
		}
		out.URL.Path = strings.TrimSuffix(u.Path, "/") + out.URL.Path
		out.URL.RawPath = ""
		out.Host = ""
		ev.Upstream = u.Scheme + "://" + u.Host + strings.TrimSuffix(u.Path, "/")
	}
	out.URL.Scheme = upScheme
	out.URL.Host = net.JoinHostPort(upHost, strconv.Itoa(upPort))
	if (upScheme == "http" && upPort == 80) || (upScheme == "https" && upPort == 443) {
		out.URL.Host = upHost
	}
	if out.Host == "" {
		out.Host = out.URL.Host
	}
	out.Header = r.Header.Clone()
	upgrade := wantsWebSocket(r.Header)
	stripHop(out.Header)
	if upgrade {
		// The hop-by-hop headers of the upgrade go on to the upstream.
		out.Header.Set("Connection", "Upgrade")
		out.Header.Set("Upgrade", r.Header.Get("Upgrade"))
	}
	for _, c := range js.pol().credentialsFor(host) {
		v := c.Value
		if c.Secret != "" {
			sec, ok := "", false
			if m.o.Secrets != nil {
				sec, ok = m.o.Secrets(c.Secret)
			}
			if !ok {
				err := fmt.Errorf("the daemon holds no secret %q for the %s header of %s (set it in the daemon's environment or secrets file)", c.Secret, c.Header, host)
				ev.Status = http.StatusBadGateway
				http.Error(w, "agentjail: "+err.Error(), http.StatusBadGateway)
				finish(VerdictError, d.Rule, err)
				return
			}
			v += sec
		}
		out.Header.Set(c.Header, v)
		ev.Credentials = append(ev.Credentials, c.Header)
	}
	var body *countingReader
	if r.Body != nil && r.Body != http.NoBody {
		body = &countingReader{r: r.Body}
		out.Body = body
	}
	var resp *http.Response
	var pc *plainConn
	var err error
	if upScheme == "http" {
		resp, pc, err = m.plainRoundTrip(r.Context(), js, out, upHost, upPort)
	} else {
		resp, err = js.up.transport.RoundTrip(out)
	}
	// The request body may still be on its way while the answer comes:
	// what it sent is counted once the exchange is over.
	sent := func() int64 {
		if body == nil {
			return 0
		}
		return body.n.Load()
	}
	if err != nil {
		ev.BytesOut = sent()
		verdict, status := VerdictError, http.StatusBadGateway
		if errors.Is(err, errdefs.ErrForbidden) {
			verdict, status = VerdictBlock, http.StatusForbidden
		}
		ev.Status = status
		http.Error(w, "agentjail: "+err.Error(), status)
		finish(verdict, d.Rule, err)
		return
	}
	if upgrade && resp.StatusCode == http.StatusSwitchingProtocols {
		ev.Status = resp.StatusCode
		in, out, err := m.relayUpgrade(w, resp, pc)
		ev.BytesOut = sent() + out
		ev.BytesIn = in
		m.spend(js, ev.BytesOut+ev.BytesIn)
		finish(VerdictAllow, d.Rule, err)
		return
	}
	stripHop(resp.Header)
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	ev.Status = resp.StatusCode
	var n int64
	var cerr error
	if resp.ContentLength < 0 || len(resp.TransferEncoding) > 0 {
		// A body of unknown length may be a stream (server-sent events, a
		// model's answer): each chunk reaches the jail as it comes.
		w = flushWriter{w}
	}
	if pc != nil {
		var complete bool
		n, complete, cerr = copyPlainBody(w, resp, pc)
		js.releasePlain(pc, complete && !resp.Close && !out.Close)
	} else {
		n, cerr = copyBody(w, resp.Body)
		resp.Body.Close()
	}
	ev.BytesIn, ev.BytesOut = n, sent()
	m.spend(js, ev.BytesOut+ev.BytesIn)
	finish(VerdictAllow, d.Rule, cerr)
}

func hostOnly(hostport string) string {
	h := hostport
	if hh, _, err := net.SplitHostPort(hostport); err == nil {
		h = hh
	}
	return strings.ToLower(strings.TrimSuffix(strings.Trim(h, "[]"), "."))
}

// serveConnect handles CONNECT host:port on the explicit proxy.
func (m *Manager) serveConnect(w http.ResponseWriter, r *http.Request, ci *connInfo) {
	h, p, err := net.SplitHostPort(r.Host)
	port, perr := strconv.Atoi(p)
	if err != nil || perr != nil || port < 1 || port > 65535 {
		http.Error(w, "agentjail: CONNECT wants host:port", http.StatusBadRequest)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "agentjail: cannot tunnel", http.StatusInternalServerError)
		return
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		return
	}
	cc, ok := conn.(*clientConn)
	if !ok {
		conn.Close()
		return
	}
	// Bytes the client sent after the request head are in brw's reader.
	var rd io.Reader = cc.r
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		rd = io.MultiReader(bytes.NewReader(bytes.Clone(b)), cc.r)
	}
	// The HTTP server is done with the connection: it becomes the tunnel.
	cc.r, cc.info = rd, &connInfo{js: ci.js, via: ViaConnect, src: ci.src, pid: ci.pid, comm: ci.comm}
	host := strings.ToLower(strings.Trim(h, "[]"))
	var addr netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addr, host = a, ""
	}
	m.tunnel(cc, host, addr, port, func(d Decision, verdict string, err error) error {
		return writeConnectReply(cc.Conn, d, verdict, err)
	})
}

func writeConnectReply(c net.Conn, d Decision, verdict string, err error) error {
	var status string
	var body string
	switch {
	case verdict == VerdictAllow:
		_, werr := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
		return werr
	case verdict == VerdictBlock:
		status, body = "403 Forbidden", "agentjail: refused by network policy (rule "+d.Rule+")\n"
	case verdict == VerdictLimit:
		status, body = "429 Too Many Requests", "agentjail: rate limit exceeded ("+d.Rule+")\n"
	default:
		status, body = "502 Bad Gateway", "agentjail: "+fmt.Sprint(err)+"\n"
	}
	bw := bufio.NewWriter(c)
	fmt.Fprintf(bw, "HTTP/1.1 %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", status, len(body), body)
	return bw.Flush()
}
