package sandboxtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox"
)

// Caller returns a function that calls a tool in a new session of svc
// and returns its result, failing the test on an error result (a call
// that met its box's death on a connection it had is made once more),
// and the session's id.
func Caller(t testing.TB, svc *sandbox.Service) (func(name string, in map[string]any) map[string]any, string) {
	ctx := context.Background()
	sid, _, err := svc.NewSession(ctx)
	require.NoError(t, err)
	return func(name string, in map[string]any) map[string]any {
		t.Helper()
		raw, _ := json.Marshal(in)
		cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		res, err := svc.CallTool(cctx, sid, name, raw)
		require.NoError(t, err, "%s %s", name, raw)
		var out map[string]any
		require.NoError(t, json.Unmarshal(res, &out))
		if strings.Contains(fmt.Sprint(out["error"]), "the next call restarts it") {
			// A call that met the death on a connection it had: the
			// request may have been sent, so it is not sent again.
			res, err = svc.CallTool(cctx, sid, name, raw)
			require.NoError(t, err, "%s %s", name, raw)
			out = nil
			require.NoError(t, json.Unmarshal(res, &out))
		}
		require.NotEqual(t, true, out["is_error"], "%s %s: %s", name, raw, res)
		return out
	}, sid
}

// AllowList checks network allow lists on svc's backend (written for the
// remote ones, whose boxes reach the server's egress proxy only through
// their agents): a box reaches what its list allows and nothing else,
// several connections at once, each request with a header injected that
// the box never sees; network_set changes the list of the running box.
// Python is all it needs in the box.
func AllowList(t *testing.T, svc *sandbox.Service) {
	call, _ := Caller(t, svc)
	var mu sync.Mutex
	var hits []string
	upstream := func(name string) string {
		ln, err := net.Listen("tcp", "127.0.0.2:0")
		require.NoError(t, err)
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			hits = append(hits, name+" "+r.Header.Get("Authorization"))
			mu.Unlock()
			fmt.Fprintf(w, "hello from %s", name)
		})}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
		return ln.Addr().String()
	}
	a, b := upstream("a"), upstream("b")
	get := func(addr string) string {
		return fmt.Sprintf(`python3 -c 'import urllib.request,urllib.error,sys
try: sys.stdout.write(urllib.request.urlopen("http://%s/", timeout=30).read().decode())
except urllib.error.HTTPError as e: sys.stdout.write("refused %%d: %%s" %% (e.code, e.read().decode()))'`, addr)
	}
	call("sandbox_create", map[string]any{"sandbox": "net", "network": map[string]any{
		"allow":  []string{a},
		"inject": []map[string]any{{"host": "127.0.0.2", "header": "Authorization", "value": "Bearer allow-list-secret"}},
	}})
	out := call("shell", map[string]any{"sandbox": "net", "command": get(a)})
	assert.Equal(t, "hello from a", out["stdout"], "%v", out)
	out = call("shell", map[string]any{"sandbox": "net", "command": get(b)})
	assert.Contains(t, out["stdout"], "refused 403", "%v", out)
	assert.Contains(t, out["stdout"], "no rule of box")
	// Several at once: each is a connection lent of its own.
	out = call("shell", map[string]any{"sandbox": "net", "command": "for i in 1 2 3 4 5 6; do " + get(a) + " & done; wait"})
	assert.Equal(t, strings.Repeat("hello from a", 6), out["stdout"], "%v", out)
	mu.Lock()
	assert.Equal(t, slices.Repeat([]string{"a Bearer allow-list-secret"}, 7), hits, "only a was reached, each time with the header the box never saw")
	mu.Unlock()
	env := call("shell", map[string]any{"sandbox": "net", "command": "env; cat /proc/1/environ"})
	assert.NotContains(t, fmt.Sprint(env), "allow-list-secret")

	call("network_set", map[string]any{"sandbox": "net", "allow": []string{a, b}})
	out = call("shell", map[string]any{"sandbox": "net", "command": get(b)})
	assert.Equal(t, "hello from b", out["stdout"], "%v", out)

	// A box without a list is refused, saying how to open it; given one
	// while it runs, it reaches what the list allows.
	call("sandbox_create", map[string]any{"sandbox": "closed"})
	out = call("shell", map[string]any{"sandbox": "closed", "command": get(a)})
	assert.Contains(t, out["stdout"], "refused 403", "%v", out)
	assert.Contains(t, out["stdout"], "network_set", "%v", out)
	call("network_set", map[string]any{"sandbox": "closed", "allow": []string{a}})
	out = call("shell", map[string]any{"sandbox": "closed", "command": get(a)})
	assert.Equal(t, "hello from a", out["stdout"], "%v", out)
}
