package main

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
)

// TestRunServesPage runs a pattern and opens the page at the address the
// banner gives, with its token, as a user would: the page trades the token
// for a cookie, and the API it uses answers on the same address with that
// cookie; without the token nothing answers; preview hosts still go to the
// preview proxy.
func TestRunServesPage(t *testing.T) {
	run := startRun(t, writePattern(t, sumPattern), "--data", t.TempDir())
	m := regexp.MustCompile(`page: (http://127\.0\.0\.1:\d+)/\?token=([0-9a-f]{64}) `).FindStringSubmatch(run.out.String())
	require.NotNil(t, m, "the banner gives the page's address with its token:\n%s", run.out.String())
	base, token := m[1], m[2]

	resp, _ := testenv.HTTPGet(t, base+"/", "")
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "no page without the token, loopback or not")
	resp, _ = testenv.HTTPGet(t, base+"/v1/patterns", "")
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "nor the runtime API")

	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	browser := &http.Client{Jar: jar}
	get := func(url string) (*http.Response, string) {
		resp, err := browser.Get(url)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, string(b)
	}
	resp, body := get(base + "/?token=" + token)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, base+"/", resp.Request.URL.String(), "the token leaves the address bar")
	for _, path := range []string{"/", "/ui"} {
		resp, body = get(base + path)
		assert.Equal(t, http.StatusOK, resp.StatusCode, path)
		assert.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"), path)
		assert.Equal(t, "no-cache", resp.Header.Get("Cache-Control"), path)
		assert.Contains(t, body, "new EventSource('/v1/watch')", path)
	}
	resp, body = get(base + "/v1/patterns")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, `"name":"calc"`, "the API the page reads answers on the same address, with the page's cookie")
	resp, _ = get(base + "/?token=" + wrong(token))
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "a wrong token")

	resp, _ = testenv.HTTPGet(t, base+"/v1/tools", "")
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the tool list needs no key")
	resp, body = testenv.HTTPGet(t, base+"/", "pnothing.localhost")
	assert.NotContains(t, body, "<!doctype html>", "a preview host's / is the preview proxy's, not the page")
	assert.NotEqual(t, http.StatusOK, resp.StatusCode, "no preview of that id")
}

// TestPageGraphInChromium opens the page of a pattern without input cells
// (as examples/repl) in headless Chromium and reads the graph it drew:
// sized, every node in a place of its own, every edge drawn; the node
// table lists the nodes in the graph's order.
func TestPageGraphInChromium(t *testing.T) {
	run := startRun(t, writePattern(t, `name: noinputs
nodes:
  zero: {computed: '${1}'}
  after: {computed: '${zero + 1}'}
  also: {computed: '${zero * 2}'}
  total: {computed: '${after + also}'}
`), "--data", t.TempDir())
	m := regexp.MustCompile(`page: (\S+) `).FindStringSubmatch(run.out.String())
	require.NotNil(t, m, run.out.String())
	page := openPage(t, m[1])
	type graph struct {
		Width, Height string
		Boxes         []string // transform of each box
		Edges         []string // d of each edge
		Rows          []string // the node table's row ids
		InputsShown   bool     // the input cells' table is visible
	}
	var g graph
	poll(t, "the page to draw the graph", func() bool {
		page.eval(`(() => {
			const svg = document.querySelector('.graph svg');
			if (!svg) return {};
			return {
				width: svg.getAttribute('width'), height: svg.getAttribute('height'),
				boxes: [...svg.querySelectorAll('g.box')].map(b => b.getAttribute('transform')),
				edges: [...svg.querySelectorAll('path.edge')].map(p => p.getAttribute('d')),
				rows: [...document.querySelectorAll('tr[id^="row-"]')].map(r => r.id),
				inputsShown: [...document.querySelectorAll('.inst table')].some(t => t.offsetParent && t.querySelector('th').textContent === 'cell'),
			};
		})()`, &g)
		return len(g.Boxes) == 4
	})
	if dir := os.Getenv("CELLBOX_SCREENSHOTS"); dir != "" {
		page.screenshot(filepath.Join(dir, "graph-noinputs.png"))
	}
	all := strings.Join(append(append([]string{g.Width, g.Height}, g.Boxes...), g.Edges...), " ")
	assert.NotContains(t, all, "NaN", "%+v", g)
	assert.Len(t, g.Edges, 4, "zero->after, zero->also, after->total, also->total")
	assert.Len(t, slices.Compact(slices.Sorted(slices.Values(g.Boxes))), 4, "each node in a place of its own: %v", g.Boxes)
	assert.Equal(t, []string{"row-default/noinputs/zero", "row-default/noinputs/after", "row-default/noinputs/also", "row-default/noinputs/total"}, g.Rows,
		"the nodes are listed in the graph's order")
	assert.False(t, g.InputsShown, "no empty table of input cells")
}
