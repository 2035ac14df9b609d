package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/sandboxtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHTTPProtocolFaults(t *testing.T) {
	s, _ := sandboxtest.Service(t, sandboxtest.Options{})
	url := startHTTP(t, s)
	a, b := newHTTPSession(t, url), newHTTPSession(t, url)

	tests := []struct {
		name, tool, body, token string
		status                  int
		contains                []string
	}{
		{"no token", "shell", `{"command":"true"}`, "", 401, []string{"bearer token"}},
		{"wrong token", "shell", `{"command":"true"}`, strings.Repeat("0", 64), 403, []string{"does not grant access"}},
		{"other session's token", "shell", `{"command":"true"}`, b.token, 403, []string{"does not grant access"}},
		{"malformed JSON", "shell", "{\n \"command\": \"true\",\n}", a.token, 400, []string{"malformed JSON", "line 3", "column 1"}},
		{"unknown tool", "sh", `{}`, a.token, 404, []string{`unknown tool "sh"`, "shell", "read_file", "transfer"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, m := a.raw(tt.tool, tt.body, tt.token)
			assert.Equal(t, tt.status, status)
			for _, c := range tt.contains {
				assert.Contains(t, m["error"], c)
			}
		})
	}
	t.Run("unknown session", func(t *testing.T) {
		c := *a
		c.id = "s-nope"
		status, m := c.raw("shell", `{"command":"true"}`, a.token)
		assert.Equal(t, 404, status)
		assert.Contains(t, m["error"], "no such session")
	})
	t.Run("unknown endpoint is JSON", func(t *testing.T) {
		resp, err := http.Get(url + "/v2/nothing")
		require.NoError(t, err)
		defer resp.Body.Close()
		assert.Equal(t, 404, resp.StatusCode)
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		resp2, err := http.Get(url + "/v1/sessions/s-x/tools/shell")
		require.NoError(t, err)
		defer resp2.Body.Close()
		assert.Equal(t, 405, resp2.StatusCode)
		assert.Equal(t, "application/json", resp2.Header.Get("Content-Type"))
	})
	assert.Equal(t, 0, boxes(s), "no box is made for a refused request")

	t.Run("delete session", func(t *testing.T) {
		a.tool("shell", map[string]any{"command": "true"})
		for _, tt := range []struct {
			token  string
			status int
		}{{b.token, 403}, {a.token, 200}, {a.token, 404}} {
			req, err := http.NewRequest(http.MethodDelete, url+"/v1/sessions/"+a.id, nil)
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer "+tt.token)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, tt.status, resp.StatusCode)
		}
		assert.Equal(t, 0, boxes(s), "the session's box went with it")
		status, m := a.raw("shell", `{"command":"true"}`, a.token)
		assert.Equal(t, 404, status, "the token is revoked: %v", m)
	})
}

func TestToolsEndpointSchemas(t *testing.T) {
	s, _ := sandboxtest.Service(t, sandboxtest.Options{})
	url := startHTTP(t, s)
	resp, err := http.Get(url + "/v1/tools")
	require.NoError(t, err)
	defer resp.Body.Close()
	var tools []api.ToolInfo
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&tools))
	var names []string
	for _, tl := range tools {
		names = append(names, tl.Name)
		assert.NotEmpty(t, tl.Description, tl.Name)
		var schema map[string]any
		require.NoError(t, json.Unmarshal(tl.InputSchema, &schema), tl.Name)
		assert.Equal(t, "object", schema["type"], tl.Name)
	}
	assert.Equal(t, []string{"shell", "process", "read_file", "write_file", "edit", "str_replace", "grep", "glob", "ls",
		"transfer", "browse", "wait_port", "run_code", "code_context_create", "code_context_list", "code_context_delete",
		"sandbox_create", "network_set", "sandbox_list", "sandbox_destroy",
		"snapshot", "snapshot_list", "snapshot_delete", "restore", "branch", "fork"}, names)
	var shell map[string]any
	require.NoError(t, json.Unmarshal(tools[0].InputSchema, &shell))
	props := shell["properties"].(map[string]any)
	assert.EqualValues(t, 30000, props["timeout_ms"].(map[string]any)["default"])
	assert.Equal(t, []any{"command"}, shell["required"])

	// A profile's list is the registry's (sandbox tests their shapes).
	for _, profile := range []string{"fs-tools", "deerflow", "cloudflare"} {
		resp, err := http.Get(url + "/v1/tools?profile=" + profile)
		require.NoError(t, err)
		var got []api.ToolInfo
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
		resp.Body.Close()
		want, err := sandbox.ToolInfosFor(profile)
		require.NoError(t, err)
		assert.Equal(t, want, got, profile)
	}
	resp, err = http.Get(url + "/v1/tools?profile=openai")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, string(body), `unknown tool profile \"openai\"; profiles: cellbox, cloudflare, fs-tools, deerflow`)
}

func TestBrowsePreview(t *testing.T) {
	s, _ := sandboxtest.Service(t, sandboxtest.Options{})
	h := newHTTPSession(t, startHTTP(t, s))
	// A server in the box (which has no network but loopback) that says
	// what it was asked.
	const port = 8080
	h.tool("write_file", map[string]any{"path": "app.py", "content": previewApp})
	app := h.tool("shell", map[string]any{"command": "python3 app.py", "background": true})["process_id"]
	require.Eventually(t, func() bool {
		return h.tool("browse", map[string]any{"port": port})["listening"] == true
	}, 10*time.Second, 50*time.Millisecond)

	b := h.tool("browse", map[string]any{"port": port})
	assert.Equal(t, true, b["listening"])
	u := b["url"].(string)
	apiPort := strings.Split(h.url, ":")[2]
	m := regexp.MustCompile(`^http://(p[0-9a-f]{32})\.localhost:` + apiPort + `/$`).FindStringSubmatch(u)
	require.NotNil(t, m, "a preview has an origin of its own, never the API's: %s", u)
	id := m[1]
	assert.Equal(t, u, b["host_url"], "host_url is the same URL")
	assert.Equal(t, u, h.tool("browse", map[string]any{"port": port})["url"], "stable per port")

	// The whole path goes to the app.
	resp, body := testenv.HTTPGet(t, u+"a/b?q=1", "")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, fmt.Sprintf("path=/a/b host=localhost:%d prefix=", port), body)

	// The old path form on the API's origin serves nothing: it redirects.
	resp, err := noRedirect.Get(h.url + "/preview/" + id + "/x/y?q=1")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusPermanentRedirect, resp.StatusCode)
	assert.Equal(t, u+"x/y?q=1", resp.Header.Get("Location"))

	resp, _ = testenv.HTTPGet(t, "http://p00000000000000000000000000000000.localhost:"+apiPort+"/", "")
	assert.Equal(t, 404, resp.StatusCode)

	h.tool("process", map[string]any{"action": "kill", "id": app})
	b = h.tool("browse", map[string]any{"port": port})
	assert.Equal(t, false, b["listening"])
	assert.Contains(t, b["notice"], "nothing listens")
	resp, _ = testenv.HTTPGet(t, u, "")
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
}

func TestMetricsAndHealth(t *testing.T) {
	s, _ := sandboxtest.Service(t, sandboxtest.Options{})
	h := newHTTPSession(t, startHTTP(t, s))
	h.tool("shell", map[string]any{"command": "true"})
	h.call("read_file", map[string]any{"path": "nope"})
	resp, err := http.Get(h.url + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`cellbox_tool_calls_total{tool="shell",outcome="ok"} 1`,
		`cellbox_tool_calls_total{tool="read_file",outcome="error"} 1`,
		`cellbox_tool_duration_seconds_count{tool="shell"} 1`,
		`cellbox_boxes{state="running"} 1`,
		`cellbox_sessions 1`,
	} {
		assert.Contains(t, string(body), want)
	}
	resp, err = http.Get(h.url + "/healthz")
	require.NoError(t, err)
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.JSONEq(t, `{"ok":true,"backend":"local"}`, string(bytes.TrimSpace(body)))
}

// noRedirect is a client that shows redirects instead of following them.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// previewApp is a web server for the box: it answers what it was asked.
const previewApp = `import http.server, urllib.parse
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = "path=%s host=%s prefix=%s" % (urllib.parse.urlsplit(self.path).path, self.headers["Host"], self.headers.get("X-Forwarded-Prefix", ""))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body.encode())
http.server.HTTPServer(("127.0.0.1", 8080), H).serve_forever()
`

// TestAllowedCommandsOverHTTP: POST /v1/sessions refuses a bad
// allowed_commands list (400), and the exec endpoint refuses a command
// the list does not allow before it reaches a box.
func TestAllowedCommandsOverHTTP(t *testing.T) {
	s, _ := sandboxtest.Service(t, sandboxtest.Options{})
	url := startHTTP(t, s)
	for _, body := range []string{`{"allowed_commands":[""]}`, `{"allowed_commands":["echo; rm"]}`, `{"allowed":["ls"]}`} {
		resp, err := http.Post(url+"/v1/sessions", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		var e api.ErrorBody
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
		resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, body)
		assert.NotEmpty(t, e.Error, body)
	}

	resp, err := http.Post(url+"/v1/sessions", "application/json", strings.NewReader(`{"allowed_commands":["echo"]}`))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	var ns api.NewSessionResult
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&ns))
	resp.Body.Close()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/sessions/"+ns.ID+"/boxes/default/exec", strings.NewReader(`{"command":"touch /workspace/ran"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+ns.Token)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var f api.ExecFrame
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&f))
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "the refused code's status, before any stream")
	assert.Equal(t, api.CodeRefused, f.Code)
	assert.Contains(t, f.Error, "is not allowed")
	assert.Nil(t, f.Result)
	assert.Equal(t, 0, boxes(s), "refused before it reaches a box")
}

// TestBoxEndpointStatusFollowsCode: a box endpoint's HTTP status says what
// its error code says (a bad box name is the caller's 400, not a 502 that
// blames the server), so a client that reads only the status acts right.
// The exec endpoint too: a bad box name (was 200 with an error frame) and
// a body of the wrong shape (was a raw Go unmarshal message, no code) are
// 400 invalid_input with a message naming the field; a good request
// streams frames with 200.
func TestBoxEndpointStatusFollowsCode(t *testing.T) {
	s, _ := sandboxtest.Service(t, sandboxtest.Options{})
	h := newHTTPSession(t, startHTTP(t, s))
	for _, tc := range []struct {
		name, method, path, body string
		msg                      []string
	}{
		{"files, bad box name", http.MethodGet, "/boxes/no%20such%20name!/files/x", "", []string{"invalid sandbox name"}},
		{"exec, bad box name", http.MethodPost, "/boxes/..%2F..%2Fx/exec", `{"command":"true"}`, []string{"invalid sandbox name"}},
		{"exec, argv a string", http.MethodPost, "/boxes/default/exec", `{"argv":"ls"}`, []string{`field "argv" of the exec request`, "expected an array, got string"}},
		{"exec, timeout_ms a string", http.MethodPost, "/boxes/default/exec", `{"command":"true","timeout_ms":"5"}`, []string{`field "timeout_ms"`, "expected an integer"}},
		{"exec, unknown field", http.MethodPost, "/boxes/default/exec", `{"cmd":"ls"}`, []string{`unknown field "cmd"`, "valid fields: command, argv"}},
		{"exec, no command", http.MethodPost, "/boxes/default/exec", `{}`, []string{"give a command or an argv"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, h.url+"/v1/sessions/"+h.id+tc.path, strings.NewReader(tc.body))
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer "+h.token)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			var e api.ErrorBody
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
			assert.Equal(t, api.CodeInvalidInput, e.Code, e.Error)
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode, e.Error)
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			for _, m := range tc.msg {
				assert.Contains(t, e.Error, m)
			}
		})
	}
	req, err := http.NewRequest(http.MethodPost, h.url+"/v1/sessions/"+h.id+"/boxes/default/exec", strings.NewReader(`{"argv":["echo","hi"]}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+h.token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "application/x-ndjson", resp.Header.Get("Content-Type"))
	dec := json.NewDecoder(resp.Body)
	var out string
	for {
		var f api.ExecFrame
		require.NoError(t, dec.Decode(&f))
		require.Empty(t, f.Error)
		out += string(f.Data)
		if f.Result != nil {
			break
		}
	}
	assert.Equal(t, "hi\n", out)
}

// TestShuttingDownIsUnavailable: once the server is shutting down (its
// boxes put to sleep), a box endpoint answers 503 with the code
// unavailable, and a tool call an error result with that code: call again
// once the server is back. Both said internal (502), a fault.
func TestShuttingDownIsUnavailable(t *testing.T) {
	s, _ := sandboxtest.Service(t, sandboxtest.Options{})
	h := newHTTPSession(t, startHTTP(t, s))
	h.tool("write_file", map[string]any{"path": "kept.txt", "content": "x"}) // the box is up
	require.NoError(t, s.SleepAll(context.Background()))

	m := h.call("read_file", map[string]any{"path": "kept.txt"})
	assert.Equal(t, true, m["is_error"])
	assert.Equal(t, api.CodeUnavailable, m["code"], m["error"])
	assert.Contains(t, m["error"], "the server is shutting down")
	for _, tc := range []struct{ method, path, body string }{
		{http.MethodPost, "/boxes/default/exec", `{"command":"true"}`},
		{http.MethodGet, "/boxes/default/files/kept.txt", ""},
		{http.MethodPut, "/boxes/default/files/new.txt", "y"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, h.url+"/v1/sessions/"+h.id+tc.path, strings.NewReader(tc.body))
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer "+h.token)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			var e api.ErrorBody
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
			assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, e.Error)
			assert.Equal(t, api.CodeUnavailable, e.Code, e.Error)
			assert.Contains(t, e.Error, "the server is shutting down")
		})
	}
}

// TestSessionLimitsOverHTTP: past --max-sessions, POST /v1/sessions answers
// 429 with the code limit (it answered 500 with no code), and a client may
// not delete the server's own session (the runtime's): 403 refused (the
// server key's DELETE broke every pattern until a restart).
func TestSessionLimitsOverHTTP(t *testing.T) {
	s, _ := sandboxtest.Service(t, sandboxtest.Options{MaxSessions: 2})
	url := startHTTP(t, s)
	own, ownToken, err := s.NewSession(context.Background())
	require.NoError(t, err)
	s.Client(own) // the runtime's, say
	newHTTPSession(t, url)
	newHTTPSession(t, url)
	resp, err := http.Post(url+"/v1/sessions", "application/json", nil)
	require.NoError(t, err)
	var e api.ErrorBody
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
	resp.Body.Close()
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, api.CodeLimit, e.Code)
	assert.Contains(t, e.Error, "cellbox serve --max-sessions")

	req, err := http.NewRequest(http.MethodDelete, url+"/v1/sessions/"+own, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+ownToken)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	e = api.ErrorBody{}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
	resp.Body.Close()
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.Equal(t, api.CodeRefused, e.Code)
	assert.Contains(t, e.Error, "this server's own session")
}
