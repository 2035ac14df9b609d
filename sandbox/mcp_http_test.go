package sandbox

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/mcptest"
)

// connectInMemory connects to s.MCPServer of a new session.
func connectInMemory(t *testing.T, s *Service) *mcptest.Client {
	t.Helper()
	id, _, err := s.NewSession(context.Background())
	require.NoError(t, err)
	srv, err := s.MCPServer(id)
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

// TestMCPSessionPerClient: /v1/mcp gives every MCP session a cellbox
// session of its own, deleted with its boxes when the client ends it.
func TestMCPSessionPerClient(t *testing.T) {
	s := newTestService(t, newFakeBackend(t), "", nil)
	url := startHTTP(t, s)
	a, b := mcptest.MustConnect(t, mcptest.HTTP(url+"/v1/mcp", "")), mcptest.MustConnect(t, mcptest.HTTP(url+"/v1/mcp", ""))
	assert.Equal(t, "2025-11-25", a.InitializeResult().ProtocolVersion, "the newest version of sessions")
	assert.Equal(t, "cellbox", a.InitializeResult().ServerInfo.Name)
	assert.Equal(t, MCPInstructions, a.InitializeResult().Instructions)
	assert.NotEmpty(t, a.ID(), "Mcp-Session-Id")
	assert.NotEqual(t, a.ID(), b.ID())

	res, _ := a.Call(t, "write_file", map[string]any{"path": "note.txt", "content": "from a"})
	require.False(t, res.IsError)
	res, m := b.Call(t, "read_file", map[string]any{"path": "note.txt"})
	assert.True(t, res.IsError, "b's box is not a's")
	assert.Contains(t, m["error"], "no such file")
	_, m = a.Call(t, "read_file", map[string]any{"path": "note.txt"})
	assert.Equal(t, "from a", m["content"])
	sessions := mcptest.Sessions(t, url, "")
	require.Len(t, sessions, 2)

	require.NoError(t, a.Close()) // DELETE with Mcp-Session-Id
	require.Eventually(t, func() bool { return len(mcptest.Sessions(t, url, "")) == 1 }, 10*time.Second, 20*time.Millisecond)
	_, m = b.Call(t, "sandbox_list", nil)
	assert.Len(t, m["sandboxes"], 1, "b keeps its box")
}

// TestMCPInExistingSession: /v1/sessions/{id}/mcp runs in that session,
// with its token only.
func TestMCPInExistingSession(t *testing.T) {
	s := newTestService(t, newFakeBackend(t), "", nil)
	url := startHTTP(t, s)
	a, b := newHTTPSession(t, url), newHTTPSession(t, url)
	c := mcptest.MustConnect(t, mcptest.HTTP(url+"/v1/sessions/"+a.id+"/mcp", a.token))
	res, _ := c.Call(t, "write_file", map[string]any{"path": "note.txt", "content": "from mcp"})
	require.False(t, res.IsError)
	assert.Equal(t, "from mcp", a.tool("read_file", map[string]any{"path": "note.txt"})["content"])

	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	list := `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`
	tests := []struct {
		name, id, token  string
		mcpSession, body string
		status           int
		msg              string
	}{
		{name: "a's MCP session with b's token", id: b.id, token: b.token, mcpSession: c.ID(), body: list, status: http.StatusForbidden, msg: "session user mismatch"},
		{name: "another session's token", id: a.id, token: b.token, body: init, status: http.StatusForbidden, msg: "token does not grant access"},
		{name: "no token", id: a.id, body: init, status: http.StatusUnauthorized, msg: "missing bearer token"},
		{name: "unknown session", id: "s-0000000000000000", token: a.token, body: init, status: http.StatusNotFound, msg: "no such session"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, url+"/v1/sessions/"+tt.id+"/mcp", strings.NewReader(tt.body))
			require.NoError(t, err)
			if tt.mcpSession != "" {
				req.Header.Set("Mcp-Session-Id", tt.mcpSession)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if tt.token != "" {
				req.Header.Set("Authorization", "Bearer "+tt.token)
			}
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, tt.status, resp.StatusCode)
			assert.Contains(t, string(body), tt.msg)
		})
	}
	require.NoError(t, c.Close())
	assert.Equal(t, "from mcp", a.tool("read_file", map[string]any{"path": "note.txt"})["content"], "ending the MCP session keeps the session")
}

// TestMCPCancelKillsCommand: cancelling a running shell call (the client
// sends notifications/cancelled) kills the command; its output came as
// progress before.
func TestMCPCancelKillsCommand(t *testing.T) {
	s := newTestService(t, newFakeBackend(t), "", nil)
	url := startHTTP(t, s)
	h := newHTTPSession(t, url)
	for _, tr := range []struct {
		name    string
		connect func() *mcptest.Client
	}{
		{"http", func() *mcptest.Client {
			return mcptest.MustConnect(t, mcptest.HTTP(url+"/v1/sessions/"+h.id+"/mcp", h.token))
		}},
		{"in memory", func() *mcptest.Client { return connectInMemory(t, s) }},
	} {
		t.Run(tr.name, func(t *testing.T) { tr.connect().CancelSleep(t) })
	}
}

// TestMCPProgressAndLogs: shell output comes as progress (with a token)
// and as log messages at level debug once the client sets it
// (logging/setLevel: protocol 2025-11-25; 2026-07-28 asks per request).
func TestMCPProgressAndLogs(t *testing.T) {
	s := newTestService(t, newFakeBackend(t), "", nil)
	c := mcptest.MustConnect(t, mcptest.HTTP(startHTTP(t, s)+"/v1/mcp", ""))
	params := &mcp.CallToolParams{Name: "shell", Arguments: map[string]any{"command": "echo one; echo two >&2; printf three"}}
	params.SetProgressToken(7)
	res, err := c.CallTool(context.Background(), params)
	require.NoError(t, err)
	require.False(t, res.IsError)
	// The client handles notifications apart from the answer: wait for them.
	require.Eventually(t, func() bool { return len(c.Progress()) == 3 }, 10*time.Second, 10*time.Millisecond)
	assert.ElementsMatch(t, []string{"one", "stderr: two", "three"}, c.Progress())

	require.NoError(t, c.SetLoggingLevel(context.Background(), &mcp.SetLoggingLevelParams{Level: "debug"}))
	c.Call(t, "shell", map[string]any{"command": "echo logged"})
	require.Eventually(t, func() bool { return len(c.Logs()) > 0 }, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, []string{"stdout: logged"}, c.Logs(), "only the call after logging/setLevel logs")
	assert.Len(t, c.Progress(), 3, "no progress without a progressToken")
}

// TestMCPToolMetadata: every tool has a title, annotations and an output
// schema that is valid JSON Schema, and structuredContent matches it.
func TestMCPToolMetadata(t *testing.T) {
	for _, tool := range Tools() {
		assert.NotEmpty(t, tool.Meta.Title, "give a new tool its ToolMeta in defineTool")
	}
	s := newTestService(t, newFakeBackend(t), "", nil)
	c := connectInMemory(t, s)
	list, err := c.ListTools(context.Background(), nil)
	require.NoError(t, err)
	require.Len(t, list.Tools, len(Tools()))
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
	}
	for _, tc := range calls {
		res, _ := c.Call(t, tc.tool, tc.args)
		require.False(t, res.IsError, "%s: %v", tc.tool, res.Content[0])
		var instance any
		require.NoError(t, json.Unmarshal([]byte(mustMarshal(t, res.StructuredContent)), &instance))
		assert.NoError(t, schemas[tc.tool].Validate(instance), "%s: %s", tc.tool, mustMarshal(t, res.StructuredContent))
	}
}

// TestMCPBoxResources: box files are resources of a template, read with
// read_file's rules.
func TestMCPBoxResources(t *testing.T) {
	s := newTestService(t, newFakeBackend(t), "", nil)
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

	abs := "/tmp/mcp-resource-" + randomID(4)
	t.Cleanup(func() { os.Remove(abs) })
	c.Call(t, "write_file", map[string]any{"path": abs, "content": "absolute"})
	res, err = c.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "cellbox://box/default/" + abs})
	require.NoError(t, err, "an absolute path after a double slash")
	assert.Equal(t, "absolute", res.Contents[0].Text)
	_, err = c.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "cellbox://box/default//etc/passwd"})
	assert.ErrorContains(t, err, "outside the workspace", "the file tools' rules hold")

	_, err = c.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "cellbox://box/default/missing.txt"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no such file")
}

// TestMCPSessionExpires: an MCP session of /v1/mcp idle for SessionTTL is
// closed by the SDK, and its cellbox session deleted with its boxes.
func TestMCPSessionExpires(t *testing.T) {
	f := newFakeBackend(t)
	s := newTestService(t, f, "", func(c *Config) { c.SessionTTL = 300 * time.Millisecond })
	url := startHTTP(t, s)
	c := mcptest.MustConnect(t, mcptest.HTTP(url+"/v1/mcp", ""))
	res, _ := c.Call(t, "write_file", map[string]any{"path": "a.txt", "content": "x"})
	require.False(t, res.IsError)
	require.Len(t, mcptest.Sessions(t, url, ""), 1)
	require.Eventually(t, func() bool { return len(mcptest.Sessions(t, url, "")) == 0 && f.count() == 0 }, 10*time.Second, 20*time.Millisecond,
		"the idle MCP session ends, and its session and box with it")
}
