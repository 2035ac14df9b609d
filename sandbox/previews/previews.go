// Package previews is the addressing of preview URLs and the table of
// their ids. A preview id is an unguessable random id that maps to a box
// and a port; the HTTP proxy (sandbox/httpapi) tunnels each connection
// through the box's agent, so it works although the box has no network.
//
// A preview is served on an origin of its own, http://ID.localhost:PORT/
// (browsers and curl resolve *.localhost to the loopback address), never
// on the API's: a page a box serves must not be able to call the APIs with
// the browser's blessing (same origin). IDFromHost is how the server's
// guard and the proxy tell a preview's origin from the API's.
//
// The sandbox service makes ids (the browse tool), keeps them with their
// box's record and drops them when the box goes; this package knows a box
// only by its id.
package previews

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strings"
	"sync"
)

// Target is where a preview id leads: a box (by id) and a TCP port in it.
type Target struct {
	Box  string
	Port int
}

// NewID returns a new preview id: "p" and 32 hex digits of crypto/rand.
func NewID() string {
	b := make([]byte, 16)
	rand.Read(b) // never fails (crypto/rand panics on failure)
	return "p" + hex.EncodeToString(b)
}

// idRE leaves the length (33) to IsID: a counted repetition compiles to a
// larger program at every start.
var idRE = regexp.MustCompile(`^p[0-9a-f]+$`)

// IsID reports whether id has the form of a preview id.
func IsID(id string) bool { return len(id) == 33 && idRE.MatchString(id) }

// URL is the address of path in preview id of the server at base:
// http://ID.localhost:PORT/PATH, whatever host base names (a remote user
// reaches it through a tunnel of PORT, as *.localhost resolves locally).
func URL(base, id, path string) (string, error) {
	u, err := url.Parse(base)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("base URL %q of this server is not a URL: previews need one (see Service.SetBaseURL)", base)
	}
	port := u.Port()
	if port == "" {
		port = "80"
	}
	return fmt.Sprintf("http://%s.localhost:%s%s", id, port, path), nil
}

// IDFromHost returns the preview id of a Host header ID.localhost[:port]:
// the origin of a preview, which must never reach the APIs.
func IDFromHost(host string) (string, bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	id, rest, ok := strings.Cut(strings.ToLower(host), ".")
	if !ok || rest != "localhost" || !IsID(id) {
		return "", false
	}
	return id, true
}

// Table maps preview ids to their targets; it is safe for concurrent use.
type Table struct {
	mu  sync.Mutex
	ids map[string]Target
}

// NewTable returns an empty table.
func NewTable() *Table { return &Table{ids: map[string]Target{}} }

// Add makes id lead to t.
func (tb *Table) Add(id string, t Target) {
	tb.mu.Lock()
	tb.ids[id] = t
	tb.mu.Unlock()
}

// Get returns where id leads.
func (tb *Table) Get(id string) (Target, bool) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	t, ok := tb.ids[id]
	return t, ok
}

// Drop forgets ids.
func (tb *Table) Drop(ids ...string) {
	tb.mu.Lock()
	for _, id := range ids {
		delete(tb.ids, id)
	}
	tb.mu.Unlock()
}
