package gateway

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestMergeLists(t *testing.T) {
	for _, tc := range []struct {
		name   string
		bodies []string
		want   string
	}{
		{"arrays", []string{`[{"sandboxID":"a"}]`, `[]`, `[{"sandboxID":"b"},{"sandboxID":"c"}]`}, `[{"sandboxID":"a"},{"sandboxID":"b"},{"sandboxID":"c"}]`},
		{"objects", []string{`{"jails":[{"id":"1"}],"note":"x"}`, `{"jails":[{"id":"2"}],"note":"y"}`}, `{"jails":[{"id":"1"},{"id":"2"}],"note":"x"}`},
		{"one", []string{`{"snapshots":[]}`}, `{"snapshots":[]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var bodies [][]byte
			for _, b := range tc.bodies {
				bodies = append(bodies, []byte(b))
			}
			got, err := mergeLists(bodies)
			if err != nil {
				t.Fatal(err)
			}
			var g, w any
			if err := json.Unmarshal(got, &g); err != nil {
				t.Fatal(err)
			}
			_ = json.Unmarshal([]byte(tc.want), &w)
			if !reflect.DeepEqual(g, w) {
				t.Fatalf("merged %s, want %s", got, tc.want)
			}
		})
	}
	if _, err := mergeLists([][]byte{[]byte(`[]`), []byte(`{"not":"a list"}`)}); err == nil {
		t.Fatal("an array and an object merged")
	}
}

func TestLearnAndBound(t *testing.T) {
	g := &Gateway{where: newLocations(3)}
	learnJails(g, "n1", []byte(`{"jails":[{"id":"j1","name":"web"},{"id":"j2"}]}`))
	for key, want := range map[string]string{"jail/j1": "n1", "jail/web": "n1", "jail/j2": "n1"} {
		if got, ok := g.where.get(key); !ok || got != want {
			t.Fatalf("%s: %q %v", key, got, ok)
		}
	}
	// A fourth location clears the full table rather than grow it.
	g.where.put("e2b/x", "n2")
	if _, ok := g.where.get("jail/j1"); ok || len(g.where.m) != 1 {
		t.Fatalf("the table grew past its bound: %v", g.where.m)
	}
}
