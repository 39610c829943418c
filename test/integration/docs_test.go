package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// docExample is one fenced YAML or JSON block of the documentation.
//
// The block's info string says what it is: "yaml" or "json" alone is a
// jail's configuration (a POST /jails body); "yaml network" or "json
// network" a network policy (a PUT /jails/{id}/network body); "yaml
// output" or "json output" something the daemon prints, which must only
// parse.
type docExample struct {
	where string // file:line
	lang  string // yaml or json
	kind  string // "", network or output
	body  []byte
}

// docExamples returns every YAML and JSON block of README.md and docs/*.md.
func docExamples(tb testing.TB) []docExample {
	tb.Helper()
	root, err := repoRoot()
	if err != nil {
		tb.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		tb.Fatal(err)
	}
	files = append([]string{filepath.Join(root, "README.md")}, files...)
	var out []docExample
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		var cur *docExample
		sc := bufio.NewScanner(bytes.NewReader(data))
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			trimmed := strings.TrimSpace(line)
			switch {
			case cur == nil && strings.HasPrefix(trimmed, "```"):
				info := strings.Fields(strings.TrimPrefix(trimmed, "```"))
				cur = &docExample{where: fmt.Sprintf("%s:%d", rel, n)}
				if len(info) > 0 {
					cur.lang = info[0]
				}
				if len(info) > 1 {
					cur.kind = info[1]
				}
			case cur != nil && trimmed == "```":
				if cur.lang == "yaml" || cur.lang == "json" {
					out = append(out, *cur)
				}
				cur = nil
			case cur != nil:
				cur.body = append(cur.body, line+"\n"...)
			}
		}
		if cur != nil {
			tb.Errorf("%s: the block never closes", cur.where)
		}
	}
	return out
}

// leaves flattens a decoded JSON value into path → value.
func leaves(prefix string, v any, into map[string]any) {
	switch t := v.(type) {
	case map[string]any:
		for k, c := range t {
			leaves(prefix+"."+k, c, into)
		}
	default:
		into[prefix] = v
	}
}

// TestDocExamples creates a jail from every configuration example of the
// README and docs, as the reader would (YAML sent as YAML), and checks
// the jail's configuration holds every value the example sets; network
// policy examples are applied to a jail, output examples must parse.
func TestDocExamples(t *testing.T) {
	d := shared(t)
	examples := docExamples(t)
	if len(examples) == 0 {
		t.Fatal("no YAML or JSON example found in README.md and docs/")
	}
	for _, ex := range examples {
		t.Run(ex.where, func(t *testing.T) {
			asJSON := ex.body
			if ex.lang == "yaml" {
				var err error
				if asJSON, err = yaml.YAMLToJSON(ex.body); err != nil {
					t.Fatalf("not YAML: %v\n%s", err, ex.body)
				}
			}
			var doc any
			if err := json.Unmarshal(asJSON, &doc); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, ex.body)
			}
			ctype := "application/json"
			if ex.lang == "yaml" {
				ctype = "application/yaml"
			}
			switch ex.kind {
			case "output":
			case "network":
				j := d.createJail(t, nil)
				r := d.api.do(t, "PUT", "/jails/"+j.ID+"/network", ex.body, "Content-Type", ctype)
				if r.status != http.StatusOK {
					t.Fatalf("PUT /jails/%s/network: %s\n%s", j.ID, r, ex.body)
				}
			case "":
				checkConfigExample(t, d, ex, doc, ctype)
			default:
				t.Fatalf("unknown kind %q of example (a config has none; network; output)", ex.kind)
			}
		})
	}
}

// checkConfigExample creates the jail of a config example and compares
// every value the example sets with the jail's configuration.
func checkConfigExample(t *testing.T, d *daemon, ex docExample, doc any, ctype string) {
	obj, ok := doc.(map[string]any)
	if !ok {
		t.Fatalf("a jail config is an object, not %T", doc)
	}
	r := d.api.do(t, "POST", "/jails", ex.body, "Content-Type", ctype)
	if r.status != http.StatusCreated {
		t.Fatalf("POST /jails: %s\n%s", r, ex.body)
	}
	var got struct {
		ID     string         `json:"id"`
		Status string         `json:"status"`
		Config map[string]any `json:"config"`
	}
	if err := json.Unmarshal(r.body, &got); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.destroy(t, got.ID) })
	if start, _ := obj["start"].(bool); start || obj["start"] == nil {
		if got.Status != "running" {
			t.Errorf("status %q after a create that starts", got.Status)
		}
	}
	want, have := map[string]any{}, map[string]any{}
	for _, k := range []string{"env", "isolation", "tracing"} {
		if v, ok := obj[k]; ok {
			leaves(k, v, want)
		}
	}
	leaves("", got.Config, have)
	for path, w := range want {
		h, ok := have["."+path]
		if !ok && isZero(w) {
			continue // omitted from the answer when zero
		}
		if !ok || !reflect.DeepEqual(redact(w, h), h) {
			t.Errorf("%s: the example sets %v, the jail has %v", path, w, h)
		}
	}
}

// isZero is true for the JSON zero values: false, 0, "", [], null.
func isZero(v any) bool {
	switch t := v.(type) {
	case nil:
		return true
	case bool:
		return !t
	case float64:
		return t == 0
	case string:
		return t == ""
	case []any:
		return len(t) == 0
	}
	return false
}

// redact replaces in want the values the daemon shows as "<redacted>" in
// have (credential values never leave it).
func redact(want, have any) any {
	switch w := want.(type) {
	case []any:
		h, ok := have.([]any)
		if !ok || len(h) != len(w) {
			return want
		}
		out := make([]any, len(w))
		for i := range w {
			out[i] = redact(w[i], h[i])
		}
		return out
	case map[string]any:
		h, ok := have.(map[string]any)
		if !ok {
			return want
		}
		out := map[string]any{}
		for k, v := range w {
			out[k] = redact(v, h[k])
		}
		return out
	}
	if have == "<redacted>" {
		return have
	}
	return want
}
