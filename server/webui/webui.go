// Package webui serves the web page of the live graph: one self-contained
// HTML page (no external scripts, styles or fonts) that draws each loaded
// pattern instance's graph, lists its input cells (editable) and its nodes,
// and follows them live. Everything it shows comes from the runtime API
// (server/runapi) on the same origin: GET /v1/patterns, GET /v1/watch
// (both with max_string: large values come cut, and a cut one is never
// written back), GET and PUT /v1/cells/{addr}, POST /v1/send/{node}.{stream}.
// `cellbox serve` and `cellbox run` mount it at / and /ui.
package webui

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"net/http"
	"strconv"
)

//go:embed index.html
var page []byte

// Owns reports whether path is the page's: / or /ui.
func Owns(path string) bool { return path == "/" || path == "/ui" }

// csp allows the page's own inline script (by its hash) and style, and
// requests to its own origin only: a value that slipped into the page as
// markup could still not run script or load anything from elsewhere.
var csp = "default-src 'none'; script-src '" + scriptHash(page) + "'; style-src 'unsafe-inline'; " +
	"connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// scriptHash is the CSP source of the page's one inline script.
func scriptHash(html []byte) string {
	_, rest, _ := bytes.Cut(html, []byte("<script>"))
	body, _, _ := bytes.Cut(rest, []byte("</script>"))
	sum := sha256.Sum256(body)
	return "sha256-" + base64.StdEncoding.EncodeToString(sum[:])
}

// Handler serves the page at GET (and HEAD) / and /ui.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !Owns(r.URL.Path) {
			http.NotFound(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed: the page is GET only", http.StatusMethodNotAllowed)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "text/html; charset=utf-8")
		h.Set("Content-Length", strconv.Itoa(len(page)))
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Content-Security-Policy", csp)
		if r.Method == http.MethodHead {
			return
		}
		w.Write(page)
	})
}
