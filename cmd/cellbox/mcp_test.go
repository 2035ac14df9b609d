package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
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

// TestMCPServeIdleTTL: `cellbox serve --mcp-idle-ttl` closes an MCP
// session of /v1/mcp that had no request for that long, and deletes its
// session and boxes (the default is 30 minutes; it was --session-ttl's
// day).
func TestMCPServeIdleTTL(t *testing.T) {
	testenv.RequireBwrap(t)
	data := t.TempDir()
	srv := startServe(t, data, "--pool", "0", "--mcp-idle-ttl", "1s")
	before := len(mcptest.Sessions(t, srv.url, srv.key)) // the server's own
	c := mcptest.MustConnect(t, mcptest.HTTP(srv.url+"/v1/mcp", srv.key))
	c.Shell(t, "true")
	require.Len(t, mcptest.Sessions(t, srv.url, srv.key), before+1)
	require.Eventually(t, func() bool {
		boxes, err := filepath.Glob(filepath.Join(data, "local", "cb-*"))
		return err == nil && len(boxes) == 0 && len(mcptest.Sessions(t, srv.url, srv.key)) == before
	}, 2*time.Minute, 50*time.Millisecond, "the idle MCP session ends, with its session and box")
	_, err := c.ListTools(context.Background(), nil)
	require.Error(t, err, "the MCP session is gone")
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
		{`{"jsonrpc":"2.0","id":8}`, `"id":8,"error":{"code":-32600,"message":"invalid request: a message with an id but no method, result or error`},
	}
	in := ""
	for _, b := range bad {
		in += b.line + "\n"
	}
	// After an initialize of 2025-06-18, a batch: the SDK would end the
	// connection at it (the version has no batches).
	in += `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}` + "\n" +
		`[{"jsonrpc":"2.0","id":2,"method":"ping"}]` + "\n" + `{"jsonrpc":"2.0","id":3,"method":"ping"}` + "\n"
	_, err = io.WriteString(stdin, in)
	require.NoError(t, err)
	var lines []string
	sc := bufio.NewScanner(stdout)
	for len(lines) < len(bad)+3 && sc.Scan() { // ends at EOF if the server quits
		lines = append(lines, sc.Text())
	}
	require.NoError(t, stdin.Close())
	require.NoError(t, cmd.Wait(), "stderr:\n%s", stderr)
	require.Len(t, lines, len(bad)+3, "stdout:\n%s\nstderr:\n%s", strings.Join(lines, "\n"), stderr)
	for i, b := range bad {
		assert.Contains(t, lines[i], b.want, b.line)
	}
	// The answers after the bad lines come in any order: the SDK writes
	// its own, jsonLines the errors.
	rest := strings.Join(lines[len(bad):], "\n")
	assert.Contains(t, rest, `"id":1,"result":{`)
	assert.Contains(t, rest, `"serverInfo":{"name":"cellbox"`)
	assert.Contains(t, rest, `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"invalid request: a batch, which the protocol version in use does not have`)
	assert.Contains(t, rest, `{"jsonrpc":"2.0","id":3,"result":{}}`, "the server reads on after the batch")
}

// TestLineCheckerBatches: a batch goes to the SDK only in a protocol
// version that has batches (asked for by the initialize), and not with
// two requests of one id; the SDK ends the connection at either.
func TestLineCheckerBatches(t *testing.T) {
	const batch = `[{"jsonrpc":"2.0","id":2,"method":"ping"},{"jsonrpc":"2.0","method":"notifications/x"}]`
	init := func(version string) []byte {
		return []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"` + version + `","capabilities":{}}}`)
	}
	var c lineChecker
	assert.Contains(t, string(c.badMessage([]byte(batch))), "a batch, which the protocol version in use does not have", "before an initialize")
	require.Nil(t, c.badMessage(init("2025-03-26")))
	line := []byte(batch)
	assert.Nil(t, c.badMessage(line), "2025-03-26 has batches")
	assert.Equal(t, batch, string(line), "the line is left as it was")
	assert.Contains(t, string(c.badMessage([]byte(`[{"jsonrpc":"2.0","id":4,"method":"ping"},{"jsonrpc":"2.0","id":4,"method":"ping"}]`))),
		`"id":null,"error":{"code":-32600,"message":"invalid request: a batch with two requests of id 4; give each its own"}`)
	require.Nil(t, c.badMessage(init("2025-06-18")))
	assert.Nil(t, c.badMessage([]byte(batch)), "a second initialize changes nothing: the SDK refuses it")
	for _, v := range []string{"2025-06-18", "2025-11-25", "2099-01-01"} {
		c := lineChecker{}
		require.Nil(t, c.badMessage(init(v)))
		assert.NotNil(t, c.badMessage([]byte(batch)), v)
	}
}

// TestMCPStdioLongLine: a message line over the limit (16 MiB) is skipped
// to its newline and answered with an error that names the limit and what
// to do instead, with the call's id, and the server reads on, its session
// and boxes kept; before, `cellbox mcp` exited ("bufio.Scanner: token too
// long") and deleted the session's boxes with their files.
func TestMCPStdioLongLine(t *testing.T) {
	testenv.RequireBwrap(t)
	c, stderr := startMCP(t, "--data", t.TempDir(), "--backend", "local", "--pool", "0")
	c.Call(t, "write_file", map[string]any{"path": "kept.txt", "content": "kept\n"})
	_, err := c.CallTool(context.Background(), &mcp.CallToolParams{Name: "write_file",
		Arguments: map[string]any{"path": "big.bin", "content": strings.Repeat("x", maxLine)}})
	require.Error(t, err, "stderr:\n%s", stderr)
	assert.Contains(t, err.Error(), "message too long: a line of 16777", "the answer reached the call (its id was read)")
	assert.Contains(t, err.Error(), "over the limit of 16777216 bytes (16 MiB) a message; it was skipped")
	assert.Contains(t, err.Error(), "write a big file in parts (append: true)")
	assert.Equal(t, "kept\n", c.Shell(t, "cat kept.txt")["stdout"], "the server reads on, with the session's box")
	assert.NotContains(t, stderr.String(), "session deleted")
}

// TestJSONLinesLong: a line over the limit is answered with the id read
// from its start or its end (clients write it first or last), null when
// neither tells, and the lines after it go on to the SDK.
func TestJSONLinesLong(t *testing.T) {
	const limit = 1000
	pad := strings.Repeat("x", 200<<10) // several reads of the 64 KiB buffer
	next := `{"jsonrpc":"2.0","id":9,"method":"ping"}`
	for _, tc := range []struct{ name, line, id string }{
		{"id first", `{"jsonrpc":"2.0","id":"a-1","method":"tools/call","params":{"content":"` + pad + `"}}`, `"a-1"`},
		{"id last", `{"method":"tools/call","params":{"content":"` + pad + `"},"jsonrpc":"2.0","id":7}` + "\r", `7`},
		{"not JSON", pad, `null`},
		{"id of a nested object only", `{"params":{"id":5,"content":"` + pad + `","x":{"id":3}}}`, `null`},
		{"id in the content", `{"method":"m","params":{"content":"` + pad + `,\"id\":4}"}}`, `null`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var to, out bytes.Buffer
			in := tc.line + "\n" + strings.Repeat("y", limit) + "\n" + next // the last line has no newline
			require.NoError(t, jsonLines(strings.NewReader(in), &to, &out, limit, nil))
			assert.Equal(t, next+"\n", to.String(), "the message after the long line is passed on")
			answers := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
			require.Len(t, answers, 2, out.String())
			assert.Contains(t, answers[0], `{"jsonrpc":"2.0","id":`+tc.id+`,"error":{"code":-32600,"message":"message too long: a line of `)
			assert.Contains(t, answers[1], `"id":null,"error":{"code":-32700`, "a line of limit bytes is read whole (and is no JSON)")
		})
	}
}

// TestMCPStdioReadError: a cellbox mcp that cannot read stdin (here a
// directory: EISDIR) exits with the error and leaves its session and boxes
// to the next one, as a killed one does; before, it deleted them (the
// session it had taken over, with the files of the one before).
func TestMCPStdioReadError(t *testing.T) {
	testenv.RequireBwrap(t)
	data := t.TempDir()
	args := []string{"--data", data, "--backend", "local", "--pool", "0"}
	c, cmd, _ := startMCPCmd(t, args...)
	c.Call(t, "write_file", map[string]any{"path": "kept.txt", "content": "kept\n"})
	require.NoError(t, cmd.Process.Kill())
	c.Close()

	dir, err := os.Open(t.TempDir())
	require.NoError(t, err)
	defer dir.Close()
	bad := exec.Command(testenv.CellboxBinary(t), append([]string{"mcp"}, args...)...)
	bad.Env, bad.Stdin = cleanEnv(), dir
	out, err := bad.CombinedOutput()
	require.Error(t, err, "%s", out)
	assert.Contains(t, string(out), "read stdin: read /dev/stdin: is a directory")
	assert.Contains(t, string(out), "the session and its boxes are kept")
	assert.NotContains(t, string(out), "session deleted")

	c, stderr := startMCP(t, args...)
	assert.Equal(t, "kept\n", c.Shell(t, "cat kept.txt")["stdout"], "stderr:\n%s", stderr)
}

// TestMCPStdioAnswersBeforeEOF: a client that writes its requests and
// closes stdin (MCP's stdio shutdown begins so) gets every answer,
// including a tool call still running at the end of stdin; cellbox mcp
// exits after the last one. It used to exit at once, answering nothing.
func TestMCPStdioAnswersBeforeEOF(t *testing.T) {
	testenv.RequireBwrap(t)
	cmd := exec.Command(testenv.CellboxBinary(t), "mcp", "--data", t.TempDir(), "--backend", "local")
	cmd.Env = cleanEnv()
	cmd.Stdin = strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}` + "\n" +
		`{"jsonrpc":"2.0","method":"notifications/initialized"}` + "\n" +
		`{"jsonrpc":"2.0","id":2,"method":"ping"}` + "\n" +
		`{"jsonrpc":"2.0","id":"call","method":"tools/call","params":{"name":"shell","arguments":{"command":"sleep 1; echo answered"}}}` + "\n")
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	out, err := cmd.Output()
	require.NoError(t, err, "stderr: %s", stderr.String())
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var ids []string
	for _, l := range lines {
		var m struct{ ID json.RawMessage }
		require.NoError(t, json.Unmarshal([]byte(l), &m), l)
		if len(m.ID) > 0 {
			ids = append(ids, string(m.ID))
		}
	}
	assert.ElementsMatch(t, []string{`1`, `2`, `"call"`}, ids, "every request answered:\n%s", out)
	assert.Contains(t, string(out), `answered\n`, "the tool call ran to its end")
}
