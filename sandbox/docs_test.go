package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/jsonschema"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/tools"
)

// TestToolDocs keeps docs/tools.md in step with the registry: the reference
// is generated from each tool's input and output types. Regenerate with
// UPDATE_DOCS=1 go test ./sandbox -run TestToolDocs.
func TestToolDocs(t *testing.T) {
	got := toolDocs()
	require.Equal(t, strings.Count(got, "\n## `")+strings.Count(got, "\n#### `"), strings.Count(got, "\nResult: "), "every tool's section (profiles' too) says what its result holds")
	path := filepath.Join("..", "docs", "tools.md")
	if os.Getenv("UPDATE_DOCS") != "" {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, string(want), got, "docs/tools.md is stale: run UPDATE_DOCS=1 go test ./sandbox -run TestToolDocs")
}

func toolDocs() string {
	var b strings.Builder
	b.WriteString(`# Tools

<!-- Generated from the tool registry by TestToolDocs in sandbox/docs_test.go; do not edit by hand. -->

Every tool is served by one registry, over HTTP (` + "`POST /v1/sessions/{id}/tools/{name}`" + `),
the CLI (` + "`cellbox tool NAME '{json}'`" + `) and ` + "`GET /v1/tools`" + ` (name, description,
JSON Schema of the input). A result is a JSON object with the fields below and
` + "`is_error`" + `; a failed call is ` + "`{\"is_error\": true, \"error\": \"...\", \"code\": \"...\"}`" + ` with a
message a model can act on and a code a program can act on (` + "`invalid_input`, `not_found`, `no_box`, `no_session`, `outside_workspace`, `exists`, `too_large`, `timeout`, `refused`, `limit`, `unavailable`, `internal`" + `; see
[api.md](api.md#sessions-and-tools)). Every tool that works in a box takes ` + "`sandbox`" + `
(default ` + "`default`" + `): the box's name in the session, created on first use.
Paths are absolute or relative to ` + "`/workspace`" + `; file tools work under
` + "`/workspace`" + ` and ` + "`/tmp`" + ` only (after resolving ` + "`..`" + ` and symlinks).

`)
	for _, tool := range Tools() {
		writeToolDoc(&b, "##", tool)
	}
	b.WriteString(`## Profiles

Agents written against another tool set use it unchanged through a profile:
` + "`GET /v1/tools?profile=NAME`" + ` lists its tools, and
` + "`POST /v1/sessions/{id}/tools/{name}?profile=NAME`" + ` calls one. Each profile
tool is served by the registry tool named beside it (same confinement, caps,
` + "`allowed_commands`" + ` and notices); only names, fields and result shapes
differ. Tools without a ` + "`sandbox`" + ` field work in the session's ` + "`default`" + ` box.
A result keeps ` + "`is_error`" + ` (and ` + "`error`" + `, ` + "`notice`" + `); a tool whose seed
returns a plain string puts it in ` + "`output`" + `.

`)
	for _, p := range Profiles()[1:] {
		fmt.Fprintf(&b, "### Profile `%s`\n\nFrom %s.\n\n", p.Name, p.Seed)
		for _, tool := range p.Tools() {
			writeToolDoc(&b, "####", tool)
		}
	}
	return b.String()
}

// writeToolDoc writes one tool's section: description, input table and
// result fields.
func writeToolDoc(b *strings.Builder, heading string, tool *tools.Tool) {
	fmt.Fprintf(b, "%s `%s`\n\n", heading, tool.Name)
	if tool.Base != "" {
		fmt.Fprintf(b, "Served by `%s`. ", tool.Base)
	}
	fmt.Fprintf(b, "%s\n\n", tool.Description)
	in := jsonschema.For(tool.Input)
	if len(in.Properties) == 0 {
		b.WriteString("Input: none.\n\n")
	} else {
		b.WriteString("| input | type | required | default | description |\n|---|---|---|---|---|\n")
		for _, name := range in.PropertyOrder {
			p := in.Properties[name]
			def := ""
			if p.Default != nil {
				def = "`" + string(p.Default) + "`"
			}
			req := ""
			if slices.Contains(in.Required, name) {
				req = "yes"
			}
			fmt.Fprintf(b, "| `%s` | %s | %s | %s | %s |\n", name, typeName(p), req, def, cell(p))
		}
		b.WriteString("\n")
	}
	outs := resultsOf[tool.Name]
	if tool.Output != nil {
		outs = []reflect.Type{tool.Output}
	}
	var results []string
	for _, t := range outs {
		var names []string
		out := jsonschema.For(t)
		for _, name := range out.PropertyOrder {
			names = append(names, "`"+name+"` ("+typeName(out.Properties[name])+")")
		}
		if len(names) > 0 {
			results = append(results, strings.Join(names, ", "))
		}
	}
	if len(results) > 0 {
		fmt.Fprintf(b, "Result: %s.\n\n", strings.Join(results, "; or "))
	}
}

// resultsOf names the result types of the tools whose handlers return any
// (one of several types).
var resultsOf = map[string][]reflect.Type{
	"shell": {reflect.TypeOf(api.ShellOutput{}), reflect.TypeOf(tools.ShellBackground{})}, // run, or background: true
}

func typeName(s *jsonschema.Schema) string {
	switch {
	case s.Type == "array" && s.Items != nil:
		return typeName(s.Items) + "[]"
	case s.Ref != "":
		return "object" // For makes $refs to recursive structs only
	case len(s.AnyOf) > 0:
		var alts []string
		for _, a := range s.AnyOf {
			alts = append(alts, typeName(a))
		}
		return strings.Join(alts, " or ")
	case s.Type == "":
		return "any"
	}
	return s.Type
}

func cell(s *jsonschema.Schema) string {
	d := strings.ReplaceAll(s.Description, "|", "\\|")
	if len(s.Enum) > 0 {
		var vs []string
		for _, e := range s.Enum {
			vs = append(vs, fmt.Sprint(e))
		}
		d += " One of: " + strings.Join(vs, ", ") + "."
	}
	return strings.TrimSpace(d)
}
