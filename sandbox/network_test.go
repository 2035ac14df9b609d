package sandbox

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	cryptotls "crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/egress"
)

// recorder is an HTTP server on the host's loopback (127.0.0.2, which a
// box's own loopback does not answer for through its proxy variables'
// NO_PROXY) that records what reaches it.
type recorder struct {
	srv   *httptest.Server
	roots *x509.CertPool // with tls: the CA that verifies it
	mu    sync.Mutex
	hits  []http.Header
}

func newRecorder(t *testing.T, name string) *recorder {
	return startRecorder(t, name, false)
}

func startRecorder(t *testing.T, name string, tls bool) *recorder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	require.NoError(t, err)
	r := &recorder{}
	r.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.hits = append(r.hits, req.Header.Clone())
		r.mu.Unlock()
		fmt.Fprintf(w, "hello from %s (tls %v)", name, req.TLS != nil)
	}))
	r.srv.Listener.Close()
	r.srv.Listener = ln
	if tls {
		r.srv.TLS = &cryptotls.Config{Certificates: []cryptotls.Certificate{r.selfSigned(t)}}
		r.srv.StartTLS()
	} else {
		r.srv.Start()
	}
	t.Cleanup(r.srv.Close)
	return r
}

// selfSigned makes a certificate for 127.0.0.2 (httptest's is for
// 127.0.0.1 only) and the pool that trusts it.
func (r *recorder) selfSigned(t *testing.T) cryptotls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "cellbox test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.2")},
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	r.roots = x509.NewCertPool()
	r.roots.AddCert(cert)
	return cryptotls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func (r *recorder) addr() string { return r.srv.Listener.Addr().String() }

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.hits)
}

func (r *recorder) last() http.Header {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hits[len(r.hits)-1]
}

// TestEgress drives the network of real boxes on both backends: an allow
// list enforced by the host's proxy, header injection whose value never
// enters the box, a change on a running box, and no way around the proxy.
func TestEgress(t *testing.T) {
	for _, kind := range []string{"local", "docker"} {
		t.Run(kind, func(t *testing.T) {
			const secret = "s3cret-Value-0f-the-key"
			const secretEnv = "from-the-Server-env-42"
			t.Setenv(api.SecretEnvPrefix+"NETTEST", secretEnv)
			logs := &syncBuffer{}
			a, b, tlsAPI := newRecorder(t, "a"), newRecorder(t, "b"), startRecorder(t, "api", true)
			rb := newRealService(t, kind, func(c *Config) {
				c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
				c.EgressRootCAs = tlsAPI.roots
			})
			sh := func(box, cmd string) string {
				t.Helper()
				m := rb.ok("shell", map[string]any{"sandbox": box, "command": cmd, "timeout_ms": 60000})
				return fmt.Sprint(m["stdout"], m["stderr"])
			}
			rb.ok("sandbox_create", map[string]any{"sandbox": "net", "network": map[string]any{
				"allow": []string{a.addr(), tlsAPI.addr()},
				"inject": []map[string]any{
					{"host": "127.0.0.2", "header": "Authorization", "value": "Bearer " + secret},
					{"host": "127.0.0.2", "header": "X-Api-Key", "secret": "NETTEST"},
				},
			}})

			// The allowed server answers, through curl and Python, each
			// request with the headers the box never saw.
			assert.Equal(t, "hello from a (tls false)", sh("net", "curl -sS http://"+a.addr()+"/curl"))
			assert.Equal(t, "Bearer "+secret, a.last().Get("Authorization"))
			assert.Equal(t, secretEnv, a.last().Get("X-Api-Key"))
			assert.Equal(t, "hello from a (tls false)", sh("net", `python3 -c 'import urllib.request,sys; sys.stdout.write(urllib.request.urlopen("http://`+a.addr()+`/py").read().decode())'`))
			assert.Equal(t, "Bearer "+secret, a.last().Get("Authorization"))
			hitsA := a.count()

			// The box has no DNS: names are resolved by the proxy only.
			assert.Contains(t, sh("net", `python3 -c '
import socket
try: print(socket.getaddrinfo("example.org", 80))
except OSError as e: print("no dns:", e)'`), "no dns:")

			// Others are refused, plain or through CONNECT, saying how to
			// allow them; nothing reaches them.
			out := sh("net", "curl -sS -i http://"+b.addr()+"/")
			assert.Contains(t, out, "403 Forbidden")
			assert.Contains(t, out, "no rule of box")
			out = sh("net", "curl -sS -p http://"+b.addr()+"/ 2>&1; echo exit=$?")
			assert.Contains(t, out, "CONNECT tunnel failed, response 403")
			assert.Equal(t, 0, b.count(), "nothing reached the server that is not allowed")

			// CONNECT to the allowed server is a tunnel: no header added.
			assert.Equal(t, "hello from a (tls false)", sh("net", "curl -sS -p http://"+a.addr()+"/tunnel"))
			assert.Empty(t, a.last().Get("Authorization"), "a CONNECT tunnel is not opened")

			// The secret is nowhere in the box: environment (its own and
			// PID 1's), the proxy's directory, the workspace, /tmp. The
			// script builds the secret from a reversed copy, so that its
			// own command line does not hold it.
			sh("net", "echo some work > notes.txt")
			probe := `import os,sys
s = [x[::-1] for x in sys.argv[1:]]
hits = []
def look(name, data):
    for x in s:
        if x.encode() in data: hits.append(name)
for k, v in os.environ.items(): look("env " + k, v.encode())
for p in ["/proc/self/environ", "/proc/1/environ", "/proc/self/cmdline"]:
    try: look(p, open(p, "rb").read())
    except OSError: pass
for root in ["/run/cellbox", "/workspace", "/tmp"]:
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            try:
                if os.path.isfile(p): look(p, open(p, "rb").read())
            except OSError: pass
print("hits:", hits)`
			rb.ok("write_file", map[string]any{"sandbox": "net", "path": "/tmp/probe.py", "content": probe})
			out = sh("net", "python3 /tmp/probe.py "+reverse(secret)+" "+reverse(secretEnv)+" "+reverse("s3cret"))
			assert.Equal(t, "hits: []\n", out)
			assert.Contains(t, sh("net", "env"), "HTTP_PROXY=http://127.0.0.1:3128", "the proxy is set, not the key")

			// sandbox_list and the logs show the rules, not the values.
			list := rb.ok("sandbox_list", nil)
			raw, _ := json.Marshal(list)
			assert.NotContains(t, string(raw), secret)
			assert.NotContains(t, string(raw), secretEnv)
			assert.Contains(t, string(raw), api.Redacted)
			assert.Contains(t, string(raw), `"secret":"NETTEST"`)
			assert.NotContains(t, logs.String(), secret)
			assert.NotContains(t, logs.String(), secretEnv)

			// Going around the proxy finds no route: the box's loopback
			// is its own, and it has no other interface.
			out = sh("net", "curl -sS -m 10 --noproxy '*' http://"+a.addr()+"/direct 2>&1; echo exit=$?")
			assert.NotContains(t, out, "hello from a")
			assert.Contains(t, out, "Failed to connect")
			out = sh("net", `python3 -c '
import socket
try:
    socket.create_connection(("192.0.2.1", 80), timeout=10); print("connected")
except OSError as e: print(e)'`)
			assert.Contains(t, out, "unreachable")
			assert.Equal(t, hitsA+1, a.count(), "only the tunnel went through since")

			// An HTTPS API: with tls the box calls http:// and the proxy
			// adds the key and goes on over TLS (the test's CA verifies).
			rb.ok("network_set", map[string]any{"sandbox": "net", "allow": []string{tlsAPI.addr()}, "inject": []map[string]any{
				{"host": "127.0.0.2", "header": "Authorization", "value": "Bearer " + secret, "tls": true},
			}})
			assert.Equal(t, "hello from api (tls true)", sh("net", "curl -sS http://"+tlsAPI.addr()+"/v1"))
			assert.Equal(t, "Bearer "+secret, tlsAPI.last().Get("Authorization"))

			// A change on the running box applies to the next request.
			set := rb.ok("network_set", map[string]any{"sandbox": "net", "allow": []string{b.addr()}})
			assert.Equal(t, "allow", set["network"].(map[string]any)["mode"])
			assert.Contains(t, sh("net", "curl -sS -i http://"+a.addr()+"/"), "403 Forbidden")
			assert.Equal(t, "hello from b (tls false)", sh("net", "curl -sS http://"+b.addr()+"/"))
			assert.Empty(t, b.last().Get("Authorization"), "the inject rules went with the old list")

			// A box with no network setting reaches nothing.
			out = sh("closed", "curl -sS -i http://"+b.addr()+"/")
			assert.Contains(t, out, "403 Forbidden")
			assert.Contains(t, out, "has no network access")
			assert.Equal(t, 1, b.count())
		})
	}
}

func reverse(s string) string {
	r := []rune(s)
	for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
		r[i], r[j] = r[j], r[i]
	}
	return string(r)
}

// TestNetworkPolicyHost checks the host side without real boxes (the fake
// backend): bad rules are refused with what to write, network: true stays
// a full network that network_set will not narrow, and an allow list
// survives a restart of the server, enforced by a new proxy.
func TestNetworkPolicyHost(t *testing.T) {
	be := newFakeBackend(t)
	dir := t.TempDir()
	s1 := newTestService(t, be, dir, nil)
	h := newSession(t, s1)

	msg := h.toolErr("sandbox_create", map[string]any{"sandbox": "x", "network": map[string]any{"allow": []string{"exa mple.org"}}})
	assert.Contains(t, msg, `allow "exa mple.org": not a host name`)
	msg = h.toolErr("sandbox_create", map[string]any{"sandbox": "x", "network": map[string]any{"inject": []map[string]any{{"host": "a.org", "header": "X", "secret": "NOPE_NOT_SET"}}}})
	assert.Contains(t, msg, "no CELLBOX_SECRET_NOPE_NOT_SET")
	msg = h.toolErr("sandbox_create", map[string]any{"sandbox": "x", "network": "yes"})
	assert.Contains(t, msg, "network")

	// The whole loopback: taken, with a notice naming a port to use.
	m := h.tool("sandbox_create", map[string]any{"sandbox": "lo", "network": map[string]any{"allow": []string{"127.0.0.1"}}})
	assert.Contains(t, m["notice"], `allow "127.0.0.1" opens every port of this machine's loopback to the box`)
	m = h.tool("network_set", map[string]any{"sandbox": "lo", "allow": []string{"127.0.0.1", "example.org"}})
	assert.Contains(t, m["notice"], "name its port (127.0.0.1:8080)")
	assert.Nil(t, h.tool("network_set", map[string]any{"sandbox": "lo", "allow": []string{"127.0.0.1:8080"}})["notice"])
	h.tool("sandbox_destroy", map[string]any{"sandbox": "lo"})

	h.tool("sandbox_create", map[string]any{"sandbox": "full", "network": true})
	msg = h.toolErr("network_set", map[string]any{"sandbox": "full", "allow": []string{"example.org"}})
	assert.Contains(t, msg, "full network (network: true)")
	l := h.tool("sandbox_list", nil)["sandboxes"].([]any)
	assert.Equal(t, "full", l[0].(map[string]any)["network"].(map[string]any)["mode"])

	srv := newRecorder(t, "srv")
	h.tool("sandbox_create", map[string]any{"sandbox": "net", "network": map[string]any{
		"allow":  []string{srv.addr()},
		"inject": []map[string]any{{"host": "127.0.0.2", "header": "Authorization", "value": "k"}},
	}})
	id := h.tool("sandbox_list", nil)["sandboxes"].([]any)[1].(map[string]any)["id"].(string)
	require.NoError(t, s1.Close())

	s2 := newTestService(t, be, dir, nil)
	h.s = s2
	nw := h.tool("sandbox_list", nil)["sandboxes"].([]any)[1].(map[string]any)["network"].(map[string]any)
	assert.Equal(t, "allow", nw["mode"])
	assert.Equal(t, []any{srv.addr()}, nw["allow"])
	assert.Equal(t, api.Redacted, nw["inject"].([]any)[0].(map[string]any)["value"])

	// Through the box's proxy socket, as the agent forwards to it.
	sock := filepath.Join(s2.hostDir(id), egress.SocketName)
	cl := &http.Client{Transport: &http.Transport{
		Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "proxy"}),
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
	resp, err := cl.Get("http://" + srv.addr() + "/")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "hello from srv (tls false)", string(body))
	assert.Equal(t, "k", srv.last().Get("Authorization"), "the rule survived the restart")

}

// TestBoxEnv: a box without a full network gets the proxy variables (its
// own env may override HTTP_PROXY and the like, not where the agent
// listens); a full-network box gets none, so its agent never listens on
// the host's network (bwrap shares it).
func TestBoxEnv(t *testing.T) {
	env := boxEnv(boxRecord{Env: map[string]string{"HTTP_PROXY": "http://mine:1", egress.EnvListen: "0.0.0.0:80"}})
	assert.Equal(t, "http://mine:1", env["HTTP_PROXY"])
	assert.Equal(t, "http://127.0.0.1:3128", env["HTTPS_PROXY"])
	assert.Equal(t, "127.0.0.1:3128", env[egress.EnvListen])

	rec := boxRecord{Network: true, Env: map[string]string{"A": "1", egress.EnvListen: "0.0.0.0:80"}}
	assert.Equal(t, map[string]string{"A": "1"}, boxEnv(rec))
	assert.Equal(t, "0.0.0.0:80", rec.Env[egress.EnvListen], "the record is not changed")
}

// TestEgressWarmBox: a box with an allow list may come from the warm pool
// (its proxy runs from the start, closed until the box is handed out), and
// its policy applies from the first request.
func TestEgressWarmBox(t *testing.T) {
	a := newRecorder(t, "a")
	rb := newRealService(t, "local", func(c *Config) { c.Pool = map[string]int{backend.DefaultImage: 1} })
	require.Eventually(t, func() bool {
		return rb.s.pools.Ready()[backend.DefaultImage] == 1
	}, time.Minute, 10*time.Millisecond)
	rb.ok("sandbox_create", map[string]any{"sandbox": "w", "network": map[string]any{"allow": []string{a.addr()}}})
	require.EqualValues(t, 1, rb.s.Metrics().WarmTaken, "the box came from the pool")
	m := rb.ok("shell", map[string]any{"sandbox": "w", "command": "curl -sS http://" + a.addr() + "/"})
	assert.Equal(t, "hello from a (tls false)", m["stdout"])
}

// TestForkBranchKeepNetwork: boxes made by fork and branch keep the
// source's network policy, allow list and inject rules (which a box's
// record holds, not its disk): they reach the allowed server with the
// injected header, and nothing else; network_set on a copy leaves the
// source alone.
func TestForkBranchKeepNetwork(t *testing.T) {
	a, b := newRecorder(t, "a"), newRecorder(t, "b")
	rb := newRealService(t, "local", func(c *Config) { c.MaxBoxesPerSession = 8 })
	rb.ok("sandbox_create", map[string]any{"sandbox": "net", "network": map[string]any{
		"allow":  []string{a.addr()},
		"inject": []map[string]any{{"host": "127.0.0.2", "header": "X-Api-Key", "value": "k3y"}},
	}})
	rb.ok("fork", map[string]any{"sandbox": "net", "count": 1, "names": []string{"netf"}})
	snap := rb.ok("snapshot", map[string]any{"sandbox": "net"})
	rb.ok("branch", map[string]any{"snapshot": snap["id"], "name": "netb"})

	curl := func(box, addr string) string {
		m := rb.ok("shell", map[string]any{"sandbox": box, "command": "curl -sS -i http://" + addr + "/ 2>&1", "timeout_ms": 60000})
		return fmt.Sprint(m["stdout"])
	}
	for _, box := range []string{"netf", "netb"} {
		info := rb.ok("sandbox_list", nil)["sandboxes"].([]any)
		var network map[string]any
		for _, s := range info {
			if s.(map[string]any)["name"] == box {
				network = s.(map[string]any)["network"].(map[string]any)
			}
		}
		require.NotNil(t, network, box)
		assert.Equal(t, "allow", network["mode"], box)
		assert.Equal(t, []any{a.addr()}, network["allow"], box)
		assert.Contains(t, curl(box, a.addr()), "hello from a", box)
		assert.Equal(t, "k3y", a.last().Get("X-Api-Key"), "%s: the inject rule came along", box)
		assert.Contains(t, curl(box, b.addr()), "403 Forbidden", box)
	}
	assert.Equal(t, 0, b.count())

	rb.ok("network_set", map[string]any{"sandbox": "netf", "allow": []string{b.addr()}})
	assert.Contains(t, curl("netf", b.addr()), "hello from b")
	assert.Contains(t, curl("net", b.addr()), "403 Forbidden", "the source's list is its own")
}
