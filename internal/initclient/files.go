package initclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initproto"
)

// Stat describes a jail path with lstat semantics (a final symlink is
// described, not followed). Errors: ErrInvalid for a bad path,
// ErrNotFound, ErrForbidden for a blocked path.
func (c *Client) Stat(ctx context.Context, path string) (initproto.FileInfo, error) {
	var info initproto.FileInfo
	if err := checkPath("path", path); err != nil {
		return info, err
	}
	err := c.call(ctx, "stat", initproto.MsgStat, initproto.PathRequest{Path: path}, &info)
	return info, err
}

// ReadDir lists a directory's entries sorted by name, each with lstat
// semantics. A path that is not a directory is ErrUnprocessable.
func (c *Client) ReadDir(ctx context.Context, path string) ([]initproto.FileInfo, error) {
	if err := checkPath("path", path); err != nil {
		return nil, err
	}
	var out []initproto.FileInfo
	if err := c.call(ctx, "readdir", initproto.MsgReadDir, initproto.PathRequest{Path: path}, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// ListDir lists a directory's entries sorted by name, each with lstat
// semantics: at most limit of them (1..initproto.MaxListDir); a directory
// with more gives limit of them, those init read first, and truncated. A
// path that is not a directory is ErrUnprocessable. An init that does not
// know the request (a jail restored with an older binary) is asked with
// ReadDir, whose answer must fit one frame.
func (c *Client) ListDir(ctx context.Context, path string, limit int) (list []initproto.FileInfo, truncated bool, err error) {
	if err := checkPath("path", path); err != nil {
		return nil, false, err
	}
	cn, err := c.dial(ctx)
	if err != nil {
		return nil, false, err
	}
	defer cn.Close()
	stop := guard(ctx, cn)
	defer stop()
	if err := initproto.WriteJSON(cn, initproto.MsgListDir, initproto.ListDirRequest{Path: path, Limit: limit}); err != nil {
		return nil, false, ioError(ctx, cn, "list", err)
	}
	var ans initproto.ListDirAnswer
	if err := readAnswer(ctx, cn, "list", &ans); err != nil {
		if errors.Is(err, errdefs.ErrInvalid) && strings.Contains(err.Error(), "unknown request type") {
			list, err := c.ReadDir(ctx, path)
			return list, false, err
		}
		return nil, false, err
	}
	for {
		t, payload, err := cn.read()
		switch {
		case err != nil:
			return nil, false, ioError(ctx, cn, "list", err)
		case t == initproto.MsgEOF:
			return list, ans.Truncated, nil
		case t == initproto.MsgError:
			return nil, false, decodeError(payload)
		case t != initproto.MsgData:
			return nil, false, unexpected("list", t)
		}
		var chunk []initproto.FileInfo
		if err := json.Unmarshal(payload, &chunk); err != nil {
			return nil, false, fmt.Errorf("list: jail init sent a bad entry: %w", err)
		}
		if len(list)+len(chunk) > limit {
			return nil, false, fmt.Errorf("list: jail init sent more than %d entries", limit)
		}
		list = append(list, chunk...)
	}
}

// ReadFile opens a regular file (symlinks followed inside the jail) and
// returns its FileInfo and a reader of its contents; any error (not
// found, blocked, a directory) is known before data is read. The caller
// must Close the reader; ctx bounds the whole read.
func (c *Client) ReadFile(ctx context.Context, path string) (initproto.FileInfo, io.ReadCloser, error) {
	var info initproto.FileInfo
	if err := checkPath("path", path); err != nil {
		return info, nil, err
	}
	cn, err := c.dial(ctx)
	if err != nil {
		return info, nil, err
	}
	stop := guard(ctx, cn)
	fail := func(err error) (initproto.FileInfo, io.ReadCloser, error) {
		stop()
		cn.Close()
		return info, nil, err
	}
	if err := initproto.WriteJSON(cn, initproto.MsgReadFile, initproto.PathRequest{Path: path}); err != nil {
		return fail(ioError(ctx, cn, "read file", err))
	}
	if err := readAnswer(ctx, cn, "read file", &info); err != nil {
		return fail(err)
	}
	return info, &fileReader{ctx: ctx, cn: cn, stop: stop}, nil
}

// fileReader reads the data frames of a ReadFile.
type fileReader struct {
	ctx     context.Context
	cn      *conn
	stop    func() bool
	pending []byte
	err     error
}

// Read returns file data; io.EOF after the last byte.
func (f *fileReader) Read(p []byte) (int, error) {
	for len(f.pending) == 0 {
		if f.err != nil {
			return 0, f.err
		}
		t, payload, err := f.cn.read()
		switch {
		case err != nil:
			f.err = ioError(f.ctx, f.cn, "read file", err)
		case t == initproto.MsgData:
			f.pending = payload
		case t == initproto.MsgEOF:
			f.err = io.EOF
		case t == initproto.MsgError:
			f.err = decodeError(payload)
		default:
			f.err = unexpected("read file", t)
		}
	}
	n := copy(p, f.pending)
	f.pending = f.pending[n:]
	return n, nil
}

// Close ends the read and releases the connection.
func (f *fileReader) Close() error {
	f.stop()
	if f.err == nil {
		f.err = errors.New("read file: reader is closed")
	}
	return f.cn.Close()
}

// WriteFile writes r to a jail file, replacing it atomically (see
// initproto.WriteOptions for mode, owner and parent creation). A final
// symlink is never followed (ErrUnprocessable), a blocked path is
// ErrForbidden, a full disk ErrTooLarge. When r fails, nothing is written
// and its error is returned.
func (c *Client) WriteFile(ctx context.Context, path string, r io.Reader, opts initproto.WriteOptions) (initproto.FileInfo, error) {
	var info initproto.FileInfo
	if err := checkPath("path", path); err != nil {
		return info, err
	}
	cn, err := c.dial(ctx)
	if err != nil {
		return info, err
	}
	defer cn.Close()
	stop := guard(ctx, cn)
	defer stop()
	if err := initproto.WriteJSON(cn, initproto.MsgWriteFile, initproto.WriteRequest{Path: path, WriteOptions: opts}); err != nil {
		return info, ioError(ctx, cn, "write file", err)
	}
	if err := readAnswer(ctx, cn, "write file", nil); err != nil {
		return info, err
	}
	buf := make([]byte, initproto.ChunkSize)
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			if err := initproto.WriteFrame(cn, initproto.MsgData, buf[:n]); err != nil {
				// Init may have failed the write (a full disk) and said why.
				if aerr := readAnswer(ctx, cn, "write file", nil); aerr != nil {
					return info, aerr
				}
				return info, ioError(ctx, cn, "write file", err)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return info, rerr // closing the connection discards the partial file
		}
	}
	if err := initproto.WriteFrame(cn, initproto.MsgEOF, nil); err != nil {
		return info, ioError(ctx, cn, "write file", err)
	}
	err = readAnswer(ctx, cn, "write file", &info)
	return info, err
}

// Mkdir creates a directory owned by opts.User (default: the jail's
// user) with opts.Mode (default 0755). With opts.MkdirParents missing
// parents are created and an existing directory is not an error;
// otherwise an existing path is ErrConflict.
func (c *Client) Mkdir(ctx context.Context, path string, opts initproto.WriteOptions) (initproto.FileInfo, error) {
	var info initproto.FileInfo
	if err := checkPath("path", path); err != nil {
		return info, err
	}
	err := c.call(ctx, "mkdir", initproto.MsgMkdir, initproto.MkdirRequest{Path: path, WriteOptions: opts}, &info)
	return info, err
}

// Symlink creates the symbolic link path → target, owned by user (default:
// the jail's user), and describes it. An existing path is ErrConflict; a
// path whose parent is missing ErrNotFound.
func (c *Client) Symlink(ctx context.Context, path, target, user string) (initproto.FileInfo, error) {
	var info initproto.FileInfo
	if err := checkPath("path", path); err != nil {
		return info, err
	}
	err := c.call(ctx, "symlink", initproto.MsgSymlink, initproto.SymlinkRequest{Path: path, Target: target, User: user}, &info)
	return info, err
}

// Remove deletes a path (a final symlink itself, not its target). A
// non-empty directory needs recursive (else ErrUnprocessable); a path
// that contains a blocked path is ErrForbidden.
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	if err := checkPath("path", path); err != nil {
		return err
	}
	return c.call(ctx, "remove", initproto.MsgRemove, initproto.RemoveRequest{Path: path, Recursive: recursive}, nil)
}

// Rename moves from to to, replacing a file at to.
func (c *Client) Rename(ctx context.Context, from, to string) error {
	if err := checkPath("from", from); err != nil {
		return err
	}
	if err := checkPath("to", to); err != nil {
		return err
	}
	return c.call(ctx, "rename", initproto.MsgRename, initproto.RenameRequest{From: from, To: to}, nil)
}

// Access reports whether user (default: the jail's user) can read, or
// with write, write path, and why not. A missing path is writable when
// its directory is. An unknown user is ErrInvalid.
func (c *Client) Access(ctx context.Context, path string, write bool, user string) (bool, string, error) {
	if err := checkPath("path", path); err != nil {
		return false, "", err
	}
	var res initproto.AccessResult
	if err := c.call(ctx, "access", initproto.MsgAccess, initproto.AccessRequest{Path: path, Write: write, User: user}, &res); err != nil {
		return false, "", err
	}
	return res.OK, res.Reason, nil
}
