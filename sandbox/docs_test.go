package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/jsonschema"
)

// TestToolDocs keeps docs/tools.md in step with the registry: the reference
// is generated from each tool's input and output types. Regenerate with
// UPDATE_DOCS=1 go test ./sandbox -run TestToolDocs.
func TestToolDocs(t *testing.T) {
	got := toolDocs()
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
` + "`is_error`" + `; a failed call is ` + "`{\"is_error\": true, \"error\": \"...\"}`" + ` with a
message a model can act on. Every tool that works in a box takes ` + "`sandbox`" + `
(default ` + "`default`" + `): the box's name in the session, created on first use.
Paths are absolute or relative to ` + "`/workspace`" + `; file tools work under
` + "`/workspace`" + ` and ` + "`/tmp`" + ` only (after resolving ` + "`..`" + ` and symlinks).

`)
	for _, tool := range Tools() {
		fmt.Fprintf(&b, "## `%s`\n\n%s\n\n", tool.Name, tool.Description)
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
				fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", name, typeName(p), req, def, cell(p))
			}
			b.WriteString("\n")
		}
		if tool.Output != nil {
			out := jsonschema.For(tool.Output)
			var names []string
			for _, name := range out.PropertyOrder {
				names = append(names, "`"+name+"` ("+typeName(out.Properties[name])+")")
			}
			if len(names) > 0 {
				fmt.Fprintf(&b, "Result: %s.\n\n", strings.Join(names, ", "))
			}
		}
	}
	return b.String()
}

func typeName(s *jsonschema.Schema) string {
	switch {
	case s.Type == "array" && s.Items != nil:
		return typeName(s.Items) + "[]"
	case s.Ref != "":
		return "object" // For makes $refs to recursive structs only
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
