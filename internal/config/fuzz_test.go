package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/errdefs"
)

// FuzzDecodeConfig feeds arbitrary documents through what a create does
// with a config: strict YAML/JSON decoding, defaults, validation. Decoding
// fails only with ErrInvalid, validation only with ErrUnprocessable, and
// nothing panics. A config that validates survives a round trip through
// its JSON form unchanged (an empty list or map may come back nil: the JSON
// is what is compared) and still validates (what the daemon stores in
// jail.json and reads back at restart).
func FuzzDecodeConfig(f *testing.F) {
	for _, seed := range []string{
		``,
		`{}`,
		`null`,
		`[]`,
		`{"isolation":{"level":"container","resources":{"memory_bytes":1073741824,"cpu_quota":50000}}}`,
		`{"env":{"A":"b"},"hostname":"box","tracing":{"mode":"no-syscalls","include":["openat"]}}`,
		`{"isolation":{"network":{"mode":"isolated","allow":["pypi.org:443","10.0.0.0/8"]}}}`,
		`{"isolation":{"filesystem":{"rootfs":"dir:/srv/root","mounts":[{"source":"/a","target":"/b"}]}}}`,
		`{"isolation":{"process":{"user":"root","namespaces":{"user":true}}}}`,
		`{"workspace":{"repo":"/src/app","sync":{"mode":"auto-idle","idle_s":5}}}`,
		`{"agent":{"name":"claude","endpoint":"http://127.0.0.1:8080/v1"}}`,
		"isolation:\n  level: container\n  resources:\n    memory_bytes: 268435456\n    pids_limit: 64\n",
		"env:\n  PATH: /bin\ntracing:\n  mode: off\n",
		"isolation:\n  resources:\n    memory_bytes: &a 1\n    disk_bytes: *a\n",
		`{"isolation":{"resources":{"memory_bytes":1e300}}}`,
		`{"isolation":{"resources":{"memory_bytes":-1}}}`,
		`{"env":{"":"x"}}`,
	} {
		f.Add([]byte(seed))
	}
	h := Host{NofileMax: 1 << 20, CPUs: 2, Levels: []string{LevelContainer, LevelProcess, LevelVM}, NetworkModes: []string{NetIsolated, NetNone, NetBridge}}
	f.Fuzz(func(t *testing.T, doc []byte) {
		guard := time.AfterFunc(5*time.Second, func() { panic(fmt.Sprintf("decoding took over 5s: %q", doc)) })
		defer guard.Stop()
		var c Config
		if err := DecodeYAML(doc, &c); err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("decode error without ErrInvalid: %v", err)
			}
			return
		}
		c.ApplyDefaults()
		if err := c.Validate(h); err != nil {
			if !errors.Is(err, errdefs.ErrUnprocessable) {
				t.Fatalf("validation error without ErrUnprocessable: %v", err)
			}
			return
		}
		once := c
		c.ApplyDefaults()
		if !reflect.DeepEqual(once, c) {
			t.Fatalf("defaults applied twice differ:\n%+v\n%+v", once, c)
		}
		b, err := json.Marshal(&c)
		if err != nil {
			t.Fatalf("encode a valid config: %v", err)
		}
		var back Config
		if err := DecodeJSON(b, &back); err != nil {
			t.Fatalf("a valid config's JSON does not decode: %v\n%s", err, b)
		}
		back.ApplyDefaults()
		b2, err := json.Marshal(&back)
		if err != nil {
			t.Fatal(err)
		}
		if string(b2) != string(b) {
			t.Fatalf("round trip changed the config:\n%s\n%s", b, b2)
		}
		if err := back.Validate(h); err != nil {
			t.Fatalf("a valid config no longer validates after a round trip: %v\n%s", err, b)
		}
	})
}
