package jail

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/image"
)

// RegistryCacheHost is the name under which jails whose policy has
// registry_cache reach the daemon's pull-through registry cache.
const RegistryCacheHost = "registry.agentjail"

// regCache is the registry cache's listener on loopback, reached by jails
// through a route of their policy (the proxy adds the token).
type regCache struct {
	addr, token string
	srv         *http.Server
}

// regCacheSettings are remembered in DATA_DIR/registry-cache.json so
// that the routes in jails' configs stay valid across restarts.
type regCacheSettings struct {
	Addr  string `json:"addr"`
	Token string `json:"token"`
}

// startRegistryCache serves the image store's registry cache on the
// loopback address it used before (a new one the first time).
func (m *Manager) startRegistryCache() error {
	path := filepath.Join(m.opts.DataDir, "registry-cache.json")
	var st regCacheSettings
	if data, err := os.ReadFile(path); err == nil {
		if err := json.Unmarshal(data, &st); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	if st.Token == "" {
		b := make([]byte, 24)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		st.Token = hex.EncodeToString(b)
	}
	addr := st.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil && st.Addr != "" {
		// The port went to someone else: take a new one (jails made
		// before get theirs at their next network update).
		ln, err = net.Listen("tcp", "127.0.0.1:0")
	}
	if err != nil {
		return fmt.Errorf("registry cache: %w", err)
	}
	st.Addr = ln.Addr().String()
	data, _ := json.Marshal(st)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("registry cache: %w", err)
	}
	srv := &http.Server{Handler: m.images.RegistryHandler(st.Token), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.log.Error("registry cache", "err", err)
		}
	}()
	m.regCache = &regCache{addr: st.Addr, token: st.Token, srv: srv}
	return nil
}

// applyRegistryCache gives a network with registry_cache the route to the
// cache and its token, and takes them from one without.
func (m *Manager) applyRegistryCache(n *config.Network) {
	n.Routes = slices.DeleteFunc(n.Routes, func(r config.Route) bool { return r.Host == RegistryCacheHost })
	n.Credentials = slices.DeleteFunc(n.Credentials, func(c config.Credential) bool { return c.Host == RegistryCacheHost })
	var cacheRules []config.EgressRule
	if m.regCache != nil {
		host, port, _ := net.SplitHostPort(m.regCache.addr)
		p, _ := strconv.Atoi(port)
		cacheRules = []config.EgressRule{{Destination: RegistryCacheHost, Ports: []int{80}}, {Destination: host, Ports: []int{p}}}
	}
	n.AllowedEgress = slices.DeleteFunc(n.AllowedEgress, func(r config.EgressRule) bool {
		return r.Destination == RegistryCacheHost || (len(cacheRules) > 1 && r.Destination == cacheRules[1].Destination && slices.Equal(r.Ports, cacheRules[1].Ports))
	})
	if !n.RegistryCache || m.regCache == nil {
		return
	}
	// The proxy sends the jail's requests for the cache's name to the
	// cache's loopback listener, which the rules let it reach.
	n.AllowedEgress = append(n.AllowedEgress, cacheRules...)
	n.Routes = append(n.Routes, config.Route{Host: RegistryCacheHost, URL: "http://" + m.regCache.addr})
	n.Credentials = append(n.Credentials, config.Credential{Host: RegistryCacheHost, Header: image.CacheHeader, Value: m.regCache.token})
}
