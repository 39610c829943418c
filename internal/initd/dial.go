package initd

import (
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/agentjail/agentjail/internal/initproto"
)

// dialTimeout bounds a connection to the jail's loopback.
const dialTimeout = 5 * time.Second

// dialPort serves MsgDial: it connects to req.Port of the jail's loopback
// (127.0.0.1, else ::1, where a server that listens on "localhost" may
// be), answers MsgOK and relays bytes both ways until either side ends.
// A checkpoint's preparation closes the connection (see quiesce).
func (s *Server) dialPort(c *conn, req initproto.DialRequest) error {
	if req.Port < 1 || req.Port > 65535 {
		return newError(initproto.KindInvalid, "", "port %d is not a TCP port (1-65535)", req.Port)
	}
	if !s.addDial(c) {
		return newError(initproto.KindConflict, "", "the jail is being readied for a checkpoint")
	}
	defer s.dropDial(c)
	tc, err := dialLoopback(req.Port)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return newError(initproto.KindNotFound, "", "nothing listens on port %d of the jail's loopback", req.Port)
		}
		return newError(initproto.KindInternal, "", "connect to port %d of the jail's loopback: %v", req.Port, err)
	}
	defer tc.Close()
	if err := c.sendJSON(initproto.MsgOK, initproto.DialAnswer{Addr: tc.RemoteAddr().String()}); err != nil {
		return nil
	}
	// Either side's end ends both: HTTP, the use, never half-closes.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer recoverPanic(s.log, "port relay")
		_, _ = io.Copy(tc, c.r)
		tc.Close()
		c.c.Close()
	}()
	_, _ = io.Copy(c.c, tc)
	c.c.Close()
	tc.Close()
	wg.Wait()
	return nil
}

// dialLoopback connects to port on 127.0.0.1, or on ::1 when nothing
// listens there.
func dialLoopback(port int) (net.Conn, error) {
	p := strconv.Itoa(port)
	tc, err := net.DialTimeout("tcp4", net.JoinHostPort("127.0.0.1", p), dialTimeout)
	if err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		return tc, err
	}
	if tc6, err6 := net.DialTimeout("tcp6", net.JoinHostPort("::1", p), dialTimeout); err6 == nil {
		return tc6, nil
	}
	return nil, err
}

// addDial records c as a port connection, unless a checkpoint is being
// prepared.
func (s *Server) addDial(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.quiescing > 0 || s.closing {
		return false
	}
	s.dials[c] = struct{}{}
	return true
}

// dropDial forgets a port connection.
func (s *Server) dropDial(c *conn) {
	s.mu.Lock()
	delete(s.dials, c)
	s.mu.Unlock()
}
