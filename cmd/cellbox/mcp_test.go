package main

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/mcptest"
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

// startMCP runs `cellbox mcp args...` as an IDE would, and connects to it.
func startMCP(t *testing.T, args ...string) (*mcptest.Client, *syncBuffer) {
	t.Helper()
	c, _, stderr := startMCPCmd(t, args...)
	return c, stderr
}

// startMCPCmd is startMCP that also returns the process.
func startMCPCmd(t *testing.T, args ...string) (*mcptest.Client, *exec.Cmd, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(testenv.CellboxBinary(t), append([]string{"mcp"}, args...)...)
	cmd.Env = cleanEnv()
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	c, err := mcptest.Connect(t, &mcp.CommandTransport{Command: cmd})
	require.NoError(t, err, "stderr:\n%s", stderr)
	return c, cmd, stderr
}

// TestMCPStdioKilled: a cellbox mcp killed with SIGKILL leaves its session
// to the next one over the data dir, which takes it over with its box and
// files (the session was left behind with its boxes, reachable by nobody),
// and deletes it when it ends cleanly.
func TestMCPStdioKilled(t *testing.T) {
	testenv.RequireBwrap(t)
	data := t.TempDir()
	// No warm pool: a pool box half made when the process is killed is
	// left to a start a minute later (sweepHalfMade spares younger ones,
	// another process may be making them), after this test's end.
	c, cmd, _ := startMCPCmd(t, "--data", data, "--backend", "local", "--pool", "0")
	c.Call(t, "write_file", map[string]any{"path": "kept.txt", "content": "kept\n"})
	require.NoError(t, cmd.Process.Kill())
	c.Close()
	c, stderr := startMCP(t, "--data", data, "--backend", "local", "--pool", "0")
	assert.Equal(t, "kept\n", c.Shell(t, "cat kept.txt")["stdout"])
	assert.Contains(t, stderr.String(), "taking over the session of a cellbox mcp that did not end cleanly")
	require.NoError(t, c.Close())
	assert.Contains(t, stderr.String(), "session deleted")
	boxes, err := os.ReadDir(filepath.Join(data, "boxes"))
	require.NoError(t, err)
	assert.Empty(t, boxes, "the session's boxes are destroyed on exit")
	assert.NoFileExists(t, filepath.Join(data, mcpSessionFile))
}

// checkTools checks the tool list has the registry with its metadata.
func checkTools(t *testing.T, c *mcptest.Client) {
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

// TestMCPStdio runs `cellbox mcp` with in-process boxes, as an IDE would.
func TestMCPStdio(t *testing.T) {
	testenv.RequireBwrap(t)
	data := t.TempDir()
	c, stderr := startMCP(t, "--data", data, "--backend", "local")
	assert.Equal(t, "cellbox", c.InitializeResult().ServerInfo.Name)
	assert.Equal(t, "2026-07-28", c.InitializeResult().ProtocolVersion, "the SDK's newest, by server/discover")
	checkTools(t, c)

	out := c.Shell(t, "echo hi")
	assert.Equal(t, "hi\n", out["stdout"])
	assert.EqualValues(t, 0, out["exit_code"])

	// Files persist between calls in the session's box.
	c.Call(t, "write_file", map[string]any{"path": "a.txt", "content": "one\n"})
	assert.Equal(t, "one\n", c.Shell(t, "cat /workspace/a.txt")["stdout"])
	read, err := c.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "cellbox://box/default/a.txt"})
	require.NoError(t, err)
	assert.Equal(t, "one\n", read.Contents[0].Text)

	res, out := c.Call(t, "read_file", map[string]any{"path": "missing.txt"})
	assert.True(t, res.IsError)
	assert.Contains(t, out["error"], "no such file")
	_, err = c.CallTool(context.Background(), &mcp.CallToolParams{Name: "nosuchtool"})
	assert.ErrorContains(t, err, `unknown tool "nosuchtool"`)

	c.CancelSleep(t)

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
	checkTools(t, c)
	assert.Equal(t, "hi\n", c.Shell(t, "echo hi")["stdout"])
	res, _ := c.Call(t, "read_file", map[string]any{"path": "missing.txt"})
	assert.True(t, res.IsError, "a tool error stays a result through the proxy")
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

// TestMCPServeHTTP: an MCP client with the URL /v1/mcp and the server key
// gets a session of boxes of its own, gone when it ends the MCP session.
func TestMCPServeHTTP(t *testing.T) {
	testenv.RequireBwrap(t)
	data := t.TempDir()
	srv := startServe(t, data, "--pool", "0")
	endpoint := srv.url + "/v1/mcp"
	dial := func(key string) (*mcptest.Client, error) { return mcptest.Connect(t, mcptest.HTTP(endpoint, key)) }

	for key, status := range map[string]string{"": "Unauthorized", "wrong": "Forbidden"} {
		_, err := dial(key)
		require.Error(t, err, "key %q", key)
		assert.Contains(t, err.Error(), status)
	}
	before := len(mcptest.Sessions(t, srv.url, srv.key)) // the server's own

	a, err := dial(srv.key)
	require.NoError(t, err)
	b, err := dial(srv.key)
	require.NoError(t, err)
	assert.Equal(t, "2025-11-25", a.InitializeResult().ProtocolVersion)
	checkTools(t, a)
	a.Call(t, "write_file", map[string]any{"path": "note.txt", "content": "a's"})
	res, out := b.Call(t, "read_file", map[string]any{"path": "note.txt"})
	assert.True(t, res.IsError, "b has boxes of its own")
	assert.Contains(t, out["error"], "no such file")
	require.Len(t, mcptest.Sessions(t, srv.url, srv.key), before+2)

	a.CancelSleep(t)

	require.NoError(t, a.Close()) // DELETE
	require.Eventually(t, func() bool { return len(mcptest.Sessions(t, srv.url, srv.key)) == before+1 }, 30*time.Second, 50*time.Millisecond,
		"ending the MCP session deletes its session and boxes")
	assert.Equal(t, "hi\n", b.Shell(t, "echo hi")["stdout"], "the other MCP session goes on")
	require.NoError(t, b.Close())
	// A deleted session leaves the list before its boxes are gone: wait
	// for the boxes, so the server stops with none half-destroyed.
	require.Eventually(t, func() bool {
		boxes, err := filepath.Glob(filepath.Join(data, "local", "cb-*"))
		return err == nil && len(boxes) == 0 && len(mcptest.Sessions(t, srv.url, srv.key)) == before
	}, 30*time.Second, 50*time.Millisecond, "both MCP sessions ended: no boxes left")
}

// TestMCPStdioBadLine: a line that is not JSON gets a JSON-RPC parse error
// (-32700), JSON that is no JSON-RPC message an invalid request (-32600,
// with its id when it has one), and the server reads on; before,
// `cellbox mcp` exited at each ("invalid character 'g' looking for
// beginning of value", "empty batch", "invalid message version tag") and
// the client lost its session and boxes.
func TestMCPStdioBadLine(t *testing.T) {
	testenv.RequireBwrap(t)
	cmd := exec.Command(testenv.CellboxBinary(t), "mcp", "--data", t.TempDir(), "--backend", "local")
	cmd.Env = cleanEnv()
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	bad := []struct{ line, want string }{
		{"garbage", `{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse error: a line that is not JSON; send one JSON-RPC message per line"}}`},
		{"[1,2", `{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse error: a line that is not JSON; send one JSON-RPC message per line"}}`},
		{"[]", `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"invalid request: a batch is a non-empty array of JSON-RPC messages"}}`},
		{"5", `"id":null,"error":{"code":-32600,"message":"invalid request: `},
		{"{}", `"id":null,"error":{"code":-32600,"message":"invalid request: `},
		{`{"jsonrpc":"2.0","id":7,"method":5}`, `"id":7,"error":{"code":-32600,"message":"invalid request: `},
	}
	in := ""
	for _, b := range bad {
		in += b.line + "\n"
	}
	_, err = io.WriteString(stdin, in+`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`+"\n")
	require.NoError(t, err)
	var lines []string
	sc := bufio.NewScanner(stdout)
	for len(lines) < len(bad)+1 && sc.Scan() { // ends at EOF if the server quits
		lines = append(lines, sc.Text())
	}
	require.NoError(t, stdin.Close())
	require.NoError(t, cmd.Wait(), "stderr:\n%s", stderr)
	require.Len(t, lines, len(bad)+1, "stdout:\n%s\nstderr:\n%s", strings.Join(lines, "\n"), stderr)
	for i, b := range bad {
		assert.Contains(t, lines[i], b.want, b.line)
	}
	assert.Contains(t, lines[len(bad)], `"id":1,"result":{`)
	assert.Contains(t, lines[len(bad)], `"serverInfo":{"name":"cellbox"`)
}
