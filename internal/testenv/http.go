package testenv

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// Client is an HTTP client that resolves ID.localhost (a preview's own
// origin) to the loopback address, as browsers and curl do; Go's resolver
// does not.
var Client = &http.Client{Transport: &http.Transport{
	DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if host, port, err := net.SplitHostPort(addr); err == nil && strings.HasSuffix(host, ".localhost") {
			addr = net.JoinHostPort("127.0.0.1", port)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	},
}}

// HTTPGet fetches url, with Host header host when it is not "", and
// returns the response (its body read and closed) and the body.
func HTTPGet(t testing.TB, url, host string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	if host != "" {
		req.Host = host
	}
	resp, err := Client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read the body: %v", url, err)
	}
	return resp, string(body)
}
