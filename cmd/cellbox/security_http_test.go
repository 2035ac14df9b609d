package main

// The HTTP attack suite: a real `cellbox serve` attacked from outside, as a
// hostile web page (DNS rebinding, other origins, a page served from a box
// in a real browser), a client without the key or with another session's
// token, and slow clients would.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
)

// attacker sends raw requests to a server: any Host, any headers, no
// redirects followed, nothing added.
type attacker struct {
	t    *testing.T
	base string // http://127.0.0.1:PORT
	port string
	key  string // the server key, read from DATA/server.key ("" if none)
	hc   *http.Client
}

// targetServer starts a serve with a session and a loaded pattern for an
// attack, and returns what a user would see of its state before it.
func targetServer(t *testing.T) (a *attacker, id, token, before string) {
	t.Helper()
	data := t.TempDir()
	srv := startServe(t, data, "--pool", "0")
	a = newAttacker(t, srv.url, data)
	id, token = a.newSession()
	status, body := a.do("POST", "/v1/patterns", "", `{"path": "`+writePattern(t, sumPattern)+`"}`, bearer(a.key))
	require.Equal(t, http.StatusCreated, status, body)
	return a, id, token, a.state(id, token)
}

func newAttacker(t *testing.T, base, data string) *attacker {
	u, err := neturl.Parse(base)
	require.NoError(t, err)
	key, _ := os.ReadFile(filepath.Join(data, "server.key"))
	return &attacker{t: t, base: base, port: u.Port(), key: strings.TrimSpace(string(key)),
		hc: &http.Client{Timeout: time.Minute, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// do sends method path to the server with Host host ("" for the real one)
// and headers, and returns the status and body.
func (a *attacker) do(method, path, host, body string, headers map[string]string) (int, string) {
	a.t.Helper()
	req, err := http.NewRequest(method, a.base+path, strings.NewReader(body))
	require.NoError(a.t, err)
	if host != "" {
		req.Host = host
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := a.hc.Do(req)
	require.NoError(a.t, err, "%s %s", method, path)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func bearer(token string) map[string]string {
	return map[string]string{"Authorization": "Bearer " + token}
}

// wrong returns a secret with its first character changed.
func wrong(secret string) string {
	if strings.HasPrefix(secret, "0") {
		return "1" + secret[1:]
	}
	return "0" + secret[1:]
}

// newSession creates a session with the server key.
func (a *attacker) newSession() (id, token string) {
	a.t.Helper()
	status, body := a.do("POST", "/v1/sessions", "", "", bearer(a.key))
	require.Equal(a.t, http.StatusCreated, status, body)
	var res struct{ ID, Token string }
	require.NoError(a.t, json.Unmarshal([]byte(body), &res))
	return res.ID, res.Token
}

// sessions lists the server's session ids (with the key).
func (a *attacker) sessions() []string {
	a.t.Helper()
	status, body := a.do("GET", "/v1/sessions", "", "", bearer(a.key))
	if !assert.Equal(a.t, http.StatusOK, status, "list sessions: %s", body) {
		return nil
	}
	var list []struct{ ID string }
	require.NoError(a.t, json.Unmarshal([]byte(body), &list))
	ids := make([]string, len(list))
	for i, s := range list {
		ids[i] = s.ID
	}
	return ids
}

// state is what an attack must not change: the sessions, the loaded
// patterns, the cell calc/a, and whether /workspace/pwned exists in the
// default box of the test's session.
func (a *attacker) state(id, token string) string {
	a.t.Helper()
	_, patterns := a.do("GET", "/v1/patterns", "", "", bearer(a.key))
	var names []string
	var ins []struct{ Space, Name string }
	json.Unmarshal([]byte(patterns), &ins)
	for _, in := range ins {
		names = append(names, in.Space+"/"+in.Name)
	}
	_, cell := a.do("GET", "/v1/cells/default/calc/a", "", "", bearer(a.key))
	var c struct{ Value json.RawMessage }
	json.Unmarshal([]byte(cell), &c)
	_, shell := a.do("POST", "/v1/sessions/"+id+"/tools/shell", "", `{"command":"test -e /workspace/pwned && echo PWNED || echo clean"}`, bearer(token))
	var sh struct{ Stdout string }
	json.Unmarshal([]byte(shell), &sh)
	return fmt.Sprintf("sessions %v; patterns %v; calc/a = %s; box: %s", a.sessions(), names, c.Value, strings.TrimSpace(sh.Stdout))
}

// TestHTTPServerKey: creating and listing sessions, /metrics, the runtime
// API and the page need the server key (missing: 401, wrong: 403); a
// session's routes need that session's token (another session's token, or
// the server key, is 403). The key is made once, 0600, and kept.
func TestHTTPServerKey(t *testing.T) {
	testenv.RequireBwrap(t)
	data := t.TempDir()
	srv := startServe(t, data, "--pool", "0")
	a := newAttacker(t, srv.url, data)
	require.NotEmpty(t, a.key, "serve made DATA/server.key")
	fi, err := os.Stat(filepath.Join(data, "server.key"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	before := a.sessions()

	keyed := []struct{ method, path, body string }{
		{"POST", "/v1/sessions", ""},
		{"GET", "/v1/sessions", ""},
		{"GET", "/metrics", ""},
		{"GET", "/v1/patterns", ""},
		{"POST", "/v1/patterns", `{"yaml": "name: evil\ncells:\n  x: 1\n"}`},
		{"GET", "/v1/cells", ""},
		{"GET", "/v1/watch", ""},
		{"POST", "/", ""},
		{"GET", "/v2/nothing", ""},
	}
	for _, r := range keyed {
		status, body := a.do(r.method, r.path, "", r.body, nil)
		assert.Equal(t, http.StatusUnauthorized, status, "%s %s without the key: %s", r.method, r.path, body)
		assert.Contains(t, body, "server key", "%s %s: the error says what is missing", r.method, r.path)
		status, body = a.do(r.method, r.path, "", r.body, bearer(wrong(a.key)))
		assert.Equal(t, http.StatusForbidden, status, "%s %s with a wrong key: %s", r.method, r.path, body)
		// A cookie is no credential, not even with the right key: browsers
		// send a host's cookies to every port of it, so any other server
		// on localhost would have received it.
		status, _ = a.do(r.method, r.path, "", r.body, map[string]string{"Cookie": "cellbox_key_" + a.port + "=" + a.key})
		assert.Equal(t, http.StatusUnauthorized, status, "%s %s with the key in a cookie", r.method, r.path)
	}
	// The open prefixes do not lead elsewhere by dot segments.
	for _, p := range []string{"/v1/sessions/../metrics", "/v1/sessions/x%2F..%2F..%2Fmetrics", "/v1/sessions/..%2F..%2Fv1%2Fpatterns", "/preview/../v1/patterns", "/healthz/../v1/patterns"} {
		status, body := a.do("GET", p, "", "", nil)
		assert.Contains(t, []int{http.StatusUnauthorized, http.StatusNotFound, http.StatusMethodNotAllowed}, status, "%s: %s", p, body)
	}
	assert.Equal(t, before, a.sessions(), "no session was made without the key")
	status, _ := a.do("GET", "/v1/patterns", "", "", bearer(a.key))
	assert.Equal(t, http.StatusOK, status)
	status, _ = a.do("GET", "/metrics", "", "", bearer(a.key))
	assert.Equal(t, http.StatusOK, status)
	status, _ = a.do("GET", "/healthz", "", "", nil)
	assert.Equal(t, http.StatusOK, status, "the health check is open")
	status, _ = a.do("GET", "/v1/tools", "", "", nil)
	assert.Equal(t, http.StatusOK, status, "the tool list is open")

	idA, tokA := a.newSession()
	idB, tokB := a.newSession()
	assert.Subset(t, a.sessions(), []string{idA, idB}, "GET /v1/sessions lists them")
	shell := `{"command":"echo ok"}`
	for _, tc := range []struct {
		name, method, path, body string
		headers                  map[string]string
		want                     int
	}{
		{"no token", "POST", "/v1/sessions/" + idA + "/tools/shell", shell, nil, http.StatusUnauthorized},
		{"wrong token", "POST", "/v1/sessions/" + idA + "/tools/shell", shell, bearer(wrong(tokA)), http.StatusForbidden},
		{"another session's token", "POST", "/v1/sessions/" + idA + "/tools/shell", shell, bearer(tokB), http.StatusForbidden},
		{"the server key is not a session token", "POST", "/v1/sessions/" + idA + "/tools/shell", shell, bearer(a.key), http.StatusForbidden},
		{"MCP, another session's token", "POST", "/v1/sessions/" + idA + "/mcp", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, bearer(tokB), http.StatusForbidden},
		{"delete, another session's token", "DELETE", "/v1/sessions/" + idA, "", bearer(tokB), http.StatusForbidden},
		{"files, another session's token", "GET", "/v1/sessions/" + idA + "/boxes/default/files/x", "", bearer(tokB), http.StatusForbidden},
		{"its own token", "POST", "/v1/sessions/" + idA + "/tools/shell", shell, bearer(tokA), http.StatusOK},
	} {
		status, body := a.do(tc.method, tc.path, "", tc.body, tc.headers)
		assert.Equal(t, tc.want, status, "%s: %s", tc.name, body)
	}
	assert.Contains(t, a.sessions(), idA, "session A survived B's delete")

	// The key is kept: a restart over the same data dir uses it again.
	require.NoError(t, srv.stop(t))
	srv = startServe(t, data, "--pool", "0")
	b := newAttacker(t, srv.url, data)
	assert.Equal(t, a.key, b.key)
	status, body := b.do("POST", "/v1/sessions/"+idA+"/tools/shell", "", shell, bearer(tokA))
	assert.Equal(t, http.StatusOK, status, body)

	// CELLBOX_KEY sets the key instead of the file, and the CLI finds it.
	sessionNew := func(env ...string) ([]byte, error) {
		cmd := exec.Command(testenv.CellboxBinary(t), "session", "new", "--server", srv.url, "--data", t.TempDir())
		cmd.Env = append(cleanEnv(), env...)
		return cmd.CombinedOutput()
	}
	out, err := sessionNew()
	require.Error(t, err, "no key, no session: %s", out)
	assert.Contains(t, string(out), "CELLBOX_KEY")
	out, err = sessionNew("CELLBOX_KEY=" + a.key)
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "export CELLBOX_TOKEN=")
}

// TestHTTPServerKeyDeletesSession: the operator's server key deletes any
// session and destroys its boxes (a session whose token is lost would
// otherwise keep them until it expires), over HTTP and with `cellbox
// session rm ID --data DIR`; a wrong key or another session's token still
// cannot, and a session's own token still deletes it.
func TestHTTPServerKeyDeletesSession(t *testing.T) {
	testenv.RequireBwrap(t)
	data := t.TempDir()
	srv := startServe(t, data, "--pool", "0")
	a := newAttacker(t, srv.url, data)
	idA, tokA := a.newSession()
	idB, tokB := a.newSession()
	idC, tokC := a.newSession()
	status, body := a.do("POST", "/v1/sessions/"+idA+"/tools/shell", "", `{"command":"echo up"}`, bearer(tokA))
	require.Equal(t, http.StatusOK, status, body)
	boxDirs := func() []string {
		dirs, err := filepath.Glob(filepath.Join(data, "local", "cb-*"))
		require.NoError(t, err)
		return dirs
	}
	require.Len(t, boxDirs(), 1, "session A has its default box")

	for _, tc := range []struct {
		name, auth string
		want       int
	}{
		{"wrong key", wrong(a.key), http.StatusForbidden},
		{"another session's token", tokB, http.StatusForbidden},
		{"the server key", a.key, http.StatusOK},
		{"the server key, again", a.key, http.StatusNotFound},
	} {
		status, body := a.do("DELETE", "/v1/sessions/"+idA, "", "", bearer(tc.auth))
		assert.Equal(t, tc.want, status, "%s: %s", tc.name, body)
	}
	assert.NotContains(t, a.sessions(), idA)
	assert.Empty(t, boxDirs(), "the server key's delete destroyed the session's box")
	status, body = a.do("POST", "/v1/sessions/"+idA+"/tools/shell", "", `{"command":"true"}`, bearer(tokA))
	assert.Equal(t, http.StatusNotFound, status, body)
	assert.Contains(t, body, "no_session")
	status, body = a.do("POST", "/v1/sessions/"+idB+"/tools/shell", "", `{"command":"true"}`, bearer(a.key))
	assert.Equal(t, http.StatusForbidden, status, "the server key is still no session token on other routes: %s", body)

	// The CLI: --data finds the key, even with another session's token in
	// the environment; a session's own token still deletes it.
	rm := func(env []string, args ...string) (string, error) {
		cmd := exec.Command(testenv.CellboxBinary(t), append([]string{"session", "rm", "--server", srv.url}, args...)...)
		cmd.Env = append(cleanEnv(), env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := rm(nil, idB, "--data", t.TempDir())
	require.Error(t, err, "no key in that data dir: %s", out)
	assert.Contains(t, out, "CELLBOX_KEY")
	out, err = rm([]string{"CELLBOX_TOKEN=" + tokC}, idB, "--data", data)
	require.NoError(t, err, "%s", out)
	assert.NotContains(t, a.sessions(), idB)
	out, err = rm([]string{"CELLBOX_TOKEN=" + tokC}, idC)
	require.NoError(t, err, "%s", out)
	assert.NotContains(t, a.sessions(), idC)
}

// TestHTTPRebinding: a page of evil.example.com whose name resolves to
// 127.0.0.1 (DNS rebinding), a page of another origin, and a page a box
// serves (a preview origin) try every face: the tool API, MCP, the runtime
// API, the page, /metrics. Each is refused (421 for a Host the server does
// not answer to, naming --allowed-host; 403 for a foreign Origin), even
// with the right key or token, and nothing changes.
func TestHTTPRebinding(t *testing.T) {
	testenv.RequireBwrap(t)
	a, id, token, before := targetServer(t)
	require.Contains(t, before, "box: clean")

	port := a.port
	evil := "evil.example.com:" + port
	preview := "p" + strings.Repeat("0", 32) + ".localhost:" + port
	mcpCall := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"shell","arguments":{"command":"touch /workspace/pwned"}}}`
	faces := []struct {
		name, method, path, auth, body string
	}{
		{"create session", "POST", "/v1/sessions", a.key, ""},
		{"list sessions", "GET", "/v1/sessions", a.key, ""},
		{"tool call", "POST", "/v1/sessions/" + id + "/tools/shell", token, `{"command":"touch /workspace/pwned"}`},
		{"exec", "POST", "/v1/sessions/" + id + "/boxes/default/exec", token, `{"command":"touch /workspace/pwned"}`},
		{"file upload", "PUT", "/v1/sessions/" + id + "/boxes/default/files/pwned", token, "x"},
		{"MCP", "POST", "/v1/sessions/" + id + "/mcp", token, mcpCall},
		{"MCP with the server key", "POST", "/v1/mcp", a.key, mcpCall},
		{"runtime API: write a cell", "PUT", "/v1/cells/default/calc/a", a.key, "666"},
		{"runtime API: load a pattern", "POST", "/v1/patterns", a.key, `{"yaml": "name: evil\ncells:\n  x: 1\n"}`},
		{"runtime API: read", "GET", "/v1/cells", a.key, ""},
		{"page", "GET", "/", a.key, ""},
		{"metrics", "GET", "/metrics", a.key, ""},
		{"health", "GET", "/healthz", "", ""},
	}
	attacks := []struct {
		name, host string
		headers    map[string]string
		want       int
	}{
		{"rebound name", evil, map[string]string{"Origin": "http://" + evil}, http.StatusMisdirectedRequest},
		{"rebound name, no Origin", evil, nil, http.StatusMisdirectedRequest},
		{"a .localhost name that is no preview", "evil.localhost:" + port, nil, http.StatusMisdirectedRequest},
		{"page of another site", "", map[string]string{"Origin": "http://evil.example.com"}, http.StatusForbidden},
		{"page of another port", "", map[string]string{"Origin": "http://127.0.0.1:1"}, http.StatusForbidden},
		{"opaque origin", "", map[string]string{"Origin": "null"}, http.StatusForbidden},
		{"page of a preview", "", map[string]string{"Origin": "http://" + preview}, http.StatusForbidden},
		{"page of a preview, on localhost", "localhost:" + port, map[string]string{"Origin": "http://" + preview}, http.StatusForbidden},
		{"cross-site fetch without Origin", "", map[string]string{"Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
	}
	for _, f := range faces {
		for _, at := range attacks {
			h := map[string]string{}
			if f.auth != "" {
				h["Authorization"] = "Bearer " + f.auth
			}
			for k, v := range at.headers {
				h[k] = v
			}
			status, body := a.do(f.method, f.path, at.host, f.body, h)
			assert.Equal(t, at.want, status, "%s / %s: %s", f.name, at.name, body)
			var e struct{ Error string }
			assert.NoError(t, json.Unmarshal([]byte(body), &e), "%s / %s: a JSON error: %s", f.name, at.name, body)
			if at.want == http.StatusMisdirectedRequest {
				assert.Contains(t, e.Error, "--allowed-host", "%s / %s: the error names the flag", f.name, at.name)
			}
		}
		// A preview's own host reaches its box's server, never the APIs.
		h := map[string]string{}
		if f.auth != "" {
			h["Authorization"] = "Bearer " + f.auth
		}
		status, body := a.do(f.method, f.path, preview, f.body, h)
		assert.Equal(t, http.StatusNotFound, status, "%s on a preview host goes to the (unknown) preview: %s", f.name, body)
		assert.Contains(t, body, "no such preview", f.name)
	}
	assert.Equal(t, before, a.state(id, token), "nothing changed")

	// The server's own origin, by either loopback name, is served.
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "[::1]:" + port} {
		status, body := a.do("GET", "/v1/patterns", host, "", map[string]string{"Authorization": "Bearer " + a.key, "Origin": "http://" + host})
		assert.Equal(t, http.StatusOK, status, "%s: %s", host, body)
	}
	status, body := a.do("POST", "/v1/sessions/"+id+"/mcp", "localhost:"+port, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`,
		map[string]string{"Authorization": "Bearer " + token, "Origin": "http://localhost:" + port, "Content-Type": "application/json", "Accept": "application/json, text/event-stream"})
	assert.Equal(t, http.StatusOK, status, body)

	// A name given with --allowed-host is served (with the key).
	data2 := t.TempDir()
	srv2 := startServe(t, data2, "--pool", "0", "--allowed-host", "cellbox.internal")
	b := newAttacker(t, srv2.url, data2)
	status, body = b.do("GET", "/v1/sessions", "cellbox.internal:"+b.port, "", bearer(b.key))
	assert.Equal(t, http.StatusOK, status, body)
	status, _ = b.do("GET", "/v1/sessions", evil, "", bearer(b.key))
	assert.Equal(t, http.StatusMisdirectedRequest, status)
}

// TestHTTPSlowClients: connections that dribble a request body, or sit
// idle after a request, are closed by the server (with short limits set by
// flags), while a long-lived response (a watch) is not cut. A dribbled
// body is cut by its pace (--body-grace, --body-min-rate), answered 408,
// long before --body-timeout (left at its 5 minutes).
func TestHTTPSlowClients(t *testing.T) {
	testenv.RequireBwrap(t)
	data := t.TempDir()
	srv := startServe(t, data, "--pool", "0", "--body-grace", "1s", "--idle-timeout", "1s")
	a := newAttacker(t, srv.url, data)
	id, token := a.newSession()
	addr := strings.TrimPrefix(srv.url, "http://")

	// closed reports whether the server closes conn within a generous while
	// (the test's patience, not the server's limit).
	closed := func(conn net.Conn) error {
		conn.SetReadDeadline(time.Now().Add(45 * time.Second))
		_, err := io.Copy(io.Discard, conn)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return errors.New("the server kept the connection open")
		}
		return nil // EOF or reset: closed
	}
	// cut is closed for a dribbled body, which must be answered 408.
	cut := func(conn net.Conn) error {
		conn.SetReadDeadline(time.Now().Add(45 * time.Second))
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil {
			return fmt.Errorf("no answer to a dribbled body: %w", err)
		}
		if !strings.HasPrefix(line, "HTTP/1.1 408 ") {
			return fmt.Errorf("a dribbled body was answered %q, not 408", line)
		}
		return closed(conn)
	}

	const n = 20
	results := make(chan error, 2*n)
	for i := 0; i < n; i++ {
		// A body that never finishes: one byte now and then.
		go func() {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				results <- err
				return
			}
			defer conn.Close()
			fmt.Fprintf(conn, "POST /v1/sessions/%s/tools/shell HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{", id, addr, token)
			stop := make(chan struct{})
			defer close(stop)
			go func() {
				for {
					select {
					case <-stop:
						return
					case <-time.After(100 * time.Millisecond):
						if _, err := conn.Write([]byte(" ")); err != nil {
							return
						}
					}
				}
			}()
			results <- cut(conn)
		}()
		// A kept-alive connection that sits idle after one request.
		go func() {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				results <- err
				return
			}
			defer conn.Close()
			fmt.Fprintf(conn, "GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", addr)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				results <- err
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				results <- fmt.Errorf("healthz: %s", resp.Status)
				return
			}
			results <- closed(conn)
		}()
	}
	for i := 0; i < 2*n; i++ {
		assert.NoError(t, <-results)
	}

	// A watch outlives the body limit: an event sent after it still comes.
	status, body := a.do("POST", "/v1/patterns", "", `{"path": "`+writePattern(t, sumPattern)+`"}`, bearer(a.key))
	require.Equal(t, http.StatusCreated, status, body)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", srv.url+"/v1/watch?prefix=calc", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+a.key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	time.Sleep(2 * time.Second) // past the 1 s body grace
	status, body = a.do("PUT", "/v1/cells/default/calc/a", "", "41", bearer(a.key))
	require.Equal(t, http.StatusOK, status, body)
	for line := range lines {
		if strings.Contains(line, "41") {
			return
		}
	}
	t.Fatal("the watch ended before the change came")
}

// TestPreviewPageInChromium: a page served from a box, opened at its
// preview URL in headless Chromium, tries to create a session, load a
// pattern, write a cell and call a tool (with a stolen token, even) on the
// API's origin, by every name, and through its own origin. Every attempt
// fails and nothing changes on the server.
func TestPreviewPageInChromium(t *testing.T) {
	testenv.RequireBwrap(t)
	chromium := testenv.RequireCommand(t, "chromium") // scripts/test.sh installs it
	a, id, token, before := targetServer(t)

	page := strings.NewReplacer("PORT", a.port, "SESSION", id, "TOKEN", token).Replace(attackPage)
	input, _ := json.Marshal(map[string]string{"path": "site/index.html", "content": page})
	status, body := a.do("POST", "/v1/sessions/"+id+"/tools/write_file", "", string(input), bearer(token))
	require.Equal(t, http.StatusOK, status, body)
	status, body = a.do("POST", "/v1/sessions/"+id+"/tools/shell", "", `{"command":"cd /workspace/site && python3 -m http.server 8000 --bind 127.0.0.1", "background": true}`, bearer(token))
	require.Equal(t, http.StatusOK, status, body)
	status, body = a.do("POST", "/v1/sessions/"+id+"/tools/browse", "", `{"port": 8000}`, bearer(token))
	require.Equal(t, http.StatusOK, status, body)
	var br struct{ URL string }
	require.NoError(t, json.Unmarshal([]byte(body), &br))
	t.Logf("preview URL: %s", br.URL)
	u, err := neturl.Parse(br.URL)
	require.NoError(t, err)
	poll(t, "the page to be served through the preview", func() bool {
		probe := *u
		probe.Host = "127.0.0.1:" + probe.Port()
		status, body := a.do("GET", strings.TrimPrefix(probe.String(), a.base), u.Host, "", nil)
		return status == http.StatusOK && strings.Contains(body, "attack page")
	})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--user-data-dir="+t.TempDir(),
		"--virtual-time-budget=30000", "--dump-dom", br.URL)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	dom, err := cmd.Output()
	require.NoError(t, err, "chromium: %s", stderr.String())
	m := regexp.MustCompile(`RESULTS (\{.*\}) END`).FindSubmatch(dom)
	require.NotNil(t, m, "the page's script ran to its end; DOM:\n%s", dom)
	var res struct {
		Origin   string
		Attempts []struct{ Name, Target, Result string }
	}
	require.NoError(t, json.Unmarshal(m[1], &res), "%s", m[1])
	t.Logf("page origin %s", res.Origin)
	assert.Equal(t, "http://"+u.Host, res.Origin, "the page runs on its preview's own origin")
	require.NotEmpty(t, res.Attempts)
	for _, at := range res.Attempts {
		t.Logf("%-28s %-28s %s", at.Name, at.Target, at.Result)
		assert.NotRegexp(t, `^2\d\d`, at.Result, "%s on %s must not succeed", at.Name, at.Target)
	}
	assert.Equal(t, before, a.state(id, token), "nothing changed on the server")
}

// attackPage is served from a box. Its script tries the APIs on every
// name of the server's origin and on its own origin (where, before
// previews had origins of their own, the API answered too), then writes
// what happened into the DOM between RESULTS and END.
const attackPage = `<!doctype html><html><head><title>attack page</title></head><body><pre id="out">attack page: running</pre><script>
(async () => {
  const targets = ['http://127.0.0.1:PORT', 'http://localhost:PORT', ''];
  const auth = {'Authorization': 'Bearer TOKEN', 'Content-Type': 'application/json'};
  const attempts = [];
  for (const t of targets) {
    const tries = [
      ['create session', '/v1/sessions', {method: 'POST'}],
      ['create session (no-cors)', '/v1/sessions', {method: 'POST', mode: 'no-cors', credentials: 'include'}],
      ['list sessions', '/v1/sessions', {credentials: 'include'}],
      ['load pattern (no-cors)', '/v1/patterns', {method: 'POST', mode: 'no-cors', credentials: 'include', headers: {'Content-Type': 'text/plain'}, body: JSON.stringify({yaml: 'name: evil\ncells:\n  x: 1\n'})}],
      ['load pattern', '/v1/patterns', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify({yaml: 'name: evil\ncells:\n  x: 1\n'})}],
      ['write cell', '/v1/cells/default/calc/a', {method: 'PUT', credentials: 'include', headers: {'Content-Type': 'application/json'}, body: '666'}],
      ['read cells', '/v1/cells', {credentials: 'include'}],
      ['tool call (stolen token)', '/v1/sessions/SESSION/tools/shell', {method: 'POST', headers: auth, body: JSON.stringify({command: 'touch /workspace/pwned'})}],
      ['tool call (no-cors)', '/v1/sessions/SESSION/tools/shell', {method: 'POST', mode: 'no-cors', headers: {'Content-Type': 'text/plain'}, body: JSON.stringify({command: 'touch /workspace/pwned'})}],
      ['MCP call (stolen token)', '/v1/sessions/SESSION/mcp', {method: 'POST', headers: Object.assign({'Accept': 'application/json, text/event-stream'}, auth), body: JSON.stringify({jsonrpc: '2.0', id: 1, method: 'tools/call', params: {name: 'shell', arguments: {command: 'touch /workspace/pwned'}}})}],
      ['MCP call (no-cors)', '/v1/sessions/SESSION/mcp', {method: 'POST', mode: 'no-cors', headers: {'Content-Type': 'text/plain'}, body: JSON.stringify({jsonrpc: '2.0', id: 1, method: 'tools/call', params: {name: 'shell', arguments: {command: 'touch /workspace/pwned'}}})}],
      ['page', '/', {credentials: 'include'}],
    ];
    for (const [name, path, opts] of tries) {
      if (t === '' && path === '/') continue; // its own page, of course
      let result;
      try {
        const res = await fetch(t + path, opts);
        result = res.type === 'opaque' ? 'opaque (unreadable)' : res.status + ' ' + (await res.text()).replace(/\s+/g, ' ').slice(0, 100);
      } catch (e) {
        result = 'failed: ' + e.message;
      }
      attempts.push({name, target: t || location.origin, result});
    }
  }
  document.getElementById('out').textContent = 'RESULTS ' + JSON.stringify({origin: location.origin, attempts}) + ' END';
})();
</script></body></html>`
