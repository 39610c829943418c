package observe

import "testing"

func TestSockaddr(t *testing.T) {
	for _, c := range []struct {
		b    []byte
		want string
	}{
		{[]byte{2, 0, 0x01, 0xbb, 10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}, "10.0.0.1:443"},
		{append([]byte{10, 0, 0, 53, 0, 0, 0, 0}, append(make([]byte, 15), 1)...), "[::1]:53"},
		{[]byte("\x01\x00/run/x.sock\x00junk"), "unix:/run/x.sock"},
		{[]byte("\x01\x00\x00name"), "unix:@name"},
		{[]byte{17, 0}, "family:17"},
		{[]byte{2}, ""},
		{[]byte{2, 0, 1}, "family:2"},
	} {
		if got := Sockaddr(c.b); got != c.want {
			t.Errorf("Sockaddr(%v) = %q, want %q", c.b, got, c.want)
		}
	}
}
