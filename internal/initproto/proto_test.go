package initproto

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestFrames(t *testing.T) {
	var b bytes.Buffer
	if err := WriteFrame(&b, MsgStdout, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := WriteJSON(&b, MsgExit, ExitStatus{Code: 3, Signal: "SIGKILL"}); err != nil {
		t.Fatal(err)
	}
	if err := WriteJSON(&b, MsgOK, nil); err != nil {
		t.Fatal(err)
	}
	typ, p, err := ReadFrame(&b, nil)
	if err != nil || typ != MsgStdout || string(p) != "hello" {
		t.Fatalf("%v %q %v", typ, p, err)
	}
	typ, p, err = ReadFrame(&b, make([]byte, 0, 4)) // too small: a new slice
	var st ExitStatus
	if err != nil || typ != MsgExit || Decode(typ, p, &st) != nil || st.Code != 3 || st.Signal != "SIGKILL" {
		t.Fatalf("%v %q %v %+v", typ, p, err, st)
	}
	if typ, p, err = ReadFrame(&b, nil); err != nil || typ != MsgOK || len(p) != 0 {
		t.Fatalf("%v %q %v", typ, p, err)
	}
	if _, _, err = ReadFrame(&b, nil); err != io.EOF {
		t.Fatalf("end: %v", err)
	}
	// A frame cut short, and an oversized one.
	WriteFrame(&b, MsgData, []byte("abcdef"))
	b.Truncate(b.Len() - 2)
	if _, _, err = ReadFrame(&b, nil); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("truncated: %v", err)
	}
	b.Reset()
	b.Write([]byte{byte(MsgData), 0xff, 0xff, 0xff, 0xff})
	if _, _, err = ReadFrame(&b, nil); err == nil {
		t.Fatal("oversized frame accepted")
	}
	if err := WriteFrame(&b, MsgData, make([]byte, MaxPayload+1)); err == nil {
		t.Fatal("oversized write accepted")
	}
	if MsgAttach.String() != "attach" || MsgType(0xee).String() != "msg(0xee)" {
		t.Fatal("names")
	}
}
