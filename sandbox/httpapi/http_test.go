package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/api"
)

// startHTTP serves Handler(s) on a test server and returns its URL.
func startHTTP(t *testing.T, s *sandbox.Service) string {
	return startHTTPWith(t, s, Options{})
}

// startHTTPWith is startHTTP with the handler's opts.
func startHTTPWith(t *testing.T, s *sandbox.Service, opts Options) string {
	srv := httptest.NewServer(HandlerWith(s, opts))
	t.Cleanup(srv.Close)
	s.SetBaseURL(srv.URL)
	return srv.URL
}

// httpSession is a session of a test server, driven over HTTP.
type httpSession struct {
	t     *testing.T
	url   string
	id    string
	token string
}

func newHTTPSession(t *testing.T, url string) *httpSession {
	resp, err := http.Post(url+"/v1/sessions", "application/json", nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	var ns api.NewSessionResult
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&ns))
	return &httpSession{t: t, url: url, id: ns.ID, token: ns.Token}
}

// raw posts body to tool name and returns the status and decoded body.
func (h *httpSession) raw(name, body, token string) (int, map[string]any) {
	req, err := http.NewRequest(http.MethodPost, h.url+"/v1/sessions/"+h.id+"/tools/"+name, strings.NewReader(body))
	require.NoError(h.t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(h.t, err)
	defer resp.Body.Close()
	require.Equal(h.t, "application/json", resp.Header.Get("Content-Type"))
	var m map[string]any
	require.NoError(h.t, json.NewDecoder(resp.Body).Decode(&m))
	return resp.StatusCode, m
}

// call calls a tool and returns its result (which may be an error result).
func (h *httpSession) call(name string, input any) map[string]any {
	h.t.Helper()
	body, err := json.Marshal(input)
	require.NoError(h.t, err)
	status, m := h.raw(name, string(body), h.token)
	require.Equal(h.t, http.StatusOK, status, "%s: %v", name, m)
	return m
}

// tool calls a tool that must succeed.
func (h *httpSession) tool(name string, input any) map[string]any {
	h.t.Helper()
	m := h.call(name, input)
	require.Equal(h.t, false, m["is_error"], "%s: %v", name, m["error"])
	return m
}

// boxes counts the boxes of s's sessions that exist in the backend.
func boxes(s *sandbox.Service) int {
	n := 0
	for _, c := range s.Metrics().Boxes {
		n += c.N
	}
	return n
}

// A malformed body's error says where its syntax breaks: for a body cut
// short, at its end (a lone "{" was "at offset 0 (line 1, column 1)").
func TestDescribeJSONError(t *testing.T) {
	for body, want := range map[string]string{
		"{":                  "unexpected end of JSON input at offset 1 (line 1, column 2)",
		"{\n  \"a\": 1,\n}":  "invalid character '}' looking for beginning of object key string at offset 12 (line 3, column 1)",
		"{\"command\": tru}": "invalid character '}' in literal true (expecting 'e') at offset 15 (line 1, column 16)",
	} {
		var v any
		assert.Equal(t, want, describeJSONError([]byte(body), json.Unmarshal([]byte(body), &v)), body)
	}
}
