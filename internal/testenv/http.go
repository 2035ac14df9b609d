package testenv

import (
	"io"
	"net/http"
	"testing"
)

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
	resp, err := http.DefaultClient.Do(req)
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
