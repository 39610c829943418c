package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
)

// ImageService serves the image routes; *jail.Manager implements it.
type ImageService interface {
	// ListImages returns every image of the store, newest first.
	ListImages(ctx context.Context) ([]*model.Image, error)
	// ImageUsage accounts the store's disk use.
	ImageUsage(ctx context.Context) (model.ImageUsage, error)
	// GetImage returns the image ref names (a tag, an id or id prefix, or
	// a reference with a digest); ErrNotFound when the store has none.
	GetImage(ctx context.Context, ref string) (*model.Image, error)
	// PullImage pulls ref into the store, calling progress per layer
	// step. ErrInvalid for a malformed reference, ErrNotFound when the
	// registry has no such image, ErrUnprocessable for an image the store
	// refuses (the message says why); nothing of a failed pull remains.
	PullImage(ctx context.Context, ref string, auth *model.RegistryAuth, progress func(model.PullProgress)) (*model.Image, error)
	// LoadImages imports the images of the docker-archive or OCI layout
	// tar at path (ErrInvalid when it is neither).
	LoadImages(ctx context.Context, path string, progress func(model.PullProgress)) ([]*model.Image, error)
	// RemoveImage untags ref and removes the image when nothing else
	// names or uses it (ErrConflict when removing by id an image in use,
	// unless force).
	RemoveImage(ctx context.Context, ref string, force bool) (model.ImageRemoval, error)
	// PruneImages removes untagged (with all: every) unused image and
	// every layer no image references.
	PruneImages(ctx context.Context, all bool) (model.ImagePrune, error)
	// Commit writes the jail's current filesystem as a new image on top of
	// its own (ErrUnprocessable for a jail not made of an image).
	Commit(ctx context.Context, jailRef string, req model.CommitRequest) (*model.Image, error)
	// LoadDir is where uploaded archives are spooled.
	LoadDir() string
	// ListProfiles returns the built-in and user profiles.
	ListProfiles(ctx context.Context) ([]model.Profile, error)
	// PutProfile saves a user profile (base, suite, packages);
	// ErrConflict for a built-in name, ErrUnprocessable for a bad package
	// or base.
	PutProfile(ctx context.Context, p model.Profile) (model.Profile, error)
	// DeleteProfile removes a user profile.
	DeleteProfile(ctx context.Context, name string) error
	// BuildProfile returns the profile's image, building it with
	// mmdebstrap unless it is cached (ErrUnavailable when the archive
	// cannot be reached, with mmdebstrap's output).
	BuildProfile(ctx context.Context, name string) (model.ProfileBuild, error)
}

// ProfileList is the body of GET /profiles.
type ProfileList struct {
	Profiles []model.Profile `json:"profiles"`
}

func (s *server) listProfiles(w http.ResponseWriter, r *http.Request) error {
	svc, err := s.imageService()
	if err != nil {
		return err
	}
	ps, err := svc.ListProfiles(r.Context())
	if err != nil {
		return err
	}
	if ps == nil {
		ps = []model.Profile{}
	}
	writeJSON(w, http.StatusOK, ProfileList{Profiles: ps})
	return nil
}

func (s *server) putProfile(w http.ResponseWriter, r *http.Request) error {
	svc, err := s.imageService()
	if err != nil {
		return err
	}
	var p model.Profile
	if err := decodeBody(w, r, &p, true, false); err != nil {
		return err
	}
	if p.Name != "" && p.Name != r.PathValue("name") {
		return errdefs.Invalidf("name %q differs from the path's %q", p.Name, r.PathValue("name"))
	}
	p.Name = r.PathValue("name")
	out, err := svc.PutProfile(r.Context(), p)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *server) deleteProfile(w http.ResponseWriter, r *http.Request) error {
	svc, err := s.imageService()
	if err != nil {
		return err
	}
	if err := svc.DeleteProfile(r.Context(), r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *server) buildProfile(w http.ResponseWriter, r *http.Request) error {
	svc, err := s.imageService()
	if err != nil {
		return err
	}
	res, err := svc.BuildProfile(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// ImageList is the body of GET /images.
type ImageList struct {
	Images []*model.Image    `json:"images"`
	Usage  *model.ImageUsage `json:"usage,omitempty"`
}

// PullRequest is the body of POST /images/pull.
type PullRequest struct {
	Ref string `json:"ref"`
	// Auth is presented to the registry instead of the daemon's docker
	// config (a private image); it is neither logged nor kept.
	Auth *model.RegistryAuth `json:"auth,omitempty"`
}

// PruneRequest is the body of POST /images/prune.
type PruneRequest struct {
	All bool `json:"all,omitempty"`
}

// ImageEvent is one NDJSON line of POST /images/pull and /images/load:
// "progress" lines, then one "image" (pull) or "images" (load) line, or an
// "error" line once the stream has begun.
type ImageEvent struct {
	Type     string              `json:"type"`
	Progress *model.PullProgress `json:"progress,omitempty"`
	Image    *model.Image        `json:"image,omitempty"`
	Images   []*model.Image      `json:"images,omitempty"`
	Error    *ErrorDetail        `json:"error,omitempty"`
}

// MaxImageArchive caps an archive uploaded to POST /images/load.
const MaxImageArchive = 16 << 30

// WithImages serves the image routes over svc.
func WithImages(svc ImageService) Option { return func(s *server) { s.images = svc } }

func (s *server) imageService() (ImageService, error) {
	if s.images == nil {
		return nil, errdefs.NotImplementedf("this daemon has no image store")
	}
	return s.images, nil
}

func (s *server) listImages(w http.ResponseWriter, r *http.Request) error {
	svc, err := s.imageService()
	if err != nil {
		return err
	}
	imgs, err := svc.ListImages(r.Context())
	if err != nil {
		return err
	}
	if imgs == nil {
		imgs = []*model.Image{}
	}
	u, err := svc.ImageUsage(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, ImageList{Images: imgs, Usage: &u})
	return nil
}

func (s *server) getImage(w http.ResponseWriter, r *http.Request) error {
	svc, err := s.imageService()
	if err != nil {
		return err
	}
	img, err := svc.GetImage(r.Context(), r.PathValue("ref"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, img)
	return nil
}

func (s *server) deleteImage(w http.ResponseWriter, r *http.Request) error {
	svc, err := s.imageService()
	if err != nil {
		return err
	}
	force, err := boolQuery(r, "force")
	if err != nil {
		return err
	}
	res, err := svc.RemoveImage(r.Context(), r.PathValue("ref"), force)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

func boolQuery(r *http.Request, key string) (bool, error) {
	v := r.URL.Query().Get(key)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errdefs.Invalidf("query %s=%q: not a boolean", key, v)
	}
	return b, nil
}

// streamImages runs op, streaming its progress as NDJSON; an error before
// the first line is an ordinary error answer.
func (s *server) streamImages(w http.ResponseWriter, r *http.Request, op func(progress func(model.PullProgress)) (ImageEvent, error)) error {
	nw := &ndjsonWriter{w: w, rc: http.NewResponseController(w)}
	progress := func(p model.PullProgress) {
		_ = nw.write(ImageEvent{Type: "progress", Progress: &p})
	}
	final, err := op(progress)
	if err != nil {
		if !nw.hasStarted() {
			return err
		}
		d := s.errorDetail(r, err)
		if werr := nw.write(ImageEvent{Type: "error", Error: &d}); werr != nil {
			return werr
		}
		// The answer is complete; the error still counts (the audit log
		// records it).
		return err
	}
	return nw.write(final)
}

func (s *server) pullImage(w http.ResponseWriter, r *http.Request) error {
	svc, err := s.imageService()
	if err != nil {
		return err
	}
	var req PullRequest
	if err := decodeBody(w, r, &req, false, false); err != nil {
		return err
	}
	if req.Ref == "" {
		return errdefs.Invalidf("ref: an image reference is required")
	}
	if req.Auth != nil && (req.Auth.Username == "" || req.Auth.Password == "") {
		return errdefs.Invalidf("auth: a username and a password are both required")
	}
	return s.streamImages(w, r, func(progress func(model.PullProgress)) (ImageEvent, error) {
		img, err := svc.PullImage(r.Context(), req.Ref, req.Auth, progress)
		return ImageEvent{Type: "image", Image: img}, err
	})
}

func (s *server) loadImages(w http.ResponseWriter, r *http.Request) error {
	svc, err := s.imageService()
	if err != nil {
		return err
	}
	if r.ContentLength > MaxImageArchive {
		return errdefs.New(errdefs.ErrTooLarge, "image archive: %d bytes is over the limit of %d bytes", r.ContentLength, MaxImageArchive)
	}
	f, err := os.CreateTemp(svc.LoadDir(), "upload-*.tar")
	if err != nil {
		return fmt.Errorf("image archive: %w", err)
	}
	defer os.Remove(f.Name())
	_, err = io.Copy(f, http.MaxBytesReader(w, r.Body, MaxImageArchive))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errdefs.New(errdefs.ErrTooLarge, "image archive: over the limit of %d bytes", MaxImageArchive)
		}
		return errdefs.Wrap(errdefs.ErrInvalid, err, "image archive")
	}
	return s.streamImages(w, r, func(progress func(model.PullProgress)) (ImageEvent, error) {
		imgs, err := svc.LoadImages(r.Context(), f.Name(), progress)
		return ImageEvent{Type: "images", Images: imgs}, err
	})
}

func (s *server) pruneImages(w http.ResponseWriter, r *http.Request) error {
	svc, err := s.imageService()
	if err != nil {
		return err
	}
	var req PruneRequest
	if err := decodeBody(w, r, &req, false, true); err != nil {
		return err
	}
	res, err := svc.PruneImages(r.Context(), req.All)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

func (s *server) commitJail(w http.ResponseWriter, r *http.Request) error {
	svc, err := s.imageService()
	if err != nil {
		return err
	}
	var req model.CommitRequest
	if err := decodeBody(w, r, &req, false, true); err != nil {
		return err
	}
	img, err := svc.Commit(r.Context(), r.PathValue("id"), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, img)
	return nil
}
