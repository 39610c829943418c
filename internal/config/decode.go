package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"sigs.k8s.io/yaml"

	"github.com/agentjail/agentjail/internal/errdefs"
)

// DecodeJSON decodes one JSON document from data into v, rejecting unknown
// keys and trailing data. Errors are errdefs.ErrInvalid and name the field
// or the byte offset at fault.
func DecodeJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return describeJSONError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errdefs.Invalidf("invalid JSON: unexpected data after the document")
	}
	return nil
}

// DecodeYAML decodes a YAML (or JSON) document into v with the same rules
// as DecodeJSON.
func DecodeYAML(data []byte, v any) error {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return errdefs.Invalidf("invalid YAML: %v", err)
	}
	return DecodeJSON(js, v)
}

func describeJSONError(err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.Is(err, io.EOF):
		return errdefs.Invalidf("invalid JSON: empty body")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errdefs.Invalidf("invalid JSON: unexpected end of input")
	case errors.As(err, &syn):
		return errdefs.Invalidf("invalid JSON at byte %d: %v", syn.Offset, syn)
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			field = "(document)"
		}
		return errdefs.Invalidf("%s: expected %s, got JSON %s", field, typ.Type, typ.Value)
	}
	msg := err.Error()
	const unknown = "json: unknown field "
	if len(msg) > len(unknown) && msg[:len(unknown)] == unknown {
		return errdefs.Invalidf("unknown field %s", msg[len(unknown):])
	}
	return errdefs.Invalidf("invalid JSON: %v", fmt.Sprint(err))
}
