package initd

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The shim's control messages carry their bodies in a compact binary form
// (init and the shim are the same binary, so the form needs no version):
// integers as varints, strings as a uvarint length and the bytes, lists
// as a uvarint count and the items, booleans as one varint. Decoding the
// spec of every command this way instead of as JSON takes a fraction of
// the shim's CPU on the exec path.

// shimBody is the body of a shim control message.
type shimBody interface {
	// appendTo appends the encoded body to b.
	appendTo(b []byte) []byte
	// decode decodes an encoded body; anything left over or missing is
	// an error.
	decode(b []byte) error
}

var (
	_ shimBody = (*shimSpec)(nil)
	_ shimBody = (*shimStarted)(nil)
	_ shimBody = (*shimExit)(nil)
)

func appendInt(b []byte, v int) []byte { return binary.AppendVarint(b, int64(v)) }

func appendBool(b []byte, v bool) []byte {
	if v {
		return appendInt(b, 1)
	}
	return appendInt(b, 0)
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

func appendStrings(b []byte, ss []string) []byte {
	b = binary.AppendUvarint(b, uint64(len(ss)))
	for _, s := range ss {
		b = appendString(b, s)
	}
	return b
}

// wireReader decodes a body; the first failure sticks.
type wireReader struct {
	b   []byte
	err error
}

var errShortBody = errors.New("truncated shim message")

func (r *wireReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errShortBody
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *wireReader) int() int {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = errShortBody
		return 0
	}
	r.b = r.b[n:]
	return int(v)
}

func (r *wireReader) bool() bool { return r.int() != 0 }

func (r *wireReader) string() string {
	n := r.uvarint()
	if r.err != nil {
		return ""
	}
	if n > uint64(len(r.b)) {
		r.err = errShortBody
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// count reads a list's length, bounded by what is left (every item takes
// at least a byte).
func (r *wireReader) count() int {
	n := r.uvarint()
	if n > uint64(len(r.b)) {
		r.err = errShortBody
		return 0
	}
	return int(n)
}

func (r *wireReader) strings() []string {
	n := r.count()
	if n == 0 {
		return nil
	}
	ss := make([]string, n)
	for i := range ss {
		ss[i] = r.string()
	}
	return ss
}

func (r *wireReader) ints() []int {
	n := r.count()
	if n == 0 {
		return nil
	}
	vs := make([]int, n)
	for i := range vs {
		vs[i] = r.int()
	}
	return vs
}

// done is the decoding's error: a failure, or bytes left over.
func (r *wireReader) done() error {
	if r.err == nil && len(r.b) > 0 {
		r.err = fmt.Errorf("shim message has %d bytes too many", len(r.b))
	}
	if r.err != nil {
		return fmt.Errorf("decode shim message: %w", r.err)
	}
	return nil
}

func (s *shimSpec) appendTo(b []byte) []byte {
	b = appendString(b, s.Path)
	b = appendStrings(b, s.Argv)
	b = appendStrings(b, s.Env)
	b = appendString(b, s.Dir)
	b = appendInt(b, s.UID)
	b = appendInt(b, s.GID)
	b = binary.AppendUvarint(b, uint64(len(s.Groups)))
	for _, g := range s.Groups {
		b = appendInt(b, g)
	}
	b = appendBool(b, s.Tty)
	return appendBool(b, s.HandOff)
}

func (s *shimSpec) decode(b []byte) error {
	r := wireReader{b: b}
	*s = shimSpec{
		Path: r.string(), Argv: r.strings(), Env: r.strings(), Dir: r.string(),
		UID: r.int(), GID: r.int(), Groups: r.ints(), Tty: r.bool(), HandOff: r.bool(),
	}
	return r.done()
}

func (s *shimStarted) appendTo(b []byte) []byte { return appendInt(b, s.Pid) }

func (s *shimStarted) decode(b []byte) error {
	r := wireReader{b: b}
	s.Pid = r.int()
	return r.done()
}

func (e *shimExit) appendTo(b []byte) []byte {
	b = appendInt(b, e.StartErrno)
	b = appendBool(b, e.Exited)
	b = appendInt(b, e.Code)
	b = appendInt(b, e.Signal)
	return appendBool(b, e.Reusable)
}

func (e *shimExit) decode(b []byte) error {
	r := wireReader{b: b}
	*e = shimExit{StartErrno: r.int(), Exited: r.bool(), Code: r.int(), Signal: r.int(), Reusable: r.bool()}
	return r.done()
}
