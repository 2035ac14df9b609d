package mcpserver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"testing"

	"github.com/cellbox/cellbox/internal/mcptest"
	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/sandboxtest"
	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// connectInMemory connects to a server of ForSession of a new session.
func connectInMemory(t *testing.T, s *sandbox.Service) *mcptest.Client {
	t.Helper()
	id, _, err := s.NewSession(context.Background())
	require.NoError(t, err)
	srv, err := ForSession(s, id, "")
	require.NoError(t, err)
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(context.Background(), st, nil)
	require.NoError(t, err)
	t.Cleanup(func() { ss.Close() })
	return mcptest.MustConnect(t, ct)
}

func mustMarshal(t *testing.T, v any) string {
	raw, err := json.Marshal(v)
	require.NoError(t, err)
	return string(raw)
}

// TestMCPToolMetadata: every tool has a title, annotations and an output
// schema that is valid JSON Schema, and structuredContent matches it.
func TestMCPToolMetadata(t *testing.T) {
	for _, tool := range sandbox.Tools() {
		assert.NotEmpty(t, tool.Meta.Title, "give a new tool its tools.Meta where it is defined")
	}
	s, _ := sandboxtest.Service(t, sandboxtest.Options{})
	c := connectInMemory(t, s)
	list, err := c.ListTools(context.Background(), nil)
	require.NoError(t, err)
	require.Len(t, list.Tools, len(sandbox.Tools()))
	schemas := map[string]*jsonschema.Resolved{}
	for _, tool := range list.Tools {
		require.NotNil(t, tool.Annotations, tool.Name)
		assert.NotEmpty(t, tool.Title, tool.Name)
		raw, err := json.Marshal(tool.OutputSchema)
		require.NoError(t, err)
		var schema jsonschema.Schema
		require.NoError(t, json.Unmarshal(raw, &schema), tool.Name)
		assert.Equal(t, "object", schema.Type, tool.Name)
		schemas[tool.Name], err = schema.Resolve(nil)
		require.NoError(t, err, tool.Name)
		a := tool.Annotations
		switch tool.Name {
		case "read_file", "grep", "glob", "ls", "sandbox_list":
			assert.True(t, a.ReadOnlyHint, tool.Name)
			assert.True(t, a.IdempotentHint, tool.Name)
		case "sandbox_destroy", "write_file", "edit", "str_replace", "shell":
			assert.False(t, a.ReadOnlyHint, tool.Name)
			require.NotNil(t, a.DestructiveHint, tool.Name)
			assert.True(t, *a.DestructiveHint, tool.Name)
		case "sandbox_create":
			assert.False(t, *a.DestructiveHint)
			assert.True(t, a.IdempotentHint)
		}
	}
	calls := []struct {
		tool string
		args map[string]any
	}{
		{"shell", map[string]any{"command": "echo hi"}},
		{"shell", map[string]any{"command": "sleep 1", "background": true}},
		{"write_file", map[string]any{"path": "a.txt", "content": "one\ntwo\n"}},
		{"read_file", map[string]any{"path": "a.txt"}},
		{"edit", map[string]any{"path": "a.txt", "edits": []any{map[string]any{"oldText": "one", "newText": "uno"}}}},
		{"str_replace", map[string]any{"path": "a.txt", "old_str": "two", "new_str": "dos"}},
		{"grep", map[string]any{"pattern": "uno", "path": "."}},
		{"glob", map[string]any{"pattern": "*.txt"}},
		{"ls", map[string]any{"path": "."}},
		{"process", map[string]any{"action": "list"}},
		{"sandbox_create", map[string]any{"sandbox": "other"}},
		{"transfer", map[string]any{"from_sandbox": "default", "from_path": "a.txt", "to_sandbox": "other", "to_path": "b.txt"}},
		{"sandbox_list", nil},
		{"sandbox_destroy", map[string]any{"sandbox": "other"}},
		{"run_code", map[string]any{"language": "python", "code": "display('<b>x</b>', mime='text/html')\n1"}},
		{"code_context_create", map[string]any{"language": "bash"}},
		{"code_context_list", nil},
	}
	for _, tc := range calls {
		res, _ := c.Call(t, tc.tool, tc.args)
		require.False(t, res.IsError, "%s: %v", tc.tool, res.Content[0])
		var instance any
		require.NoError(t, json.Unmarshal([]byte(mustMarshal(t, res.StructuredContent)), &instance))
		assert.NoError(t, schemas[tc.tool].Validate(instance), "%s: %s", tc.tool, mustMarshal(t, res.StructuredContent))
	}

	// An image among run_code's outputs (a plot) is image content too.
	res, _ := c.Call(t, "run_code", map[string]any{"language": "python", "code": "display(b'\\x89PNG\\r\\n', mime='image/png')"})
	require.False(t, res.IsError, "%v", res.Content[0])
	require.Len(t, res.Content, 2)
	img, ok := res.Content[1].(*mcp.ImageContent)
	require.True(t, ok, "%T", res.Content[1])
	assert.Equal(t, "image/png", img.MIMEType)
	assert.Equal(t, []byte("\x89PNG\r\n"), img.Data)
	// Sent once: the text (what a model reads) says where the image went
	// instead of repeating its base64; structuredContent keeps the data.
	b64 := base64.StdEncoding.EncodeToString(img.Data)
	text := res.Content[0].(*mcp.TextContent).Text
	assert.NotContains(t, text, b64)
	assert.Contains(t, text, `"data":"(image/png, 6 bytes: image content 2 of this result)"`)
	assert.True(t, json.Valid([]byte(text)), text)
	assert.Contains(t, mustMarshal(t, res.StructuredContent), b64)
}

// TestMCPBoxResources: box files are resources of a template, read with
// read_file's rules.
func TestMCPBoxResources(t *testing.T) {
	s, _ := sandboxtest.Service(t, sandboxtest.Options{})
	c := connectInMemory(t, s)
	tmpl, err := c.ListResourceTemplates(context.Background(), nil)
	require.NoError(t, err)
	require.Len(t, tmpl.ResourceTemplates, 1)
	assert.Equal(t, BoxResourceTemplate, tmpl.ResourceTemplates[0].URITemplate)

	c.Call(t, "write_file", map[string]any{"path": "dir/a.txt", "content": "hello\nworld\n"})
	c.Call(t, "write_file", map[string]any{"path": "bin", "content": "AAEC/w==", "encoding": "base64"})
	res, err := c.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "cellbox://box/default/dir/a.txt"})
	require.NoError(t, err)
	require.Len(t, res.Contents, 1)
	assert.Equal(t, "hello\nworld\n", res.Contents[0].Text)
	res, err = c.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "cellbox://box/default/bin"})
	require.NoError(t, err)
	assert.Equal(t, []byte{0, 1, 2, 255}, res.Contents[0].Blob)

	abs := "/tmp/mcp-resource"
	c.Call(t, "write_file", map[string]any{"path": abs, "content": "absolute"})
	res, err = c.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "cellbox://box/default/" + abs})
	require.NoError(t, err, "an absolute path after a double slash")
	assert.Equal(t, "absolute", res.Contents[0].Text)
	_, err = c.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "cellbox://box/default//etc/passwd"})
	assert.ErrorContains(t, err, "outside the workspace", "the file tools' rules hold")
	assertRPCCode(t, err, jsonrpc.CodeInvalidParams)

	_, err = c.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "cellbox://box/default/missing.txt"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no such file")
	assertRPCCode(t, err, jsonrpc.CodeInvalidParams) // MCP's "resource not found" (SEP-2164)
	_, err = c.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "cellbox://box/no/such/box/../x"})
	assertRPCCode(t, err, jsonrpc.CodeInvalidParams)

	// A sandbox the session does not have is not made by reading it.
	_, err = c.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "cellbox://box/nobox/x.txt"})
	assertRPCCode(t, err, jsonrpc.CodeInvalidParams)
	assert.ErrorContains(t, err, `this session has no sandbox named "nobox" (it has: default)`)
	_, list := c.Call(t, "sandbox_list", nil)
	assert.Len(t, list["sandboxes"], 1, "no box was made: %v", list)
}

// assertRPCCode checks err is a JSON-RPC error with code: a failed read
// of a box resource said code 0, which no client can tell apart.
func assertRPCCode(t *testing.T, err error, code int64) {
	t.Helper()
	var we *jsonrpc.Error
	require.ErrorAs(t, err, &we)
	assert.Equal(t, code, we.Code, we.Message)
}

// TestMCPCancelKillsCommand: cancelling a running shell call (the client
// sends notifications/cancelled) kills the command, in a server of
// ForSession (as cellbox mcp serves it on stdio); sandbox/httpapi tests
// the same over HTTP.
func TestMCPCancelKillsCommand(t *testing.T) {
	s, _ := sandboxtest.Service(t, sandboxtest.Options{})
	connectInMemory(t, s).CancelSleep(t)
}

// TestMCPProfiles: an MCP server of a seed profile lists exactly that
// profile's tools, each with its base tool's metadata, and a tool whose
// seed answers a plain string gives that string as its text.
func TestMCPProfiles(t *testing.T) {
	s, _ := sandboxtest.Service(t, sandboxtest.Options{})
	ctx := context.Background()
	for _, p := range sandbox.Profiles() {
		t.Run(p.Name, func(t *testing.T) {
			id, _, err := s.NewSession(ctx)
			require.NoError(t, err)
			srv, err := ForSession(s, id, p.Name)
			require.NoError(t, err)
			st, ct := mcp.NewInMemoryTransports()
			ss, err := srv.Connect(ctx, st, nil)
			require.NoError(t, err)
			t.Cleanup(func() { ss.Close() })
			c := mcptest.MustConnect(t, ct)
			list, err := c.ListTools(ctx, nil)
			require.NoError(t, err)
			want, err := sandbox.ToolInfosFor(p.Name)
			require.NoError(t, err)
			var names, wantNames []string
			for _, tool := range list.Tools {
				names = append(names, tool.Name)
				assert.NotEmpty(t, tool.Title, tool.Name)
				assert.NotNil(t, tool.Annotations, tool.Name)
			}
			for _, info := range want {
				wantNames = append(wantNames, info.Name)
			}
			assert.ElementsMatch(t, wantNames, names)
		})
	}
	id, _, err := s.NewSession(ctx)
	require.NoError(t, err)
	srv, err := ForSession(s, id, "deerflow")
	require.NoError(t, err)
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	require.NoError(t, err)
	t.Cleanup(func() { ss.Close() })
	c := mcptest.MustConnect(t, ct)
	res, err := c.CallTool(ctx, &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"description": "say hi", "command": "echo hi"}})
	require.NoError(t, err)
	require.False(t, res.IsError)
	assert.Equal(t, "hi\n", res.Content[0].(*mcp.TextContent).Text, "deerflow's bash answers its output as plain text")

	_, err = ForSession(s, id, "nosuch")
	assert.ErrorContains(t, err, "nosuch")
}
