package api

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"time"

	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
)

// JailList is the body of GET /jails.
type JailList struct {
	Jails []*model.Jail `json:"jails"`
}

// StopRequest is the optional body of POST /jails/{id}/stop.
type StopRequest struct {
	// TimeoutS is the grace period in seconds before the jail's processes
	// are killed (default 10; 0 kills at once).
	TimeoutS *int64 `json:"timeout_s,omitempty"`
}

// maxStopTimeoutS bounds StopRequest.TimeoutS.
const maxStopTimeoutS = 3600

func (s *server) health(w http.ResponseWriter, r *http.Request) error {
	h := s.svc.Health(r.Context())
	status := http.StatusOK
	if h.Status != "ok" {
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, h)
	return nil
}

func (s *server) createJail(w http.ResponseWriter, r *http.Request) error {
	var req model.CreateRequest
	if err := decodeBody(w, r, &req, true, false); err != nil {
		return err
	}
	j, err := s.svc.Create(r.Context(), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, j)
	return nil
}

func (s *server) listJails(w http.ResponseWriter, r *http.Request) error {
	js, err := s.svc.List(r.Context())
	if err != nil {
		return err
	}
	if js == nil {
		js = []*model.Jail{}
	}
	writeJSON(w, http.StatusOK, JailList{Jails: js})
	return nil
}

func (s *server) getJail(w http.ResponseWriter, r *http.Request) error {
	j, err := s.svc.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, j)
	return nil
}

func (s *server) startJail(w http.ResponseWriter, r *http.Request) error {
	j, err := s.svc.Start(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, j)
	return nil
}

func (s *server) stopJail(w http.ResponseWriter, r *http.Request) error {
	var req StopRequest
	if err := decodeBody(w, r, &req, false, true); err != nil {
		return err
	}
	grace := DefaultStopTimeout
	if t := req.TimeoutS; t != nil {
		if *t < 0 || *t > maxStopTimeoutS {
			return errdefs.Unprocessablef("timeout_s: %d is outside 0..%d seconds", *t, maxStopTimeoutS)
		}
		grace = time.Duration(*t) * time.Second
	}
	j, err := s.svc.Stop(r.Context(), r.PathValue("id"), grace)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, j)
	return nil
}

func (s *server) destroyJail(w http.ResponseWriter, r *http.Request) error {
	if err := s.svc.Destroy(r.Context(), r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// decodeBody decodes r's body (at most MaxJSONBody bytes) strictly into v:
// unknown keys, trailing data and type mismatches are ErrInvalid naming the
// field. allowYAML accepts Content-Type application/yaml; allowEmpty
// leaves v untouched when the body is empty.
func decodeBody(w http.ResponseWriter, r *http.Request, v any, allowYAML, allowEmpty bool) error {
	yaml := false
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil {
			return errdefs.Invalidf("Content-Type %q: %v", ct, err)
		}
		// Any other type (curl's default form type included) is read as
		// JSON: the body decides, and a non-JSON body fails to decode.
		if mt == "application/yaml" || mt == "application/x-yaml" || mt == "text/yaml" {
			if !allowYAML {
				return errdefs.Invalidf("Content-Type %q: this route takes application/json", mt)
			}
			yaml = true
		}
	}
	if r.ContentLength > MaxJSONBody {
		return errdefs.New(errdefs.ErrTooLarge, "request body: %d bytes is over the limit of %d bytes", r.ContentLength, MaxJSONBody)
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxJSONBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errdefs.New(errdefs.ErrTooLarge, "request body: over the limit of %d bytes", MaxJSONBody)
		}
		return errdefs.Wrap(errdefs.ErrInvalid, err, "request body")
	}
	if len(data) == 0 && allowEmpty {
		return nil
	}
	if yaml {
		err = config.DecodeYAML(data, v)
	} else {
		err = config.DecodeJSON(data, v)
	}
	if err != nil {
		return fmt.Errorf("request body: %w", err)
	}
	return nil
}
