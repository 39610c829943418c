package netpolicy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// WebSocket through the proxies: a request that asks to upgrade to
// "websocket" keeps its Upgrade and Connection headers on the way up; when
// the upstream switches protocols, the proxy answers the jail with the
// upstream's 101 and relays both ways until either side closes. The
// request was decided, rate-limited and is recorded like any other
// (status 101, the bytes of the whole exchange, its duration); its bytes
// are charged to the jail's budget when it ends.

// wantsWebSocket reports whether a request asks to upgrade to WebSocket.
func wantsWebSocket(h http.Header) bool {
	if !strings.EqualFold(strings.TrimSpace(h.Get("Upgrade")), "websocket") {
		return false
	}
	for _, v := range h["Connection"] {
		for _, tok := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "upgrade") {
				return true
			}
		}
	}
	return false
}

// relayUpgrade answers the jail with the upstream's 101 resp and relays
// the upgraded connection: pc's socket for plain HTTP, else the body of
// resp (an io.ReadWriteCloser from http.Transport). It returns the bytes
// the upstream sent (in) and the jail sent (out) after the head.
func (m *Manager) relayUpgrade(w http.ResponseWriter, resp *http.Response, pc *plainConn) (in, out int64, err error) {
	var up io.ReadWriteCloser
	var upR io.Reader
	if pc != nil {
		pc.stop() // the upgraded connection outlives the request's context
		pc.tc.SetDeadline(time.Time{})
		up, upR = pc.tc, io.MultiReader(io.LimitReader(pc.br, int64(pc.br.Buffered())), pc.tc)
	} else {
		rwc, ok := resp.Body.(io.ReadWriteCloser)
		if !ok {
			resp.Body.Close()
			http.Error(w, "agentjail: the upstream switched protocols without a connection", http.StatusBadGateway)
			return 0, 0, errors.New("upgrade: the upstream's response holds no connection")
		}
		up, upR = rwc, rwc
	}
	defer up.Close()
	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "agentjail: this connection cannot be upgraded", http.StatusInternalServerError)
		return 0, 0, errors.New("upgrade: the jail's connection cannot be taken over")
	}
	c, rw, err := hj.Hijack()
	if err != nil {
		return 0, 0, fmt.Errorf("upgrade: %w", err)
	}
	defer c.Close()
	c.SetDeadline(time.Time{})
	// The 101 head as the upstream sent it, less the hop-by-hop headers
	// other than the upgrade's own.
	h := resp.Header.Clone()
	conn, upg := h.Get("Connection"), h.Get("Upgrade")
	stripHop(h)
	h.Set("Connection", conn)
	h.Set("Upgrade", upg)
	fmt.Fprintf(rw, "HTTP/1.1 101 %s\r\n", http.StatusText(http.StatusSwitchingProtocols))
	if err := h.Write(rw); err != nil {
		return 0, 0, fmt.Errorf("upgrade: %w", err)
	}
	if _, err := rw.WriteString("\r\n"); err != nil {
		return 0, 0, fmt.Errorf("upgrade: %w", err)
	}
	if err := rw.Flush(); err != nil {
		return 0, 0, fmt.Errorf("upgrade: %w", err)
	}
	return relayBoth(c, rw.Reader, up, upR)
}

// relayBoth copies the jail's side (c, with what jr already buffered) to up
// and upR to c until both directions end; closing one direction half-
// closes the other side's write when it can.
func relayBoth(c net.Conn, jr *bufio.Reader, up io.ReadWriteCloser, upR io.Reader) (in, out int64, err error) {
	var wg sync.WaitGroup
	var inErr error
	wg.Go(func() {
		in, inErr = io.Copy(c, upR)
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			c.Close()
		}
	})
	out, err = io.Copy(up, io.MultiReader(io.LimitReader(jr, int64(jr.Buffered())), c))
	if cw, ok := up.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	} else {
		up.Close()
	}
	wg.Wait()
	if err == nil {
		err = inErr
	}
	return in, out, err
}
