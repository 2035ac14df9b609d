package sandbox

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// postMCP posts one JSON-RPC message to session id's MCP endpoint.
func postMCP(t *testing.T, url, id, token, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/sessions/"+id+"/mcp", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if len(data) == 0 {
		return resp.StatusCode, nil
	}
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	var m map[string]any
	require.NoError(t, json.Unmarshal(data, &m), string(data))
	return resp.StatusCode, m
}

func TestMCPOverHTTP(t *testing.T) {
	s := newTestService(t, newFakeBackend(t), "", nil)
	url := startHTTP(t, s)
	a, b := newHTTPSession(t, url), newHTTPSession(t, url)

	status, m := postMCP(t, url, a.id, a.token, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"test","version":"1"}}}`)
	require.Equal(t, http.StatusOK, status, m)
	init := m["result"].(map[string]any)
	assert.Equal(t, "2025-06-18", init["protocolVersion"])
	assert.Equal(t, "cellbox", init["serverInfo"].(map[string]any)["name"])
	assert.Equal(t, MCPInstructions, init["instructions"])

	status, m = postMCP(t, url, a.id, a.token, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	assert.Equal(t, http.StatusAccepted, status)
	assert.Nil(t, m)

	_, m = postMCP(t, url, a.id, a.token, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	assert.Len(t, m["result"].(map[string]any)["tools"], len(Tools()))

	// Tool calls run in the session's own boxes, as over the tools endpoint.
	_, m = postMCP(t, url, a.id, a.token, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"write_file","arguments":{"path":"note.txt","content":"from mcp"}}}`)
	assert.Equal(t, false, m["result"].(map[string]any)["isError"], m)
	assert.Equal(t, "from mcp", a.tool("read_file", map[string]any{"path": "note.txt"})["content"])
	_, m = postMCP(t, url, a.id, a.token, `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"note.txt"}}}`)
	res := m["result"].(map[string]any)
	assert.Equal(t, "from mcp", res["structuredContent"].(map[string]any)["content"])
	assert.Equal(t, false, res["isError"])
	_, m = postMCP(t, url, b.id, b.token, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"note.txt"}}}`)
	res = m["result"].(map[string]any)
	assert.Equal(t, true, res["isError"], "b's box has no note.txt")
	assert.Contains(t, res["content"].([]any)[0].(map[string]any)["text"], "no such file")

	ping := `{"jsonrpc":"2.0","id":6,"method":"ping"}`
	tests := []struct {
		name, id, token string
		status          int
		msg             string
	}{
		{"another session's token", a.id, b.token, http.StatusForbidden, "token does not grant access"},
		{"no token", a.id, "", http.StatusUnauthorized, "missing bearer token"},
		{"unknown session", "s-0000000000000000", a.token, http.StatusNotFound, "no such session"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, m := postMCP(t, url, tt.id, tt.token, ping)
			assert.Equal(t, tt.status, status)
			assert.Contains(t, m["error"], tt.msg)
		})
	}

	resp, err := http.Get(url + "/v1/sessions/" + a.id + "/mcp")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "GET opens no event stream")

	status, m = postMCP(t, url, a.id, a.token, `{"jsonrpc":"2.0","id":7,"method":`)
	assert.Equal(t, http.StatusBadRequest, status)
	assert.EqualValues(t, -32700, m["error"].(map[string]any)["code"])
}
