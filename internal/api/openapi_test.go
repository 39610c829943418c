package api

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/model"
)

type openAPIDoc struct {
	Paths      map[string]map[string]any `json:"paths"`
	Components struct {
		Schemas map[string]struct {
			Properties map[string]any `json:"properties"`
		} `json:"schemas"`
	} `json:"components"`
}

func loadOpenAPI(t *testing.T) *openAPIDoc {
	t.Helper()
	b, err := os.ReadFile("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc openAPIDoc
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("api/openapi.yaml: %v", err)
	}
	return &doc
}

// openAPIPath converts a ServeMux pattern to an OpenAPI path template.
func openAPIPath(pattern string) string { return strings.ReplaceAll(pattern, "...}", "}") }

func TestOpenAPIRoutes(t *testing.T) {
	doc := loadOpenAPI(t)
	inTable := map[string]bool{}
	for _, rt := range routes {
		key := rt.method + " " + openAPIPath(rt.pattern)
		inTable[key] = true
		ops := doc.Paths[openAPIPath(rt.pattern)]
		if _, ok := ops[strings.ToLower(rt.method)]; !ok {
			t.Errorf("route %s is not documented", key)
		}
	}
	methods := []string{"get", "put", "post", "delete", "patch", "head", "options", "trace"}
	for p, ops := range doc.Paths {
		for m := range ops {
			if !slices.Contains(methods, m) {
				continue // parameters, summary, ...
			}
			if key := strings.ToUpper(m) + " " + p; !inTable[key] {
				t.Errorf("documented operation %s is not in the route table", key)
			}
		}
	}
}

// jsonNames lists the JSON property names of a struct type, flattening
// embedded structs as encoding/json does.
func jsonNames(t reflect.Type) []string {
	var out []string
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			out = append(out, jsonNames(ft)...)
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

func TestOpenAPISchemas(t *testing.T) {
	doc := loadOpenAPI(t)
	for name, v := range map[string]any{
		"Jail":            model.Jail{},
		"Agent":           config.Agent{},
		"Workspace":       config.Workspace{},
		"Sync":            config.Sync{},
		"AgentTool":       model.AgentTool{},
		"AgentInfo":       model.AgentInfo{},
		"AgentRunRequest": model.AgentRunRequest{},
		"SyncResult":      model.SyncResult{},
		"Stats":           model.Stats{},
		"CreateRequest":   model.CreateRequest{},
		"ExecRequest":     model.ExecRequest{},
		"ExecResult":      model.ExecResult{},
		"StreamEvent":     StreamEvent{},
		"FileInfo":        model.FileInfo{},
		"DirListing":      DirListing{},
		"AccessResult":    model.AccessResult{},
		"Health":          model.Health{},
		"Check":           model.Check{},
		"Level":           model.Level{},
		"Capabilities":    model.Capabilities{},
		"JailList":        JailList{},
		"Whoami":          Whoami{},
		"StatsSample":     StatsSample{},
		"StopRequest":     StopRequest{},
		"Error":           ErrorBody{},
		"Config":          config.Config{},
		"Isolation":       config.Isolation{},
		"Filesystem":      config.Filesystem{},
		"Mount":           config.Mount{},
		"Network":         config.Network{},
		"EgressRule":      config.EgressRule{},
		"IngressRule":     config.IngressRule{},
		"InterAgentRule":  config.InterAgentRule{},
		"Resources":       config.Resources{},
		"Process":         config.Process{},
		"Namespaces":      config.Namespaces{},
		"SeccompProfile":  config.SeccompProfile{},
		"SeccompSyscall":  config.SeccompSyscall{},
		"SeccompArg":      config.SeccompArg{},
		"Tracing":         config.Tracing{},
		"NetworkLimits":   config.NetworkLimits{},
		"Credential":      config.Credential{},
		"ObservedProcess": model.Process{},
		"ProcessTree":     model.ProcessTree{},
		"Change":          model.Change{},
		"FsDiff":          model.FsDiff{},
		"SyscallStat":     model.SyscallStat{},
		"FileStat":        model.FileStat{},
		"NetStat":         model.NetStat{},
		"Report":          model.Report{},
		"FileCheck":       model.FileCheck{},
		"Recording":       config.Recording{},
		"TerminalMessage": TerminalMessage{},
		"ErrorDetail":     ErrorDetail{},
		"TerminalSession": model.TerminalSession{},
		"TerminalList":    TerminalList{},
		"TerminalTicket":  TerminalTicket{},
		"RecordingInfo":   model.Recording{},
		"RecordingList":   RecordingList{},
		"Image":           model.Image{},
		"ImageLayer":      model.ImageLayer{},
		"ImageConfig":     model.ImageConfig{},
		"ImageUsage":      model.ImageUsage{},
		"ImageList":       ImageList{},
		"PullRequest":     PullRequest{},
		"PullProgress":    model.PullProgress{},
		"ImageEvent":      ImageEvent{},
		"ImageRemoval":    model.ImageRemoval{},
		"PruneRequest":    PruneRequest{},
		"ImagePrune":      model.ImagePrune{},
		"CommitRequest":   model.CommitRequest{},
		"Profile":         model.Profile{},
		"ProfileList":     ProfileList{},
		"ProfileBuild":    model.ProfileBuild{},
	} {
		s, ok := doc.Components.Schemas[name]
		if !ok {
			t.Errorf("schema %s is not documented", name)
			continue
		}
		var documented []string
		for p := range s.Properties {
			documented = append(documented, p)
		}
		slices.Sort(documented)
		if want := jsonNames(reflect.TypeOf(v)); !slices.Equal(documented, want) {
			t.Errorf("schema %s has properties %v; the Go type has %v", name, documented, want)
		}
	}
}

// TestOpenAPIRefs checks that every $ref in the document points at a
// component that exists.
func TestOpenAPIRefs(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "api", "openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	refs := regexp.MustCompile(`\$ref: "#/components/([a-z]+)/([A-Za-z_]+)"`).FindAllStringSubmatch(string(data), -1)
	if len(refs) == 0 {
		t.Fatal("no $ref found")
	}
	comps, _ := doc["components"].(map[string]any)
	for _, r := range refs {
		group, _ := comps[r[1]].(map[string]any)
		if _, ok := group[r[2]]; !ok {
			t.Errorf("$ref to missing component %s/%s", r[1], r[2])
		}
	}
}
