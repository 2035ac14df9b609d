package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
)

// cleanEnv is the environment without the CELLBOX_ client settings.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CELLBOX_") {
			env = append(env, kv)
		}
	}
	return env
}

// mcpClient is the official SDK's client connected to cellbox; it hands
// progress messages to onProgress.
type mcpClient struct {
	*mcp.ClientSession
	progress chan string
}

func connect(t *testing.T, transport mcp.Transport) (*mcpClient, error) {
	c := &mcpClient{progress: make(chan string, 64)}
	opts := &mcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
		select {
		case c.progress <- req.Params.Message:
		default:
		}
	}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, opts).Connect(context.Background(), transport, nil)
	if err != nil {
		return nil, err
	}
	c.ClientSession = cs
	t.Cleanup(func() { cs.Close() })
	return c, nil
}

// startMCP runs `cellbox mcp args...` as an IDE would, and connects to it.
func startMCP(t *testing.T, args ...string) (*mcpClient, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(testenv.CellboxBinary(t), append([]string{"mcp"}, args...)...)
	cmd.Env = cleanEnv()
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	c, err := connect(t, &mcp.CommandTransport{Command: cmd})
	require.NoError(t, err, "stderr:\n%s", stderr)
	return c, stderr
}

// call runs a tool; the text is the result object, which is also the
// structuredContent of a successful call.
func (c *mcpClient) call(t *testing.T, name string, args map[string]any) (isError bool, result map[string]any) {
	t.Helper()
	res, err := c.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	require.NoError(t, err)
	require.Len(t, res.Content, 1)
	text := res.Content[0].(*mcp.TextContent).Text
	require.NoError(t, json.Unmarshal([]byte(text), &result), text)
	if !res.IsError {
		raw, err := json.Marshal(res.StructuredContent)
		require.NoError(t, err)
		assert.JSONEq(t, text, string(raw))
	}
	return res.IsError, result
}

// shell runs a command that must succeed.
func (c *mcpClient) shell(t *testing.T, command string) map[string]any {
	t.Helper()
	isError, out := c.call(t, "shell", map[string]any{"command": command})
	require.False(t, isError, out)
	return out
}

// checkTools checks the tool list has the registry with its metadata.
func (c *mcpClient) checkTools(t *testing.T) {
	t.Helper()
	list, err := c.ListTools(context.Background(), nil)
	require.NoError(t, err)
	tools := map[string]*mcp.Tool{}
	for _, tool := range list.Tools {
		tools[tool.Name] = tool
	}
	require.Contains(t, tools, "read_file")
	require.Contains(t, tools, "sandbox_destroy")
	require.NotNil(t, tools["read_file"].Annotations)
	require.NotNil(t, tools["sandbox_destroy"].Annotations)
	assert.True(t, tools["read_file"].Annotations.ReadOnlyHint)
	assert.True(t, *tools["sandbox_destroy"].Annotations.DestructiveHint)
	assert.NotNil(t, tools["shell"].OutputSchema)
}

// cancelSleep starts a sleep with a progress token, cancels the call once
// the command printed its pid, and checks the sleep is gone.
func (c *mcpClient) cancelSleep(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	params := &mcp.CallToolParams{Name: "shell", Arguments: map[string]any{"command": "echo $$; exec sleep 30", "timeout_ms": 120000}}
	params.SetProgressToken("sleep")
	done := make(chan error, 1)
	go func() {
		_, err := c.CallTool(ctx, params)
		done <- err
	}()
	var pid string
	select {
	case pid = <-c.progress:
	case err := <-done:
		t.Fatalf("the call ended before it printed: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("no progress with the command's first line")
	}
	require.Regexp(t, `^\d+$`, pid)
	cancel() // notifications/cancelled
	require.ErrorIs(t, <-done, context.Canceled)
	require.Eventually(t, func() bool {
		return c.shell(t, "kill -0 "+pid+" 2>/dev/null && echo alive || echo gone")["stdout"] == "gone\n"
	}, 10*time.Second, 50*time.Millisecond, "the cancelled sleep is killed")
}

// TestMCPStdio runs `cellbox mcp` with in-process boxes, as an IDE would.
func TestMCPStdio(t *testing.T) {
	testenv.RequireBwrap(t)
	data := t.TempDir()
	c, stderr := startMCP(t, "--data", data, "--backend", "local")
	assert.Equal(t, "cellbox", c.InitializeResult().ServerInfo.Name)
	assert.Equal(t, "2026-07-28", c.InitializeResult().ProtocolVersion, "the SDK's newest, by server/discover")
	c.checkTools(t)

	out := c.shell(t, "echo hi")
	assert.Equal(t, "hi\n", out["stdout"])
	assert.EqualValues(t, 0, out["exit_code"])

	// Files persist between calls in the session's box.
	c.call(t, "write_file", map[string]any{"path": "a.txt", "content": "one\n"})
	assert.Equal(t, "one\n", c.shell(t, "cat /workspace/a.txt")["stdout"])
	res, err := c.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "cellbox://box/default/a.txt"})
	require.NoError(t, err)
	assert.Equal(t, "one\n", res.Contents[0].Text)

	isError, out := c.call(t, "read_file", map[string]any{"path": "missing.txt"})
	assert.True(t, isError)
	assert.Contains(t, out["error"], "no such file")
	_, err = c.CallTool(context.Background(), &mcp.CallToolParams{Name: "nosuchtool"})
	assert.ErrorContains(t, err, `unknown tool "nosuchtool"`)

	c.cancelSleep(t)

	require.NoError(t, c.Close()) // closes stdin: the server ends
	assert.Contains(t, stderr.String(), "session deleted")
	boxes, err := os.ReadDir(filepath.Join(data, "boxes"))
	require.NoError(t, err)
	assert.Empty(t, boxes, "the session's boxes are destroyed on exit")
}

// TestMCPProxy runs `cellbox mcp --server` against a running cellbox serve,
// which creates a session for the life of the process.
func TestMCPProxy(t *testing.T) {
	testenv.RequireBwrap(t)
	data := t.TempDir()
	url := startServe(t, data, "--pool", "0").url

	c, stderr := startMCP(t, "--server", url, "--data", data) // the server key is DATA/server.key
	c.checkTools(t)
	assert.Equal(t, "hi\n", c.shell(t, "echo hi")["stdout"])
	isError, _ := c.call(t, "read_file", map[string]any{"path": "missing.txt"})
	assert.True(t, isError, "a tool error stays a result through the proxy")
	require.NoError(t, c.Close())
	assert.Regexp(t, `serving on stdio.*session=s-`, stderr.String())
	assert.NotContains(t, stderr.String(), "delete the MCP session", "the session it created is deleted on exit")

	out, err := exec.Command(testenv.CellboxBinary(t), "mcp", "--server", url, "--session", "s-1").CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "--session needs --token")
	out, err = exec.Command(testenv.CellboxBinary(t), "mcp", "--server", url, "--backend", "local").CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "--backend is for in-process boxes")
}

// keyed adds the server key to every request, as an MCP client configured
// with a URL and one header does.
type keyed struct{ key string }

func (k keyed) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if k.key != "" {
		r.Header.Set("Authorization", "Bearer "+k.key)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// sessionBoxes lists the server's sessions with their box counts.
func sessionBoxes(t *testing.T, url, key string) map[string]int {
	req, err := http.NewRequest(http.MethodGet, url+"/v1/sessions", nil)
	require.NoError(t, err)
	resp, err := (&http.Client{Transport: keyed{key}}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var list []struct {
		ID    string `json:"id"`
		Boxes int    `json:"boxes"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
	out := map[string]int{}
	for _, s := range list {
		out[s.ID] = s.Boxes
	}
	return out
}

// TestMCPServeHTTP: an MCP client with the URL /v1/mcp and the server key
// gets a session of boxes of its own, gone when it ends the MCP session.
func TestMCPServeHTTP(t *testing.T) {
	testenv.RequireBwrap(t)
	data := t.TempDir()
	srv := startServe(t, data, "--pool", "0")
	endpoint := srv.url + "/v1/mcp"
	dial := func(key string) (*mcpClient, error) {
		return connect(t, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: &http.Client{Transport: keyed{key}}, MaxRetries: -1})
	}

	for key, status := range map[string]string{"": "Unauthorized", "wrong": "Forbidden"} {
		_, err := dial(key)
		require.Error(t, err, "key %q", key)
		assert.Contains(t, err.Error(), status)
	}
	before := len(sessionBoxes(t, srv.url, srv.key)) // the server's own

	a, err := dial(srv.key)
	require.NoError(t, err)
	b, err := dial(srv.key)
	require.NoError(t, err)
	assert.Equal(t, "2025-11-25", a.InitializeResult().ProtocolVersion)
	a.checkTools(t)
	a.call(t, "write_file", map[string]any{"path": "note.txt", "content": "a's"})
	isError, out := b.call(t, "read_file", map[string]any{"path": "note.txt"})
	assert.True(t, isError, "b has boxes of its own")
	assert.Contains(t, out["error"], "no such file")
	require.Len(t, sessionBoxes(t, srv.url, srv.key), before+2)

	a.cancelSleep(t)

	require.NoError(t, a.Close()) // DELETE
	require.Eventually(t, func() bool { return len(sessionBoxes(t, srv.url, srv.key)) == before+1 }, 30*time.Second, 50*time.Millisecond,
		"ending the MCP session deletes its session and boxes")
	assert.Equal(t, "hi\n", b.shell(t, "echo hi")["stdout"], "the other MCP session goes on")
	require.NoError(t, b.Close())
	// A deleted session leaves the list before its boxes are gone: wait
	// for the boxes, so the server stops with none half-destroyed.
	require.Eventually(t, func() bool {
		boxes, err := filepath.Glob(filepath.Join(data, "local", "cb-*"))
		return err == nil && len(boxes) == 0 && len(sessionBoxes(t, srv.url, srv.key)) == before
	}, 30*time.Second, 50*time.Millisecond, "both MCP sessions ended: no boxes left")
}
