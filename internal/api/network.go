package api

import (
	"io"
	"net/http"

	"github.com/agentjail/agentjail/internal/config"
)

// putNetwork replaces a jail's network policy (PUT /jails/{id}/network).
func (s *server) putNetwork(w http.ResponseWriter, r *http.Request) error {
	var n config.Network
	if err := decodeBody(w, r, &n, true, false); err != nil {
		return err
	}
	j, err := s.svc.UpdateNetwork(r.Context(), r.PathValue("id"), n)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, j)
	return nil
}

// networkLog serves the jail's network record as NDJSON
// (GET /jails/{id}/network/log).
func (s *server) networkLog(w http.ResponseWriter, r *http.Request) error {
	rc, err := s.svc.EventLog(r.Context(), r.PathValue("id"), "network")
	if err != nil {
		return err
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	_, err = io.Copy(w, rc)
	if err != nil {
		s.log.Debug("network log: client went away", "err", err)
	}
	return nil
}
