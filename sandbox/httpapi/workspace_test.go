package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/mcptest"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/sandboxtest"
)

// newSessionWith posts body to /v1/sessions and returns the status and
// the session (nil unless 201).
func newSessionWith(t *testing.T, url string, body any) (int, *httpSession, map[string]any) {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	resp, err := http.Post(url+"/v1/sessions", "application/json", bytes.NewReader(b))
	require.NoError(t, err)
	defer resp.Body.Close()
	var m map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&m))
	if resp.StatusCode != http.StatusCreated {
		return resp.StatusCode, nil, m
	}
	return resp.StatusCode, &httpSession{t: t, url: url, id: m["id"].(string), token: m["token"].(string)}, m
}

// listed returns the session's boxes by name, from sandbox_list.
func listed(h *httpSession) map[string]map[string]any {
	out := map[string]map[string]any{}
	for _, x := range h.tool("sandbox_list", nil)["sandboxes"].([]any) {
		m := x.(map[string]any)
		out[m["name"].(string)] = m
	}
	return out
}

// TestWorkspaceSettings: a session's env, workspace_dir and
// destroy_on_close (seed 002) are its boxes' defaults; sandbox_create
// overrides them; commands run in workspace_dir and relative file paths
// resolve there.
func TestWorkspaceSettings(t *testing.T) {
	s, _ := sandboxtest.Service(t, sandboxtest.Options{})
	url := startHTTP(t, s)
	status, h, m := newSessionWith(t, url, api.NewSessionRequest{BoxDefaults: api.BoxDefaults{
		Env: map[string]string{"GREETING": "hi", "WHO": "session"}, WorkspaceDir: "/workspace/app",
	}})
	require.Equal(t, http.StatusCreated, status, "%v", m)

	// The default box: the session's settings.
	assert.Equal(t, "/workspace/app\nhi session\n", h.tool("shell", map[string]any{"command": `pwd; echo "$GREETING $WHO"`})["stdout"])
	assert.Equal(t, "/workspace/app/rel.txt", h.tool("write_file", map[string]any{"path": "rel.txt", "content": "x"})["path"])
	assert.Equal(t, "x", h.tool("read_file", map[string]any{"path": "/workspace/app/rel.txt"})["content"])
	assert.Equal(t, "/workspace/app/rel.txt\n", h.tool("shell", map[string]any{"command": "ls $PWD/*.txt"})["stdout"])

	// A box of its own: sandbox_create overrides (env merged, its keys win).
	h.tool("sandbox_create", map[string]any{"sandbox": "other", "workspace_dir": "/tmp/w", "env": map[string]string{"WHO": "box"}})
	assert.Equal(t, "/tmp/w\nhi box\n", h.tool("shell", map[string]any{"sandbox": "other", "command": `pwd; echo "$GREETING $WHO"`})["stdout"])
	m = h.tool("sandbox_create", map[string]any{"sandbox": "other", "workspace_dir": "/workspace/x"})
	assert.Equal(t, false, m["created"])
	assert.Contains(t, m["notice"], `already exists with workspace_dir /tmp/w`)
	list := listed(h)
	assert.Equal(t, "/workspace/app", list["default"]["workspace_dir"])
	assert.Equal(t, "/tmp/w", list["other"]["workspace_dir"])

	// A workspace_dir off the box's writable disk is refused, saying so.
	tests := []struct{ dir, want string }{
		{"/etc", "outside the box's writable disk"},
		{"/usr/local/app", "outside the box's writable disk"},
		{"app", "clean absolute path"},
		{"/workspace/../etc", "clean absolute path"},
	}
	for _, tc := range tests {
		t.Run(tc.dir, func(t *testing.T) {
			m := h.call("sandbox_create", map[string]any{"sandbox": "bad", "workspace_dir": tc.dir})
			assert.Equal(t, true, m["is_error"])
			assert.Equal(t, api.CodeInvalidInput, m["code"])
			assert.Contains(t, m["error"], tc.want)
			status, _, body := newSessionWith(t, url, map[string]any{"workspace_dir": tc.dir})
			assert.Equal(t, http.StatusBadRequest, status)
			assert.Contains(t, body["error"], tc.want)
		})
	}
	assert.NotContains(t, listed(h), "bad")

	// env as a session default is refused under allowed_commands, as in
	// sandbox_create.
	status, _, body := newSessionWith(t, url, map[string]any{"allowed_commands": []string{"ls"}, "env": map[string]string{"LD_PRELOAD": "/tmp/x.so"}})
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Contains(t, body["error"], "env refused")

	// An env no box could take is refused at once, as sandbox_create
	// refuses it (it used to make a session whose every box failed as
	// internal).
	for _, env := range []map[string]string{{"A=B": "x"}, {"": "x"}, {"X": "a\x00b"}} {
		status, _, body = newSessionWith(t, url, map[string]any{"env": env})
		assert.Equal(t, http.StatusBadRequest, status, "%q", env)
		assert.Contains(t, body["error"], "names must be non-empty without '=' or NUL")
		assert.Equal(t, api.CodeInvalidInput, body["code"])
	}
}

// TestDestroyOnClose: boxes made with destroy_on_close go when the session
// closes — the last MCP session served on it ends — and the others stay
// (asleep later) for the next connection; the session's default applies
// and sandbox_create overrides it. Today's closes keep working: deleting
// the session destroys every box.
func TestDestroyOnClose(t *testing.T) {
	s, _ := sandboxtest.Service(t, sandboxtest.Options{})
	url := startHTTP(t, s)
	status, h, m := newSessionWith(t, url, map[string]any{"destroy_on_close": true})
	require.Equal(t, http.StatusCreated, status, "%v", m)
	keep := newHTTPSession(t, url) // no destroy_on_close: today's behaviour

	a := mcptest.MustConnect(t, mcptest.HTTP(url+"/v1/sessions/"+h.id+"/mcp", h.token))
	b := mcptest.MustConnect(t, mcptest.HTTP(url+"/v1/sessions/"+h.id+"/mcp", h.token))
	res, _ := a.Call(t, "shell", map[string]any{"command": "echo one-shot > f"})
	require.False(t, res.IsError)
	res, _ = b.Call(t, "sandbox_create", map[string]any{"sandbox": "kept", "destroy_on_close": false})
	require.False(t, res.IsError)
	keep.tool("shell", map[string]any{"command": "echo kept > f"})
	list := listed(h)
	assert.Equal(t, true, list["default"]["destroy_on_close"])
	assert.Nil(t, list["kept"]["destroy_on_close"], "false is left out")
	before := boxes(s)

	// Closing one of two MCP sessions closes nothing.
	require.NoError(t, a.Close())
	res, _ = b.Call(t, "read_file", map[string]any{"path": "f"})
	require.False(t, res.IsError, "the other MCP session still uses the box")
	// The last one closes the session: its destroy_on_close box goes.
	require.NoError(t, b.Close())
	require.Eventually(t, func() bool { _, ok := listed(h)["default"]; return !ok }, 10*time.Second, 20*time.Millisecond)
	assert.Contains(t, listed(h), "kept", "destroy_on_close: false overrides the session's default")
	assert.Equal(t, before-1, boxes(s), "the box is gone from the backend")

	// Deleting a session destroys its boxes, with or without the setting.
	req, _ := http.NewRequest(http.MethodDelete, url+"/v1/sessions/"+keep.id, nil)
	req.Header.Set("Authorization", "Bearer "+keep.token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, before-2, boxes(s))
}

// TestWaitPort: wait_port returns once a server started in the background
// listens, and says listening: false (with a notice) when nothing does
// within timeout_ms; bad input is a tool error.
func TestWaitPort(t *testing.T) {
	s, _ := sandboxtest.Service(t, sandboxtest.Options{})
	h := newHTTPSession(t, startHTTP(t, s))
	m := h.tool("wait_port", map[string]any{"port": 8125, "timeout_ms": 100})
	assert.Equal(t, false, m["listening"])
	assert.Contains(t, m["notice"], "nothing listened on port 8125")

	h.tool("shell", map[string]any{"command": "sleep 0.3; exec python3 -m http.server 8125 --bind 127.0.0.1", "background": true})
	m = h.tool("wait_port", map[string]any{"port": 8125, "timeout_ms": 20000})
	assert.Equal(t, true, m["listening"], "%v", m)
	assert.Equal(t, 0.0, h.tool("shell", map[string]any{"command": "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 8125))\""})["exit_code"])

	for _, in := range []map[string]any{{"port": 0}, {"port": 70000}, {"port": 80, "timeout_ms": 700000}} {
		m := h.call("wait_port", in)
		assert.Equal(t, true, m["is_error"], "%v", in)
	}
}
