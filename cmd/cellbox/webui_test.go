package main

import (
	"net/http"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
)

// TestRunServesPage runs a pattern and opens the page at the address the
// banner gives, as a user would; the API it uses answers on the same
// address, and preview hosts still go to the preview proxy.
func TestRunServesPage(t *testing.T) {
	run := startRun(t, writePattern(t, sumPattern), "--data", t.TempDir())
	m := regexp.MustCompile(`page: (http://127\.0\.0\.1:\d+)/ `).FindStringSubmatch(run.out.String())
	require.NotNil(t, m, "the banner gives the page's address:\n%s", run.out.String())
	base := m[1]

	for _, path := range []string{"/", "/ui"} {
		resp, body := testenv.HTTPGet(t, base+path, "")
		assert.Equal(t, http.StatusOK, resp.StatusCode, path)
		assert.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"), path)
		assert.Equal(t, "no-cache", resp.Header.Get("Cache-Control"), path)
		assert.Contains(t, body, "new EventSource('/v1/watch')", path)
	}
	resp, body := testenv.HTTPGet(t, base+"/v1/patterns", "")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, `"name":"calc"`, "the API the page reads answers on the same address")
	resp, _ = testenv.HTTPGet(t, base+"/v1/tools", "")
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the tool API still answers")
	resp, body = testenv.HTTPGet(t, base+"/", "pnothing.localhost")
	assert.NotContains(t, body, "<!doctype html>", "a preview host's / is the preview proxy's, not the page")
	assert.NotEqual(t, http.StatusOK, resp.StatusCode, "no preview of that id")
}
