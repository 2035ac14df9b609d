package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/chromiumtest"
	"github.com/cellbox/cellbox/internal/testenv"
)

// TestRunServesPage runs a pattern and opens the page at the address the
// banner gives, as a user would: the page needs no key (it holds no data),
// the key rides in the address's fragment, which the browser never sends,
// and the API the page uses answers on the same address with the key as
// Authorization only. The old ?token= address redirects to the fragment;
// no cookie is set (a cookie goes to every port of the host). Preview
// hosts still go to the preview proxy.
func TestRunServesPage(t *testing.T) {
	run := startRun(t, writePattern(t, sumPattern), "--data", t.TempDir())
	m := regexp.MustCompile(`page: (http://127\.0\.0\.1:\d+)/#token=([0-9a-f]{64}) `).FindStringSubmatch(run.out.String())
	require.NotNil(t, m, "the banner gives the page's address with its token in the fragment:\n%s", run.out.String())
	base, token := m[1], m[2]

	for _, path := range []string{"/", "/ui"} {
		resp, body := testenv.HTTPGet(t, base+path, "")
		assert.Equal(t, http.StatusOK, resp.StatusCode, path)
		assert.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"), path)
		assert.Equal(t, "no-cache", resp.Header.Get("Cache-Control"), path)
		assert.Contains(t, body, "fetch('/v1/watch'", path)
		assert.NotContains(t, body, token, "the page holds no key")
	}
	resp, _ := testenv.HTTPGet(t, base+"/v1/patterns", "")
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "the runtime API needs the key")

	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.Get(base + "/?token=" + token)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusSeeOther, resp.StatusCode)
	assert.Equal(t, "/#token="+token, resp.Header.Get("Location"), "the old address moves the key to the fragment")
	assert.Empty(t, resp.Cookies(), "no cookie carries the key")
	resp, err = noFollow.Get(base + "/?token=" + wrong(token))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "a wrong token")

	req, _ := http.NewRequest(http.MethodGet, base+"/v1/patterns", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, string(body), `"name":"calc"`, "the API the page reads answers on the same address")

	resp, _ = testenv.HTTPGet(t, base+"/v1/tools", "")
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the tool list needs no key")
	resp, body2 := testenv.HTTPGet(t, base+"/", "pnothing.localhost")
	assert.NotContains(t, body2, "<!doctype html>", "a preview host's / is the preview proxy's, not the page")
	assert.NotEqual(t, http.StatusOK, resp.StatusCode, "no preview of that id")
}

// TestPageKeyStaysOnItsOrigin opens the page in Chromium at the banner's
// address, waits until it shows the pattern (its API calls carry the
// key), then opens a page of another server on another port of the same
// host, as a user opening a dev server would: that server receives no
// trace of the key. It used to receive it as a cookie, which browsers send
// to every port of a host.
func TestPageKeyStaysOnItsOrigin(t *testing.T) {
	run := startRun(t, writePattern(t, sumPattern), "--data", t.TempDir())
	m := regexp.MustCompile(`page: ((http://127\.0\.0\.1:\d+)/\S*token=([0-9a-f]{64})) `).FindStringSubmatch(run.out.String())
	require.NotNil(t, m, run.out.String())
	base, token := m[2], m[3]
	seen := make(chan string, 16)
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var dump strings.Builder
		r.Write(&dump)
		seen <- dump.String()
		io.WriteString(w, "<!doctype html><title>dev server</title>")
	}))
	defer other.Close()

	page := chromiumtest.Open(t, m[1])
	var shown bool
	poll(t, "the page to show the pattern", func() bool {
		page.Eval(`document.querySelectorAll('tr[id^="row-"]').length > 0 && !location.hash`, &shown)
		return shown
	})
	// The live stream, read with fetch and the key as Authorization,
	// brings a change made elsewhere.
	req, _ := http.NewRequest(http.MethodPut, base+"/v1/cells/default/calc/a", strings.NewReader("40"))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	poll(t, "the page to show the new value of double (84)", func() bool {
		page.Eval(`document.getElementById('conn').className === 'live' && document.body.textContent.includes('84')`, &shown)
		return shown
	})
	for _, host := range []string{strings.TrimPrefix(other.URL, "http://"), "localhost:" + strings.TrimPrefix(other.URL, "http://127.0.0.1:")} {
		page.Call(page.Session, "Page.navigate", map[string]any{"url": "http://" + host + "/dev-server-page"}, nil)
	wait:
		for {
			select {
			case req := <-seen:
				assert.NotContains(t, req, token, "the other server got the key")
				if strings.Contains(req, "/dev-server-page") {
					break wait
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("the browser did not open %s", host)
			}
		}
	}
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
	page := chromiumtest.Open(t, m[1])
	type graph struct {
		Width, Height string
		Boxes         []string // transform of each box
		Edges         []string // d of each edge
		Rows          []string // the node table's row ids
		InputsShown   bool     // the input cells' table is visible
	}
	var g graph
	poll(t, "the page to draw the graph", func() bool {
		page.Eval(`(() => {
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
		page.Screenshot(filepath.Join(dir, "graph-noinputs.png"))
	}
	all := strings.Join(append(append([]string{g.Width, g.Height}, g.Boxes...), g.Edges...), " ")
	assert.NotContains(t, all, "NaN", "%+v", g)
	assert.Len(t, g.Edges, 4, "zero->after, zero->also, after->total, also->total")
	assert.Len(t, slices.Compact(slices.Sorted(slices.Values(g.Boxes))), 4, "each node in a place of its own: %v", g.Boxes)
	assert.Equal(t, []string{"row-default/noinputs/zero", "row-default/noinputs/after", "row-default/noinputs/also", "row-default/noinputs/total"}, g.Rows,
		"the nodes are listed in the graph's order")
	assert.False(t, g.InputsShown, "no empty table of input cells")
}
