package netcap

import (
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// FuzzDecodeDNS decodes arbitrary port-53 payloads (a jail writes them):
// no panic, one message at most over UDP, over TCP no more messages than
// the payload has room for, and every message has its question's name.
func FuzzDecodeDNS(f *testing.F) {
	name := dnsmessage.MustNewName("www.example.test.")
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 9, Response: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	b.StartAnswers()
	b.AResource(dnsmessage.ResourceHeader{Name: name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}, dnsmessage.AResource{A: [4]byte{192, 0, 2, 1}})
	b.TXTResource(dnsmessage.ResourceHeader{Name: name, Type: dnsmessage.TypeTXT, Class: dnsmessage.ClassINET}, dnsmessage.TXTResource{TXT: []string{"a", "b"}})
	msg, err := b.Finish()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(msg, false)
	f.Add(append([]byte{byte(len(msg) >> 8), byte(len(msg))}, msg...), true)
	f.Add(append([]byte{0xff, 0xff}, msg[:20]...), true)
	f.Add(msg[:13], false)
	f.Fuzz(func(t *testing.T, payload []byte, tcp bool) {
		ms, err := DecodeDNS(payload, tcp)
		if err != nil {
			if len(ms) != 0 {
				t.Fatalf("an error with %d messages", len(ms))
			}
			return
		}
		if len(ms) == 0 || !tcp && len(ms) != 1 || len(ms) > len(payload)/14 {
			t.Fatalf("%d messages from %d bytes (tcp %v)", len(ms), len(payload), tcp)
		}
		for _, m := range ms {
			if m.Type == "" {
				t.Fatalf("a message without its question: %+v", m)
			}
			if !m.Response && (m.RCode != "" || len(m.Answers) > 0) {
				t.Fatalf("a query with an answer: %+v", m)
			}
		}
	})
}
