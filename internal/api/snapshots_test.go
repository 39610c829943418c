package api

import (
	"reflect"
	"slices"
	"testing"

	"github.com/agentjail/agentjail/internal/model"
)

// TestOpenAPISnapshotSchemas keeps the snapshot schemas of api/openapi.yaml
// true to the Go types' json tags.
func TestOpenAPISnapshotSchemas(t *testing.T) {
	doc := loadOpenAPI(t)
	for name, v := range map[string]any{
		"Lineage":             model.Lineage{},
		"Snapshot":            model.Snapshot{},
		"SnapshotRequest":     model.SnapshotRequest{},
		"RestoreRequest":      model.RestoreRequest{},
		"BranchRequest":       model.BranchRequest{},
		"SnapshotList":        SnapshotList{},
		"BranchList":          BranchList{},
		"SnapshotSource":      model.SnapshotSource{},
		"SnapshotPushRequest": model.SnapshotPushRequest{},
		"SnapshotPullRequest": model.SnapshotPullRequest{},
		"SnapshotPush":        model.SnapshotPush{},
	} {
		schema, ok := doc.Components.Schemas[name]
		if !ok {
			t.Errorf("schema %s is missing", name)
			continue
		}
		var documented []string
		for p := range schema.Properties {
			documented = append(documented, p)
		}
		slices.Sort(documented)
		if want := jsonNames(reflect.TypeOf(v)); !slices.Equal(documented, want) {
			t.Errorf("schema %s has properties %v; the Go type has %v", name, documented, want)
		}
	}
}
