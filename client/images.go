package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/agentjail/agentjail/internal/model"
)

// The image types of the API.
type (
	// Image is an image of the daemon's store.
	Image = model.Image
	// ImageConfig is what a jail takes from an image's config.
	ImageConfig = model.ImageConfig
	// PullProgress is one step of a pull or load.
	PullProgress = model.PullProgress
	// RegistryAuth is the credentials PullWithAuth presents to a registry.
	RegistryAuth = model.RegistryAuth
	// ImageRemoval says what RemoveImage did.
	ImageRemoval = model.ImageRemoval
	// ImagePrune says what PruneImages removed.
	ImagePrune = model.ImagePrune
	// ImageUsage is the image store's disk accounting.
	ImageUsage = model.ImageUsage
	// CommitRequest is the body of Commit.
	CommitRequest = model.CommitRequest
)

// imageURL escapes an image reference for /images/{ref...}: its slashes
// stay path separators.
func imageURL(ref string) string {
	parts := strings.Split(ref, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return "/images/" + strings.Join(parts, "/")
}

// Images lists the images of the store, newest first, and its disk use.
func (c *Client) Images(ctx context.Context) ([]*Image, *ImageUsage, error) {
	var out struct {
		Images []*Image    `json:"images"`
		Usage  *ImageUsage `json:"usage"`
	}
	if err := c.call(ctx, http.MethodGet, "/images", nil, &out); err != nil {
		return nil, nil, err
	}
	return out.Images, out.Usage, nil
}

// GetImage returns the image ref names (a tag, an id or id prefix, or a
// reference with a digest).
func (c *Client) GetImage(ctx context.Context, ref string) (*Image, error) {
	var img Image
	if err := c.call(ctx, http.MethodGet, imageURL(ref), nil, &img); err != nil {
		return nil, err
	}
	return &img, nil
}

// Pull pulls ref into the daemon's store, calling progress (when not nil)
// for every step of every layer. The daemon pulls with the credentials of
// its docker config.
func (c *Client) Pull(ctx context.Context, ref string, progress func(PullProgress)) (*Image, error) {
	return c.PullWithAuth(ctx, ref, nil, progress)
}

// PullWithAuth is Pull presenting auth (when not nil) to the registry
// instead of the daemon's docker config: a private image.
func (c *Client) PullWithAuth(ctx context.Context, ref string, auth *RegistryAuth, progress func(PullProgress)) (*Image, error) {
	b, err := json.Marshal(struct {
		Ref  string        `json:"ref"`
		Auth *RegistryAuth `json:"auth,omitempty"`
	}{ref, auth})
	if err != nil {
		return nil, err
	}
	resp, err := c.do(ctx, request{method: http.MethodPost, path: "/images/pull", body: strings.NewReader(string(b)), ctype: "application/json"})
	if err != nil {
		return nil, err
	}
	ev, err := readImageStream(resp, progress)
	if err != nil {
		return nil, err
	}
	if ev.Image == nil {
		return nil, errors.New("pull: the daemon ended the stream without the image")
	}
	return ev.Image, nil
}

// Load uploads a docker-archive or OCI layout tar and returns the images
// it held, now in the daemon's store.
func (c *Client) Load(ctx context.Context, archive io.Reader, progress func(PullProgress)) ([]*Image, error) {
	resp, err := c.do(ctx, request{method: http.MethodPost, path: "/images/load", body: archive, ctype: "application/x-tar"})
	if err != nil {
		return nil, err
	}
	ev, err := readImageStream(resp, progress)
	if err != nil {
		return nil, err
	}
	return ev.Images, nil
}

// imageEvent is a line of the pull and load streams.
type imageEvent struct {
	Type     string        `json:"type"`
	Progress *PullProgress `json:"progress"`
	Image    *Image        `json:"image"`
	Images   []*Image      `json:"images"`
	Error    *streamError  `json:"error"`
}

func readImageStream(resp *http.Response, progress func(PullProgress)) (*imageEvent, error) {
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), maxStreamLine)
	for sc.Scan() {
		var ev imageEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("image stream: bad event: %w", err)
		}
		switch ev.Type {
		case "progress":
			if progress != nil && ev.Progress != nil {
				progress(*ev.Progress)
			}
		case "image", "images":
			return &ev, nil
		case "error":
			return nil, ev.Error.apiError("image operation failed")
		default:
			return nil, fmt.Errorf("image stream: unknown event type %q", ev.Type)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("image stream: %w", err)
	}
	return nil, errors.New("image stream: the daemon ended the stream early")
}

// RemoveImage untags ref, and removes the image when nothing else names
// or uses it (force: untag an image in use named by id).
func (c *Client) RemoveImage(ctx context.Context, ref string, force bool) (*ImageRemoval, error) {
	req := request{method: http.MethodDelete, path: imageURL(ref)}
	if force {
		req.query = url.Values{"force": {"true"}}
	}
	resp, err := c.do(ctx, req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out ImageRemoval
	return &out, decodeJSON(resp, &out)
}

// PruneImages removes untagged unused images (all: every unused image)
// and the layers no image references.
func (c *Client) PruneImages(ctx context.Context, all bool) (*ImagePrune, error) {
	var out ImagePrune
	if err := c.call(ctx, http.MethodPost, "/images/prune", map[string]bool{"all": all}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Commit writes the jail's current filesystem as a new image on top of
// its own image, tagged req.Ref.
func (c *Client) Commit(ctx context.Context, ref string, req CommitRequest) (*Image, error) {
	var img Image
	if err := c.call(ctx, http.MethodPost, jailURL(ref)+"/commit", req, &img); err != nil {
		return nil, err
	}
	return &img, nil
}

// Profile is a profile; ProfileBuild the answer to BuildProfile.
type (
	Profile      = model.Profile
	ProfileBuild = model.ProfileBuild
)

// Profiles lists the built-in and user profiles.
func (c *Client) Profiles(ctx context.Context) ([]Profile, error) {
	var out struct {
		Profiles []Profile `json:"profiles"`
	}
	if err := c.call(ctx, http.MethodGet, "/profiles", nil, &out); err != nil {
		return nil, err
	}
	return out.Profiles, nil
}

// PutProfile saves a user profile.
func (c *Client) PutProfile(ctx context.Context, p Profile) (*Profile, error) {
	var out Profile
	if err := c.call(ctx, http.MethodPut, "/profiles/"+url.PathEscape(p.Name), p, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteProfile removes a user profile.
func (c *Client) DeleteProfile(ctx context.Context, name string) error {
	return c.call(ctx, http.MethodDelete, "/profiles/"+url.PathEscape(name), nil, nil)
}

// BuildProfile builds the profile's image, or finds it cached.
func (c *Client) BuildProfile(ctx context.Context, name string) (*ProfileBuild, error) {
	var out ProfileBuild
	if err := c.call(ctx, http.MethodPost, "/profiles/"+url.PathEscape(name)+"/build", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
