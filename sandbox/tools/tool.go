// Package tools is the machinery of cellbox's tool registry, apart from
// what any tool does: how a tool is defined (a name, a title and hints, a
// description, a typed input whose JSON Schema is generated from its
// struct), how a call's input is decoded and checked with errors a model
// can act on, how tools make up profiles (cellbox's own set, and the tool
// sets of other agent APIs mapped onto its handlers), and how a result
// object is written.
//
// It knows nothing of boxes or sessions. The sandbox service defines its
// tools with Define, each handler taking the service's own per-call value,
// and runs one with Tool.Run; the HTTP API, MCP, the CLI and the llm
// built-in serve the same Tools, so their names, schemas and errors are the
// same everywhere.
package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"

	"github.com/cellbox/cellbox/internal/jsonschema"
	"github.com/cellbox/cellbox/sandbox/api"
)

// Tool is one tool: what describes it to a client, and its handler.
type Tool struct {
	Name        string
	Description string
	// InputSchema is the JSON Schema of the input, generated from the input
	// struct.
	InputSchema json.RawMessage
	// Input is the input struct's type.
	Input reflect.Type
	// Output is the result struct's type (the fields of a successful
	// result, beside is_error); docs/tools.md is generated from both.
	Output reflect.Type
	// Profile is the name of the profile the tool belongs to (set by
	// NewProfile).
	Profile string
	// Base is, for a profile's tool, the default profile's tool whose
	// handler serves it (its Meta applies); "" for the default profile's
	// own tools.
	Base string
	// TextResult says the tool's seed returns a plain string: the result's
	// "output" field is what a model should see (see ResultText).
	TextResult bool
	// Meta is the tool's title and behaviour hints (MCP's annotations).
	Meta Meta

	fields   []string // property names, sorted
	required []string
	// stringIdx are the input's string fields by JSON name (their index
	// paths), which decode fills from long raw strings directly.
	stringIdx map[string][]int
	run       func(ctx context.Context, c any, raw json.RawMessage) (any, error)
}

// Meta is what a tool says about itself beyond its input and output: a
// title for people and the hints a client uses to decide whether to ask
// before calling it (MCP's tool annotations). Every tool has one, given
// where the tool is defined (Define refuses a tool without a title).
type Meta struct {
	Title string
	// ReadOnly: the tool changes nothing.
	ReadOnly bool
	// Destructive: the tool may delete or overwrite (meaningful when not
	// ReadOnly).
	Destructive bool
	// Idempotent: calling it again with the same input changes nothing
	// more.
	Idempotent bool
	// OpenWorld: the tool may reach beyond the session's boxes (a command
	// with network access); false for tools that work on the boxes only.
	OpenWorld bool
}

// Define makes a tool whose input is In and whose successful output is Out
// (a struct: its fields are the result's). h gets the decoded input
// (unknown fields, missing required ones, values of the wrong type and text
// that is not valid UTF-8 are refused before) and the per-call value c that
// Run is given, which must be a C. A tool without a title panics: it is a
// mistake in the code that defines it.
func Define[C, In, Out any](name string, meta Meta, description string, h func(ctx context.Context, c C, in In) (Out, error)) *Tool {
	if meta.Title == "" {
		panic("tools: tool " + name + " has no title: give its Meta where it is defined")
	}
	var zero In
	schema := jsonschema.For(reflect.TypeOf(zero))
	raw, err := json.Marshal(schema)
	if err != nil {
		panic(fmt.Sprintf("tools: schema of tool %s: %v", name, err))
	}
	var out Out
	t := &Tool{Name: name, Description: description, InputSchema: raw, Input: reflect.TypeOf(zero), Output: reflect.TypeOf(out), Meta: meta}
	t.fields = slices.Sorted(maps.Keys(schema.Properties))
	t.required = schema.Required
	t.stringIdx = stringFields(reflect.TypeOf(zero))
	_, t.TextResult = any(out).(TextOutput)
	t.run = func(ctx context.Context, c any, raw json.RawMessage) (any, error) {
		var in In
		if err := t.decode(raw, &in); err != nil {
			return nil, api.WithCode(api.CodeInvalidInput, err)
		}
		return h(ctx, c.(C), in)
	}
	return t
}

// Map defines a profile's tool: name and input type In are its seed's, base
// is the default profile's tool whose handler h calls (its Meta applies).
func Map[C, In, Out any](base *Tool, name, description string, h func(ctx context.Context, c C, in In) (Out, error)) *Tool {
	t := Define(name, base.Meta, description, h)
	t.Base = base.Name
	return t
}

// Run decodes raw as the tool's input and calls its handler with c, which
// must be of the type the tool was defined with. An input the tool refuses
// is an error with the code invalid_input.
func (t *Tool) Run(ctx context.Context, c any, raw json.RawMessage) (any, error) {
	return t.run(ctx, c, raw)
}

// TextOutput is the output of a tool whose seed returns a plain string: a
// tool defined with it has TextResult set.
type TextOutput struct {
	Output string `json:"output"`
}

// ResultText is the text a model should see for a result object of t: for
// a tool whose seed returns a plain string (TextResult), that string (or
// the error message, with any notice after it); otherwise the object
// itself.
func (t *Tool) ResultText(result json.RawMessage) string {
	if !t.TextResult {
		return string(result)
	}
	var r struct {
		Error  string `json:"error"`
		Notice string `json:"notice"`
		Output string `json:"output"`
	}
	if err := json.Unmarshal(result, &r); err != nil {
		return string(result)
	}
	text := r.Output
	if r.Error != "" {
		text = "Error: " + r.Error
	}
	if r.Notice != "" {
		text += "\n(" + r.Notice + ")"
	}
	return text
}
