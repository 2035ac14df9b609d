package main

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
)

// mcpProc is a `cellbox mcp` process driven over stdio like an MCP client.
type mcpProc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr strings.Builder
	nextID int
}

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

func startMCP(t *testing.T, args ...string) *mcpProc {
	p := &mcpProc{t: t, lines: make(chan string, 16)}
	p.cmd = exec.Command(testenv.CellboxBinary(t), append([]string{"mcp"}, args...)...)
	p.cmd.Env = cleanEnv()
	p.cmd.Stderr = &p.stderr
	var err error
	p.stdin, err = p.cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := p.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, p.cmd.Start())
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Kill()
			p.cmd.Wait()
		}
	})
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	return p
}

func (p *mcpProc) send(msg string) {
	_, err := io.WriteString(p.stdin, msg+"\n")
	require.NoError(p.t, err)
}

// request sends a request and returns its answer; every line on stdout
// must be a JSON-RPC message.
func (p *mcpProc) request(method string, params any) map[string]any {
	p.t.Helper()
	p.nextID++
	raw, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": p.nextID, "method": method, "params": params})
	require.NoError(p.t, err)
	p.send(string(raw))
	select {
	case line, ok := <-p.lines:
		require.True(p.t, ok, "cellbox mcp ended; stderr:\n%s", &p.stderr)
		var m map[string]any
		require.NoError(p.t, json.Unmarshal([]byte(line), &m), "stdout carries only JSON-RPC: %q", line)
		require.EqualValues(p.t, p.nextID, m["id"], line)
		return m
	case <-time.After(60 * time.Second):
		p.t.Fatalf("no answer to %s; stderr:\n%s", method, &p.stderr)
	}
	return nil
}

// result returns the result of a request that must succeed.
func (p *mcpProc) result(method string, params any) map[string]any {
	p.t.Helper()
	m := p.request(method, params)
	res, ok := m["result"].(map[string]any)
	require.True(p.t, ok, "%s failed: %v", method, m)
	return res
}

// handshake initializes the connection and lists the tools.
func (p *mcpProc) handshake() {
	init := p.result("initialize", map[string]any{"protocolVersion": "2025-06-18", "capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "test", "version": "1"}})
	assert.Equal(p.t, "2025-06-18", init["protocolVersion"])
	assert.Equal(p.t, "cellbox", init["serverInfo"].(map[string]any)["name"])
	p.send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	var names []string
	for _, tool := range p.result("tools/list", nil)["tools"].([]any) {
		names = append(names, tool.(map[string]any)["name"].(string))
	}
	assert.Subset(p.t, names, []string{"shell", "read_file", "write_file", "edit", "grep", "sandbox_create"})
}

// shell runs command with the shell tool and returns the result object.
func (p *mcpProc) shell(command string) map[string]any {
	p.t.Helper()
	res := p.result("tools/call", map[string]any{"name": "shell", "arguments": map[string]any{"command": command}})
	require.Equal(p.t, false, res["isError"], res)
	return res["structuredContent"].(map[string]any)
}

// stop closes stdin, which ends the server, and waits for it.
func (p *mcpProc) stop() {
	require.NoError(p.t, p.stdin.Close())
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		assert.NoError(p.t, err, "exit 0 at end of input; stderr:\n%s", &p.stderr)
	case <-time.After(60 * time.Second):
		p.t.Fatalf("cellbox mcp did not stop at end of input; stderr:\n%s", &p.stderr)
	}
}

// TestMCPStdio runs `cellbox mcp` with in-process boxes, as an IDE would.
func TestMCPStdio(t *testing.T) {
	testenv.RequireBwrap(t)
	data := t.TempDir()
	p := startMCP(t, "--data", data, "--backend", "local")
	p.handshake()

	out := p.shell("echo hi")
	assert.Equal(t, "hi\n", out["stdout"])
	assert.EqualValues(t, 0, out["exit_code"])
	res := p.result("tools/call", map[string]any{"name": "shell", "arguments": map[string]any{"command": "echo hi"}})
	content := res["content"].([]any)
	require.Len(t, content, 1)
	assert.Equal(t, "text", content[0].(map[string]any)["type"])
	assert.JSONEq(t, mustJSON(t, res["structuredContent"]), content[0].(map[string]any)["text"].(string), "the text is the result object")

	// Files persist between calls in the session's box.
	p.result("tools/call", map[string]any{"name": "write_file", "arguments": map[string]any{"path": "a.txt", "content": "one\n"}})
	assert.Equal(t, "one\n", p.shell("cat /workspace/a.txt")["stdout"])

	res = p.result("tools/call", map[string]any{"name": "read_file", "arguments": map[string]any{"path": "missing.txt"}})
	assert.Equal(t, true, res["isError"])
	assert.Contains(t, res["structuredContent"].(map[string]any)["error"], "no such file")

	e := p.request("tools/call", map[string]any{"name": "nosuchtool", "arguments": map[string]any{}})
	assert.EqualValues(t, -32602, e["error"].(map[string]any)["code"])

	p.stop()
	assert.Contains(t, p.stderr.String(), "session deleted")
	boxes, err := os.ReadDir(filepath.Join(data, "boxes"))
	require.NoError(t, err)
	assert.Empty(t, boxes, "the session's boxes are destroyed on exit")
}

func mustJSON(t *testing.T, v any) string {
	raw, err := json.Marshal(v)
	require.NoError(t, err)
	return string(raw)
}

// TestMCPProxy runs `cellbox mcp --server` against a running cellbox serve,
// which creates a session for the life of the process.
func TestMCPProxy(t *testing.T) {
	testenv.RequireBwrap(t)
	data := t.TempDir()
	url := startServe(t, data, "--pool", "0").url

	p := startMCP(t, "--server", url, "--data", data) // the server key is DATA/server.key
	p.handshake()
	assert.Equal(t, "hi\n", p.shell("echo hi")["stdout"])
	res := p.result("tools/call", map[string]any{"name": "read_file", "arguments": map[string]any{"path": "missing.txt"}})
	assert.Equal(t, true, res["isError"], "a tool error stays a result through the proxy")
	p.stop()
	assert.Regexp(t, `serving on stdio.*session=s-`, p.stderr.String())
	assert.NotContains(t, p.stderr.String(), "delete the MCP session", "the session it created is deleted on exit")

	out, err := exec.Command(testenv.CellboxBinary(t), "mcp", "--server", url, "--session", "s-1").CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "--session needs --token")
	out, err = exec.Command(testenv.CellboxBinary(t), "mcp", "--server", url, "--backend", "local").CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "--backend is for in-process boxes")
}

// startServe starts `cellbox serve` on the local backend and returns its URL.
