package webui

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHandlerServesPage(t *testing.T) {
	srv := httptest.NewServer(Handler())
	defer srv.Close()
	for _, path := range []string{"/", "/ui"} {
		t.Run(path, func(t *testing.T) {
			resp, err := http.Get(srv.URL + path)
			require.NoError(t, err)
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			page := string(body)

			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"))
			assert.Equal(t, "no-cache", resp.Header.Get("Cache-Control"))
			assert.True(t, strings.HasPrefix(page, "<!doctype html>"), "starts as an HTML page")
			// The page is its own script, talking to the runtime API on
			// this origin.
			assert.Contains(t, page, "<script>")
			for _, use := range []string{"fetch('/v1/watch'", "'/v1/patterns'", "'/v1/cells/'", "'/v1/send/'"} {
				assert.Contains(t, page, use)
			}
			// Nothing from elsewhere: the machine may have no internet.
			external := regexp.MustCompile(`(?i)(src|href|action)\s*=\s*["']?\s*(https?:)?//|@import|url\(\s*["']?(https?:)?//`)
			assert.Empty(t, external.FindAllString(page, -1), "the page loads nothing from another origin")
			// Cell values never become markup.
			assert.NotContains(t, page, "innerHTML")
			assert.NotContains(t, page, "insertAdjacentHTML")
			// The CSP allows exactly the page's own script.
			assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "script-src '"+scriptHash(body)+"'")
			assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "connect-src 'self'")
		})
	}
}

func TestHandlerRefuses(t *testing.T) {
	srv := httptest.NewServer(Handler())
	defer srv.Close()
	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{http.MethodPost, "/", http.StatusMethodNotAllowed},
		{http.MethodGet, "/other", http.StatusNotFound},
		{http.MethodHead, "/ui", http.StatusOK},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, srv.URL+tc.path, nil)
			require.NoError(t, err)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, tc.status, resp.StatusCode)
		})
	}
}

func TestScriptHashCoversTheScript(t *testing.T) {
	// A hash of an empty or partial script would leave the page's own
	// script blocked by its CSP: the page has exactly one inline script.
	assert.Equal(t, 1, strings.Count(string(page), "<script>"))
	assert.Equal(t, 1, strings.Count(string(page), "</script>"))
	assert.NotContains(t, string(page), "<script ", "no script with attributes (src=…)")
}
