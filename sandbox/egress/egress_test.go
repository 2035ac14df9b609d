package egress

import (
	"bufio"
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/api"
)

func TestCompile(t *testing.T) {
	for _, tc := range []struct {
		allow []string
		err   string
	}{
		{allow: []string{"example.org", "*.pypi.internal", "10.1.2.0/24", "127.0.0.1:8080", "[::1]:80", "10.0.0.0/8:443", "example.org:443", "*"}},
		{allow: []string{""}, err: `allow "": empty`},
		{allow: []string{"exa mple.org"}, err: "not a host name"},
		{allow: []string{"foo.*.org"}, err: "not a host name"},
		{allow: []string{"example.org:0"}, err: "is not 1-65535"},
		{allow: []string{"10.0.0.0/33"}, err: "not a CIDR"},
		{allow: []string{"10.0.0.0/8:x"}, err: "is not 1-65535"},
		{allow: make([]string, api.MaxAllow+1), err: "at most 256"},
		// A URL or a bare wildcard is a mistake to name, not to guess at
		// (before: `port "//example.org/" is not 1-65535`, and "*." meant "*").
		{allow: []string{"http://example.org/"}, err: `allow "http://example.org/": a URL; give its host: "example.org"`},
		{allow: []string{"https://api.example.org:8443/v1"}, err: `a URL; give its host: "api.example.org:8443"`},
		{allow: []string{"*."}, err: `allow "*.": a wildcard needs a domain (*.example.org), or * for any name`},
		// A DNS label has 1-63 characters.
		{allow: []string{strings.Repeat("a", 63) + ".org"}},
		{allow: []string{strings.Repeat("a", 64) + ".org"}, err: "not a host name"},
	} {
		_, err := Compile(tc.allow, nil)
		if tc.err == "" {
			assert.NoError(t, err, tc.allow)
		} else {
			assert.ErrorContains(t, err, tc.err, tc.allow)
		}
	}
	t.Setenv(api.SecretEnvPrefix+"TOKEN", "s3cret")
	p, err := Compile(nil, []api.Inject{{Host: "a.org", Header: "X", Secret: "TOKEN"}, {Host: "b.org", Header: "X", Secret: "MISSING"}})
	require.NoError(t, err)
	assert.ErrorContains(t, p.MissingSecrets(), `secret "MISSING": the server has no CELLBOX_SECRET_MISSING`)
	assert.NotContains(t, p.MissingSecrets().Error(), "TOKEN")
	for _, tc := range []struct {
		h   api.Inject
		err string
	}{
		{h: api.Inject{Host: "api.example.org", Header: "Authorization", Value: "Bearer x"}},
		{h: api.Inject{Host: "*.example.org", Header: "X-Api-Key", Secret: "TOKEN"}},
		{h: api.Inject{Host: "api.example.org", Header: "Bad Header", Value: "x"}, err: "want an HTTP header name"},
		// Headers net/http writes itself: a rule naming one was taken,
		// shown, and never sent.
		{h: api.Inject{Host: "api.example.org", Header: "Host", Value: "x"}, err: "which the proxy sets itself"},
		{h: api.Inject{Host: "api.example.org", Header: "content-length", Value: "1"}, err: "which the proxy sets itself"},
		{h: api.Inject{Host: "api.example.org", Header: "Transfer-Encoding", Value: "chunked"}, err: "which the proxy sets itself"},
		{h: api.Inject{Host: "api.example.org", Header: "Connection", Value: "x"}, err: "which the proxy sets itself"},
		{h: api.Inject{Host: "api.example.org", Header: "X", Value: "a\r\nEvil: 1"}, err: "line break"},
		{h: api.Inject{Host: "api.example.org", Header: "X"}, err: "exactly one of value and secret"},
		{h: api.Inject{Host: "api.example.org", Header: "X", Value: "v", Secret: "TOKEN"}, err: "exactly one of value and secret"},
		{h: api.Inject{Host: "", Header: "X", Value: "v"}, err: "host"},
		{h: api.Inject{Host: "a.org", Header: "X", Value: strings.Repeat("v", api.MaxInjectValue+1)}, err: "at most 8192"},
		{h: api.Inject{Host: "a.org", Header: "X", Secret: strings.Repeat("S", 64)}},
		{h: api.Inject{Host: "a.org", Header: "X", Secret: strings.Repeat("S", 65)}, err: "want 1-64 letters"},
	} {
		_, err := Compile(nil, []api.Inject{tc.h})
		if tc.err == "" {
			assert.NoError(t, err, tc.h.Header)
		} else {
			assert.ErrorContains(t, err, tc.err)
		}
	}
}

// fakeResolver answers names from a table (tests reach loopback only).
type fakeResolver map[string][]string

func (f fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	as, ok := f[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	var out []netip.Addr
	for _, a := range as {
		out = append(out, netip.MustParseAddr(a))
	}
	return out, nil
}

// startProxy serves a proxy for policy on a unix socket placed as Listen
// places it, and returns an HTTP client that goes through it.
func startProxy(t *testing.T, pol *atomic.Pointer[Policy], res Resolver, roots ...*x509.CertPool) (*http.Client, string) {
	t.Helper()
	staging, hostDir := t.TempDir(), t.TempDir()
	// What a hostile box may have left at the socket's name: a symlink.
	require.NoError(t, os.Symlink("/etc/passwd", filepath.Join(hostDir, SocketName)))
	ln, err := Listen(staging, hostDir)
	require.NoError(t, err)
	p := New(Options{Box: "test", Policy: pol.Load, Resolver: res})
	if len(roots) > 0 {
		p = New(Options{Box: "test", Policy: pol.Load, Resolver: res, RootCAs: roots[0]})
	}
	go p.Serve(ln)
	t.Cleanup(func() { p.Close() })
	sock := filepath.Join(hostDir, SocketName)
	fi, err := os.Lstat(sock)
	require.NoError(t, err)
	require.Equal(t, os.ModeSocket, fi.Mode().Type(), "the symlink was replaced, not followed")
	tr := &http.Transport{
		Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "proxy"}),
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
		DisableKeepAlives: true,
	}
	return &http.Client{Transport: tr}, sock
}

func TestProxy(t *testing.T) {
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Header.Clone())
		fmt.Fprintf(w, "hello %s", r.Host)
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	res := fakeResolver{"api.test": {"127.0.0.1"}, "rebind.test": {"127.0.0.1"}, "other.test": {"127.0.0.1"}}
	var pol atomic.Pointer[Policy]
	cl, sock := startProxy(t, &pol, res)
	get := func(u string) (int, string) {
		t.Helper()
		resp, err := cl.Get(u)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	target := "http://127.0.0.1:" + port + "/"

	code, body := get(target)
	assert.Equal(t, http.StatusForbidden, code, "nil policy: closed")
	assert.Contains(t, body, "has no network access")

	set := func(allow []string, h ...api.Inject) {
		p, err := Compile(allow, h)
		require.NoError(t, err)
		pol.Store(p)
	}
	set([]string{"127.0.0.1:" + port, "api.test"}, api.Inject{Host: "127.0.0.1", Header: "Authorization", Value: "Bearer s3cret"})
	code, body = get(target)
	assert.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, "Bearer s3cret", got.Load().(http.Header).Get("Authorization"), "header injected")

	code, body = get("http://127.0.0.1:1/")
	assert.Equal(t, http.StatusForbidden, code, "same IP, other port")
	assert.Contains(t, body, `add "127.0.0.1:1"`, "loopback: the hint names the port")
	assert.NotContains(t, body, `add "127.0.0.1"`, "never the whole loopback address: that opens cellbox's API too")

	// A name allowed that resolves to loopback is refused: the rebinding
	// guard. Allowing the address too admits it.
	set([]string{"rebind.test", "api.test:" + port})
	code, body = get("http://rebind.test:" + port + "/")
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "resolves to 127.0.0.1, a loopback, private or link-local address")
	code, body = get("http://other.test:" + port + "/")
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, `no rule of box "test" allows this name`)
	set([]string{"*.test", "127.0.0.1:" + port})
	code, body = get("http://rebind.test:" + port + "/")
	assert.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, "hello rebind.test:"+port, body, "Host is the URL's")
	assert.Empty(t, got.Load().(http.Header).Get("Authorization"), "no header without a rule")

	// A range never opens the host itself (cellbox's API listens on its
	// loopback) or link-local addresses: "0.0.0.0/0", the usual "any IPv4
	// address", opened 127.0.0.1 and with it the server's API; only the
	// very address admits one.
	for _, wide := range [][]string{{"0.0.0.0/0", "::/0", "*.test"}, {"127.0.0.0/8"}, {"127.0.0.0/8:" + port}} {
		set(wide)
		for _, u := range []string{target, "http://[::ffff:127.0.0.1]:" + port + "/", "http://rebind.test:" + port + "/", "http://0.0.0.0:" + port + "/"} {
			code, body = get(u)
			assert.Equal(t, http.StatusForbidden, code, "%v: %s: %s", wide, u, body)
		}
	}
	for _, bad := range []string{"0.0.0.0", "0.0.0.0:" + port, "[::]:80"} {
		_, err := Compile([]string{bad}, nil)
		assert.ErrorContains(t, err, "the unspecified address reaches every address of the host", bad)
	}
	wide, err := Compile([]string{"0.0.0.0/0"}, nil)
	require.NoError(t, err)
	for _, a := range []string{"127.0.0.1", "169.254.169.254", "0.0.0.0"} {
		assert.False(t, wide.addrAllowed(netip.MustParseAddr(a), 80), a)
	}
	for _, a := range []string{"10.1.2.3", "192.168.1.1", "93.184.216.34"} {
		assert.True(t, wide.addrAllowed(netip.MustParseAddr(a), 80), "a range still opens the networks it names: %s", a)
	}
	set([]string{"*.test", "127.0.0.1:" + port})

	// CONNECT: allowed tunnels, others refused before any byte moves.
	connect := func(dest string) string {
		c, err := net.Dial("unix", sock)
		require.NoError(t, err)
		defer c.Close()
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", dest, dest)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		if resp.StatusCode != http.StatusOK {
			return resp.Status
		}
		fmt.Fprintf(c, "GET /x HTTP/1.1\r\nHost: tunnel\r\nConnection: close\r\n\r\n")
		resp, err = http.ReadResponse(br, nil)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	assert.Equal(t, "hello tunnel", connect("127.0.0.1:"+port))
	set([]string{"api.test:443"})
	assert.Equal(t, "403 Forbidden", connect("127.0.0.1:"+port))
	assert.Equal(t, "403 Forbidden", connect("api.test:"+port))

	// Origin-form requests (not a proxy request) are refused.
	c, err := net.Dial("unix", sock)
	require.NoError(t, err)
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: 127.0.0.1:%s\r\n\r\n", port)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	c.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
}

func TestSecretHeader(t *testing.T) {
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Header.Get("X-Api-Key"))
	}))
	defer srv.Close()
	t.Setenv(api.SecretEnvPrefix+"API", "from-env")
	p, err := Compile([]string{"127.0.0.1"}, []api.Inject{{Host: "127.0.0.1", Header: "X-Api-Key", Secret: "API"}})
	require.NoError(t, err)
	var pol atomic.Pointer[Policy]
	pol.Store(p)
	cl, _ := startProxy(t, &pol, nil)
	req, _ := http.NewRequest("GET", srv.URL, nil)
	req.Header.Set("X-Api-Key", "box-chosen")
	resp, err := cl.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, "from-env", got.Load(), "the rule's value replaces the box's")

	os.Unsetenv(api.SecretEnvPrefix + "API")
	resp, err = cl.Get(srv.URL)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
	assert.True(t, strings.Contains(string(b), "CELLBOX_SECRET_API"), string(b))
}

// TestTLSUpgrade: an inject rule with TLS takes the box's http:// request to the
// https upstream with the header, so an HTTPS API gets its key.
func TestTLSUpgrade(t *testing.T) {
	var got atomic.Value
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Header.Get("Authorization"))
		fmt.Fprint(w, "tls ", r.TLS != nil)
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	roots := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	var pol atomic.Pointer[Policy]
	p, err := Compile([]string{"127.0.0.1:" + port}, []api.Inject{{Host: "127.0.0.1", Header: "Authorization", Value: "Bearer k", TLS: true}})
	require.NoError(t, err)
	pol.Store(p)
	cl, _ := startProxy(t, &pol, nil, roots)
	resp, err := cl.Get("http://127.0.0.1:" + port + "/v1")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "tls true", string(b))
	assert.Equal(t, "Bearer k", got.Load())

	// Without the test's CA the upstream's certificate is refused.
	cl, _ = startProxy(t, &pol, nil)
	resp, err = cl.Get("http://127.0.0.1:" + port + "/v1")
	require.NoError(t, err)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
	assert.Contains(t, string(b), "certificate")
}

// TestMaxConns: a box holds at most MaxConns connections to its proxy; the
// next waits until one ends, so a box cannot pile up descriptors on the
// host. A tunnel's half-close still reaches the box.
func TestMaxConns(t *testing.T) {
	up, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer up.Close()
	go func() {
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			go func() { io.WriteString(c, "bye"); c.Close() }()
		}
	}()
	pol, err := Compile([]string{up.Addr().String()}, nil)
	require.NoError(t, err)
	staging, hostDir := t.TempDir(), t.TempDir()
	ln, err := Listen(staging, hostDir)
	require.NoError(t, err)
	p := New(Options{Box: "test", Policy: func() *Policy { return pol }, MaxConns: 1})
	go p.Serve(ln)
	defer p.Close()
	sock := filepath.Join(hostDir, SocketName)

	tunnel := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("unix", sock)
		require.NoError(t, err)
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: x\r\n\r\n", up.Addr())
		return c, bufio.NewReader(c)
	}
	first, br := tunnel()
	first.SetReadDeadline(time.Now().Add(time.Minute)) // a lost EOF fails, not hangs
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	rest, err := io.ReadAll(br)
	require.NoError(t, err)
	assert.Equal(t, "bye", string(rest), "the upstream's close reaches the box as EOF")

	second, br2 := tunnel()
	defer second.Close()
	answered := make(chan int, 1)
	go func() {
		resp, err := http.ReadResponse(br2, nil)
		if err == nil {
			answered <- resp.StatusCode
		}
		close(answered)
	}()
	select {
	case <-answered:
		t.Fatal("a second connection was served while the first held the only slot")
	case <-time.After(200 * time.Millisecond):
	}
	first.Close()
	assert.Equal(t, http.StatusOK, <-answered, "served once the first ended")
}

func TestInternal(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1": true, "127.9.9.9": true, "::1": true, "10.1.2.3": true, "172.16.0.1": true,
		"192.168.1.1": true, "169.254.169.254": true, "100.64.0.1": true, "0.0.0.0": true, "0.1.2.3": true,
		"fd00::1": true, "fe80::1": true, "224.0.0.1": true, "::ffff:127.0.0.1": true, "::": true,
		"93.184.215.14": false, "2606:4700::1": false, "8.8.8.8": false,
	} {
		assert.Equal(t, want, internal(netip.MustParseAddr(addr)), addr)
	}
}

// A refusal of localhost proposes entries that work as written: the name,
// and its loopback address with the port (the name alone was refused again
// once it resolved to 127.0.0.1).
func TestLocalhostHint(t *testing.T) {
	for _, host := range []string{"localhost", "app.localhost"} {
		es := allowEntries(host, 19002)
		assert.Equal(t, []string{host, "127.0.0.1:19002"}, es)
		pol, err := Compile(es, nil)
		require.NoError(t, err)
		assert.True(t, pol.nameAllowed(host, 19002))
		assert.True(t, pol.addrAllowed(netip.MustParseAddr("127.0.0.1"), 19002))
		assert.False(t, pol.addrAllowed(netip.MustParseAddr("127.0.0.1"), 7077), "only that port of loopback")
		h := addHint(host, 19002)
		assert.Contains(t, h, strconv.Quote(host))
		assert.Contains(t, h, strconv.Quote("127.0.0.1:19002"))
	}
	assert.Equal(t, []string{"example.org"}, allowEntries("example.org", 443))
}

// TestAllowEntryHint: the entry a refusal proposes is one Compile accepts,
// admits the refused destination, and for a loopback, private or
// link-local address admits only that port (allowing all of 127.0.0.1
// would open cellbox's own API to the box).
func TestAllowEntryHint(t *testing.T) {
	for _, tc := range []struct {
		host, want string
		port       int
		narrow     string // the host:port also offered
	}{
		{"127.0.0.1", "127.0.0.1:7306", 7306, ""},
		{"::1", "[::1]:80", 80, ""},
		{"::ffff:127.0.0.1", "127.0.0.1:8080", 8080, ""},
		{"10.1.2.3", "10.1.2.3:5432", 5432, ""},
		{"169.254.169.254", "169.254.169.254:80", 80, ""},
		{"fe80::1%eth0", "[fe80::1]:22", 22, ""},
		{"8.8.8.8", "8.8.8.8", 53, "8.8.8.8:53"},
		{"2001:4860:4860::8888", "2001:4860:4860::8888", 443, "[2001:4860:4860::8888]:443"},
		{"example.org", "example.org", 443, "example.org:443"},
	} {
		t.Run(tc.host, func(t *testing.T) {
			e := allowEntry(tc.host, tc.port)
			require.Equal(t, tc.want, e)
			pol, err := Compile([]string{e}, nil)
			require.NoError(t, err, "the hint is a valid allow entry")
			if addr, err := netip.ParseAddr(tc.host); err == nil {
				addr = addr.WithZone("")
				assert.True(t, pol.addrAllowed(addr, tc.port), "the hint admits the refused destination")
				assert.Equal(t, !internal(addr), pol.addrAllowed(addr, tc.port+1), "an internal address is proposed with its port only")
			} else {
				assert.True(t, pol.nameAllowed(tc.host, tc.port))
			}
			h := addHint(tc.host, tc.port)
			assert.Contains(t, h, strconv.Quote(e))
			if tc.narrow != "" {
				// A name or public address: the narrower host:port is offered too, and compiles.
				assert.Contains(t, h, strconv.Quote(tc.narrow))
				_, err := Compile([]string{tc.narrow}, nil)
				require.NoError(t, err)
			}
		})
	}
}

// An allow list that opens every port of the host's loopback is taken
// (its author may mean it) and warned about, naming a port to use instead.
func TestWarnings(t *testing.T) {
	for _, tc := range []struct {
		allow []string
		warn  string
	}{
		{[]string{"127.0.0.1"}, `allow "127.0.0.1" opens every port of this machine's loopback to the box`},
		{[]string{"::1"}, `name its port ([::1]:8080)`},
		{[]string{"127.0.0.1:8080", "example.org", "10.0.0.0/8", "*"}, ""},
	} {
		p, err := Compile(tc.allow, nil)
		require.NoError(t, err, tc.allow)
		if tc.warn == "" {
			assert.Empty(t, p.Warnings(), tc.allow)
			continue
		}
		require.Len(t, p.Warnings(), 1, tc.allow)
		assert.Contains(t, p.Warnings()[0], tc.warn)
	}
}
