// Package recording stores the recordings of a jail's terminal sessions.
//
// The in-jail init writes each session's asciicast v2 file into the
// jail's control directory as it happens ({session}.cast.part, renamed to
// {session}.cast when the session ends). Finalize moves a finished one
// into the jail's recordings directory compressed with zstd
// ({rid}.cast.zst) next to its metadata ({rid}.json), which holds the
// sha256 of the compressed file; Open checks that digest before every
// read, so a modified recording is reported instead of served.
package recording

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/agentjail/agentjail/internal/asciicast"
	"github.com/agentjail/agentjail/internal/atomicfile"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
)

// File name suffixes in a recordings directory.
const (
	compressedExt = ".cast.zst"
	metaExt       = ".json"
)

// Describe returns the metadata of a recording still being written (or
// not yet finalized) at raw: what its header says, its size, no digest.
func Describe(raw, rid, jailID, sessionID string) (*model.Recording, error) {
	f, err := os.Open(raw)
	if err != nil {
		return nil, fmt.Errorf("recording %s: %w", rid, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("recording %s: %w", rid, err)
	}
	rec, err := fromHeader(f, rid, jailID, sessionID)
	if err != nil {
		return nil, err
	}
	rec.Status, rec.Size = model.RecordingActive, st.Size()
	return rec, nil
}

// fromHeader fills a Recording from the asciicast header read from r.
func fromHeader(r io.Reader, rid, jailID, sessionID string) (*model.Recording, error) {
	line, err := bufio.NewReaderSize(r, 64<<10).ReadSlice('\n')
	if err != nil && len(line) == 0 {
		return nil, fmt.Errorf("recording %s: reading the header: %w", rid, err)
	}
	var h asciicast.Header
	if err := json.Unmarshal(line, &h); err != nil {
		return nil, fmt.Errorf("recording %s: header: %w", rid, err)
	}
	return &model.Recording{
		ID: rid, JailID: jailID, SessionID: sessionID, Command: h.Command,
		Width: h.Width, Height: h.Height, StartedAt: time.Unix(h.Timestamp, 0).UTC(),
	}, nil
}

// Finalize compresses the finished recording raw into dir as
// {rid}.cast.zst, writes {rid}.json with its sha256, and removes raw. An
// interruption leaves raw in place (and at most a stray temporary file),
// so Finalize can be run again.
func Finalize(raw, dir, rid, jailID, sessionID string) (_ *model.Recording, err error) {
	in, err := os.Open(raw)
	if err != nil {
		return nil, fmt.Errorf("recording %s: %w", rid, err)
	}
	defer in.Close()
	rec, err := fromHeader(in, rid, jailID, sessionID)
	if err != nil {
		return nil, err
	}
	if _, err := in.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("recording %s: %w", rid, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("recordings directory: %w", err)
	}
	tmp, err := atomicfile.Create(filepath.Join(dir, rid+compressedExt), 0o600)
	if err != nil {
		return nil, fmt.Errorf("recording %s: %w", rid, err)
	}
	defer tmp.Abort() // a no-op once committed
	sum := sha256.New()
	counted := &countWriter{w: io.MultiWriter(tmp, sum)}
	enc, err := zstd.NewWriter(counted, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		return nil, fmt.Errorf("recording %s: %w", rid, err)
	}
	n, err := io.Copy(enc, in)
	if err != nil {
		enc.Close()
		return nil, fmt.Errorf("recording %s: compressing: %w", rid, err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("recording %s: compressing: %w", rid, err)
	}
	if err := tmp.Commit(); err != nil {
		return nil, fmt.Errorf("recording %s: %w", rid, err)
	}
	rec.Status, rec.Size, rec.CompressedSize = model.RecordingComplete, n, counted.n
	rec.SHA256 = hex.EncodeToString(sum.Sum(nil))
	if err := writeMeta(dir, rec); err != nil {
		return nil, err
	}
	if err := os.Remove(raw); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("recording %s: removing the raw file: %w", rid, err)
	}
	return rec, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// writeMeta writes {rid}.json atomically.
func writeMeta(dir string, rec *model.Recording) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, rec.ID+metaExt), append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("recording %s: metadata: %w", rec.ID, err)
	}
	return nil
}

// List returns the finalized recordings of dir, oldest first (none when
// dir does not exist).
func List(dir string) ([]model.Recording, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("recordings: %w", err)
	}
	var out []model.Recording
	for _, e := range ents {
		rid, ok := strings.CutSuffix(e.Name(), metaExt)
		if !ok || strings.HasPrefix(rid, ".") {
			continue
		}
		rec, err := readMeta(dir, rid)
		if err != nil {
			return nil, err
		}
		out = append(out, *rec)
	}
	Sort(out)
	return out, nil
}

// Sort orders recordings oldest first.
func Sort(list []model.Recording) {
	sort.Slice(list, func(i, j int) bool {
		if list[i].StartedAt.Equal(list[j].StartedAt) {
			return list[i].ID < list[j].ID
		}
		return list[i].StartedAt.Before(list[j].StartedAt)
	})
}

func readMeta(dir, rid string) (*model.Recording, error) {
	b, err := os.ReadFile(filepath.Join(dir, rid+metaExt))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errdefs.NotFoundf("no recording %q", rid)
	}
	if err != nil {
		return nil, fmt.Errorf("recording %s: %w", rid, err)
	}
	var rec model.Recording
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, errdefs.Conflictf("recording %s: its metadata is unreadable (%v); it may have been tampered with", rid, err)
	}
	return &rec, nil
}

// Open verifies the finalized recording rid of dir against the sha256 in
// its metadata and returns the metadata and a reader of the decompressed
// .cast; the caller closes it. A recording whose file does not match its
// digest (or does not decompress) is an ErrConflict that says it was
// modified; an unknown rid is ErrNotFound.
func Open(dir, rid string) (*model.Recording, io.ReadCloser, error) {
	rec, err := readMeta(dir, rid)
	if err != nil {
		return nil, nil, err
	}
	f, err := os.Open(filepath.Join(dir, rid+compressedExt))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, errdefs.Conflictf("recording %s: its file is missing although its metadata exists; it may have been tampered with", rid)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("recording %s: %w", rid, err)
	}
	sum := sha256.New()
	if _, err := io.Copy(sum, f); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("recording %s: %w", rid, err)
	}
	if got := hex.EncodeToString(sum.Sum(nil)); got != rec.SHA256 {
		f.Close()
		return nil, nil, errdefs.Conflictf("recording %s failed its integrity check: the stored file's sha256 is %s but %s was recorded when the session ended; the recording was modified", rid, got, rec.SHA256)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("recording %s: %w", rid, err)
	}
	dec, err := zstd.NewReader(f, zstd.WithDecoderConcurrency(1))
	if err != nil {
		f.Close()
		return nil, nil, errdefs.Conflictf("recording %s does not decompress (%v); it may have been tampered with", rid, err)
	}
	return rec, &reader{dec: dec, f: f}, nil
}

type reader struct {
	dec *zstd.Decoder
	f   *os.File
}

func (r *reader) Read(p []byte) (int, error) { return r.dec.Read(p) }

func (r *reader) Close() error {
	r.dec.Close()
	return r.f.Close()
}
