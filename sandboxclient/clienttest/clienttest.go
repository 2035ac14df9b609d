// Package clienttest is the conformance suite of sandboxclient.Client: the
// in-process client (sandbox.LocalClient) and the HTTP one
// (sandboxclient.HTTP) must behave the same, errors included, so a
// built-in never needs to know which one it holds. Run it with a function
// that makes a client of a fresh session on a real service.
package clienttest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandboxclient"
)

// waitFor bounds the waits of the suite (a box's first start included).
const waitFor = 60 * time.Second

// Run runs the suite; newClient returns a client of a new, empty session
// (the caller removes it at the end of the test).
func Run(t *testing.T, newClient func(t *testing.T) sandboxclient.Client) {
	t.Run("CreateBox", func(t *testing.T) { testCreate(t, newClient(t)) })
	t.Run("DestroyBox", func(t *testing.T) { testDestroy(t, newClient(t)) })
	t.Run("Exec", func(t *testing.T) { testExec(t, newClient(t)) })
	t.Run("Files", func(t *testing.T) { testFiles(t, newClient(t)) })
	t.Run("Watch", func(t *testing.T) { testWatch(t, newClient(t)) })
	t.Run("Tool", func(t *testing.T) { testTool(t, newClient(t)) })
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	t.Cleanup(cancel)
	return ctx
}

// requireCode checks that err has code on every path a caller may test it:
// the sentinel with errors.Is, and the code itself.
func requireCode(t *testing.T, err error, code string) {
	t.Helper()
	require.Error(t, err)
	sentinel := api.Sentinel(code)
	require.NotNil(t, sentinel, "code %q has a sentinel", code)
	assert.ErrorIs(t, err, sentinel, "%v", err)
	assert.Equal(t, code, api.CodeOf(err), "%v", err)
}

func testCreate(t *testing.T, c sandboxclient.Client) {
	ctx := ctxFor(t)
	out, err := c.CreateBox(ctx, api.SandboxCreateInput{Sandbox: "made"})
	require.NoError(t, err)
	assert.Equal(t, "made", out.Sandbox)
	assert.True(t, out.Created)
	assert.NotEmpty(t, out.ID)

	again, err := c.CreateBox(ctx, api.SandboxCreateInput{Sandbox: "made"})
	require.NoError(t, err, "creating an existing box is a no-op")
	assert.False(t, again.Created)
	assert.Equal(t, out.ID, again.ID)

	_, err = c.CreateBox(ctx, api.SandboxCreateInput{Sandbox: "no/slash"})
	requireCode(t, err, api.CodeInvalidInput)
	var te *sandboxclient.ToolError
	require.ErrorAs(t, err, &te)
	assert.Contains(t, te.Message, "invalid sandbox name")
}

func testDestroy(t *testing.T, c sandboxclient.Client) {
	ctx := ctxFor(t)
	err := c.DestroyBox(ctx, "never-made")
	requireCode(t, err, api.CodeNoBox)
	var te *sandboxclient.ToolError
	require.ErrorAs(t, err, &te, "destroy is the sandbox_destroy tool on both clients")
	assert.Equal(t, api.CodeNoBox, te.Code)
	assert.Contains(t, te.Message, `no sandbox named "never-made"`)

	_, err = c.CreateBox(ctx, api.SandboxCreateInput{Sandbox: "doomed"})
	require.NoError(t, err)
	require.NoError(t, c.DestroyBox(ctx, "doomed"))
	requireCode(t, c.DestroyBox(ctx, "doomed"), api.CodeNoBox)
}

func testExec(t *testing.T, c sandboxclient.Client) {
	ctx := ctxFor(t)
	var mu sync.Mutex
	got := map[string]string{}
	res, err := c.Exec(ctx, "", api.ExecRequest{Command: "echo out; echo err >&2; exit 3"}, func(stream string, data []byte) {
		mu.Lock()
		defer mu.Unlock()
		got[stream] += string(data)
	})
	require.NoError(t, err, "a command that fails is a result, not an error")
	assert.Equal(t, 3, res.ExitCode)
	assert.Equal(t, "out\n", res.Stdout)
	assert.Equal(t, "err\n", res.Stderr)
	mu.Lock()
	assert.Equal(t, map[string]string{"stdout": "out\n", "stderr": "err\n"}, got, "the callback sees the output as it comes")
	mu.Unlock()

	res, err = c.Exec(ctx, "other", api.ExecRequest{Argv: []string{"sh", "-c", "pwd; printf %s \"$X\""}, Env: map[string]string{"X": "y"}}, nil)
	require.NoError(t, err, "a box a command names is made on first use")
	assert.Equal(t, 0, res.ExitCode)
	assert.Equal(t, "/workspace\ny", res.Stdout)

	res, err = c.Exec(ctx, "", api.ExecRequest{Command: "sleep 5", TimeoutMs: 200}, nil)
	require.NoError(t, err)
	assert.True(t, res.TimedOut)
}

func testFiles(t *testing.T, c sandboxclient.Client) {
	ctx := ctxFor(t)
	content := []byte("line 1\nline 2\n")
	n, err := c.Upload(ctx, "", "dir/sub/a.txt", bytes.NewReader(content))
	require.NoError(t, err, "parents are created")
	assert.EqualValues(t, len(content), n)

	var buf bytes.Buffer
	n, err = c.Download(ctx, "", "/workspace/dir/sub/a.txt", &buf)
	require.NoError(t, err)
	assert.EqualValues(t, len(content), n)
	assert.Equal(t, content, buf.Bytes())

	_, err = c.Download(ctx, "", "missing.txt", &buf)
	requireCode(t, err, api.CodeNotFound)
	assert.ErrorIs(t, err, fs.ErrNotExist, "ErrNotFound is fs.ErrNotExist")
	assert.Contains(t, err.Error(), "missing.txt")

	_, err = c.Download(ctx, "", "dir", &buf)
	requireCode(t, err, api.CodeInvalidInput)

	_, err = c.Upload(ctx, "", "../escape.txt", strings.NewReader("x"))
	requireCode(t, err, api.CodeOutsideWorkspace)
	_, err = c.Download(ctx, "", "../../etc/passwd", &buf)
	requireCode(t, err, api.CodeOutsideWorkspace)

	// A path names a file of its box, whatever it holds: over HTTP, ".."
	// must not climb the URL into another box's files endpoint.
	_, err = c.Upload(ctx, "other", "secret.txt", strings.NewReader("SECRET"))
	require.NoError(t, err)
	buf.Reset()
	_, err = c.Download(ctx, "", "../../other/files/secret.txt", &buf)
	requireCode(t, err, api.CodeOutsideWorkspace)
	assert.Empty(t, buf.String())
	_, err = c.Upload(ctx, "", "../../other/files/planted.txt", strings.NewReader("X"))
	requireCode(t, err, api.CodeOutsideWorkspace)
	_, err = c.Download(ctx, "other", "planted.txt", &buf)
	requireCode(t, err, api.CodeNotFound)
}

func testWatch(t *testing.T, c sandboxclient.Client) {
	ctx := ctxFor(t)
	_, err := c.Exec(ctx, "", api.ExecRequest{Command: "mkdir -p watched"}, nil)
	require.NoError(t, err)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	ch, err := c.Watch(wctx, "", "watched")
	require.NoError(t, err)
	// A watch may start a moment after Watch returns: write until an
	// event for the file comes.
	seen := false
	for try := 0; !seen && try < 50; try++ {
		_, err = c.Upload(ctx, "", "watched/new.txt", strings.NewReader("hi"))
		require.NoError(t, err)
		select {
		case evs, ok := <-ch:
			require.True(t, ok, "the channel stays open while ctx lives")
			for _, e := range evs {
				seen = seen || strings.HasSuffix(e.Path, "watched/new.txt")
			}
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("no change event")
		}
	}
	require.True(t, seen, "an event names the written file")
	stop()
	for range ch { // closed once ctx ends
	}

	_, err = c.Watch(ctx, "", "../..")
	requireCode(t, err, api.CodeOutsideWorkspace)
}

func testTool(t *testing.T, c sandboxclient.Client) {
	ctx := ctxFor(t)
	res, err := c.Tool(ctx, "write_file", map[string]any{"path": "t.txt", "content": "hello\n"})
	require.NoError(t, err)
	var head struct {
		IsError bool `json:"is_error"`
	}
	require.NoError(t, json.Unmarshal(res, &head))
	assert.False(t, head.IsError)

	res, err = c.Tool(ctx, "read_file", json.RawMessage(`{"path":"t.txt"}`))
	require.NoError(t, err)
	var rf api.ReadFileOutput
	require.NoError(t, api.DecodeResult(res, &rf))
	assert.Equal(t, "hello\n", rf.Content)

	tests := []struct {
		name  string
		tool  string
		input any
		code  string
		msg   string
	}{
		{"missing file", "read_file", map[string]any{"path": "nope.txt"}, api.CodeNotFound, "nope.txt"},
		{"outside the workspace", "read_file", map[string]any{"path": "../../etc/passwd"}, api.CodeOutsideWorkspace, "workspace"},
		{"unknown field", "read_file", map[string]any{"path": "t.txt", "bogus": 1}, api.CodeInvalidInput, `unknown field "bogus"`},
		{"missing field", "write_file", map[string]any{"path": "x"}, api.CodeInvalidInput, "content"},
		{"no such box", "sandbox_destroy", map[string]any{"sandbox": "ghost"}, api.CodeNoBox, "ghost"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := c.Tool(ctx, tt.tool, tt.input)
			var te *sandboxclient.ToolError
			require.ErrorAs(t, err, &te)
			assert.Equal(t, tt.code, te.Code)
			assert.Contains(t, te.Message, tt.msg)
			requireCode(t, err, tt.code)
			var wire struct {
				IsError bool   `json:"is_error"`
				Error   string `json:"error"`
				Code    string `json:"code"`
			}
			require.NoError(t, json.Unmarshal(res, &wire), "the result comes with the error")
			assert.Equal(t, struct {
				IsError bool   `json:"is_error"`
				Error   string `json:"error"`
				Code    string `json:"code"`
			}{true, te.Message, tt.code}, wire, "the code is on the wire beside the message")
			assert.False(t, errors.Is(err, api.ErrInternal))
		})
	}
}
