package builtins_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/builtins"
	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/runtime"
)

// fetchOut is a fetch node's output cell.
type fetchOut struct {
	Pending bool                  `json:"pending"`
	Result  *builtins.FetchResult `json:"result"`
	Error   *string               `json:"error"`
}

func (r *run) fetch(name string) fetchOut {
	r.t.Helper()
	var o fetchOut
	r.get(name, &o)
	return o
}

// loadHTTP loads a pattern with no boxes (fetch and computed nodes) on a
// fresh store (file: the store's file); the server's URL replaces SERVER
// in the YAML.
func loadHTTP(t *testing.T, srv *httptest.Server, yaml string) (r *run, file string) {
	t.Helper()
	file = filepath.Join(t.TempDir(), "cells.db")
	store, err := cells.OpenBolt(file, cells.Options{NoSync: true})
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	return (&box{}).loadOn(t, store, strings.ReplaceAll(yaml, "SERVER", srv.URL), nil), file
}

// requests records what a test server received.
type requests struct {
	mu   sync.Mutex
	list []string // "METHOD /path?query"
}

func (q *requests) add(r *http.Request) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.list = append(q.list, r.Method+" "+r.URL.RequestURI())
}

func (q *requests) count(prefix string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for _, r := range q.list {
		if strings.HasPrefix(r, prefix) {
			n++
		}
	}
	return n
}

func TestFetchRequestAndResponse(t *testing.T) {
	const token = "s3cret-t0ken-value"
	t.Setenv("FETCH_TEST_TOKEN", token)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/echo":
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("ETag", `"v1"`)
			w.Header().Set("X-Other", "dropped")
			// The secret is checked here, not echoed: the response is stored.
			fmt.Fprintf(w, `{"method": %q, "city": %q, "auth_ok": %t, "ctype": %q, "body": %s}`,
				r.Method, r.Header.Get("X-City"), r.Header.Get("Authorization") == token, r.Header.Get("Content-Type"), body)
		case "/none":
			w.WriteHeader(http.StatusNoContent)
		case "/text":
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			fmt.Fprintf(w, "hello %s", r.URL.Query().Get("who"))
		}
	}))
	t.Cleanup(srv.Close)
	r, file := loadHTTP(t, srv, `
name: http
cells:
  city: paris
  who: world
nodes:
  echo:
    fetch:
      url: SERVER/echo
      method: post
      headers: {X-City: '${city}'}
      secret_headers: {Authorization: FETCH_TEST_TOKEN}
      body: '${ {"city": city, "n": 2} }'
      format: json
  text:
    fetch: {url: 'SERVER/text?who=${who}'}
  greeting: {computed: '${text.result?.body ?? "pending"}'}
  empty:
    fetch: {url: SERVER/none, method: DELETE, format: json}
`)
	r.settle()
	echo := r.fetch("echo")
	require.Nil(t, echo.Error)
	assert.Equal(t, 200, echo.Result.Status)
	assert.Equal(t, map[string]string{"Content-Type": "application/json", "Content-Length": echo.Result.Headers["Content-Length"], "ETag": `"v1"`}, echo.Result.Headers)
	assert.Equal(t, map[string]any{
		"method": "POST", "city": "paris", "auth_ok": true, "ctype": "application/json",
		"body": map[string]any{"city": "paris", "n": float64(2)},
	}, echo.Result.Body, "method, headers, the secret header and a JSON body reach the server; the body is parsed")
	empty := r.fetch("empty")
	require.Nil(t, empty.Error)
	assert.Equal(t, 204, empty.Result.Status)
	assert.Nil(t, empty.Result.Body, "an empty answer with format json is null, not a parse error")
	var greeting string
	r.get("greeting", &greeting)
	assert.Equal(t, "hello world", greeting, "format text (the default) gives the body as a string")

	r.set("who", `"cellbox"`)
	r.settle()
	r.get("greeting", &greeting)
	assert.Equal(t, "hello cellbox", greeting, "a change of an input fetches again")

	// The secret reached the server (above) but is stored nowhere: not in
	// the store's file, cells, memo keys or node state included.
	r.close(runtime.Shutdown)
	require.NoError(t, r.store.Close())
	raw, err := os.ReadFile(file)
	require.NoError(t, err)
	assert.False(t, strings.Contains(string(raw), token), "the secret header's value is in the store's file")
}

func TestFetchErrors(t *testing.T) {
	t.Setenv("FETCH_TEST_UNSET", "")
	os.Unsetenv("FETCH_TEST_UNSET")
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/missing":
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, "no such thing: "+strings.Repeat("x", 300))
		case "/big":
			fmt.Fprint(w, strings.Repeat("y", 11))
		case "/slow":
			select {
			case <-release:
			case <-r.Context().Done():
			}
		case "/loop":
			http.Redirect(w, r, "/loop", http.StatusFound)
		case "/ftp":
			http.Redirect(w, r, "ftp://example.com/x", http.StatusFound)
		case "/notjson":
			fmt.Fprint(w, "<html>")
		}
	}))
	t.Cleanup(srv.Close)
	// A port nothing listens on: listen, note it, close.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := "http://" + l.Addr().String()
	require.NoError(t, l.Close())

	tests := []struct {
		name, fields string
		want         string
		status       int // of the result kept beside the error; 0: none
	}{
		{"non-2xx", `{url: SERVER/missing}`, `GET SERVER/missing: HTTP 404 Not Found: "no such thing: xxx`, 404},
		{"too big", `{url: SERVER/big, max_bytes: 10}`, `GET SERVER/big: response larger than 10 bytes (raise the node's max_bytes to fetch it)`, 0},
		{"timeout", `{url: SERVER/slow, timeout: 100ms}`, `GET SERVER/slow: timed out after 100ms`, 0},
		{"unreachable", `{url: ` + closed + `/x}`, `GET ` + closed + `/x: dial tcp ` + strings.TrimPrefix(closed, "http://") + `: connect: connection refused`, 0},
		{"redirect loop", `{url: SERVER/loop}`, `GET SERVER/loop: stopped after 5 redirects`, 0},
		{"redirect to another scheme", `{url: SERVER/ftp}`, `GET SERVER/ftp: redirected to a ftp: URL; only http and https are fetched`, 0},
		{"scheme", `{url: file:///etc/passwd}`, `url "file:///etc/passwd": only http and https URLs are fetched`, 0},
		{"not json", `{url: SERVER/notjson, format: json}`, `GET SERVER/notjson: the response is not JSON (format json): invalid character '<' looking for beginning of value; it starts "<html>"`, 0},
		{"secret not set", `{url: SERVER/x, secret_headers: {Authorization: FETCH_TEST_UNSET}}`, `GET SERVER/x: secret header Authorization: environment variable FETCH_TEST_UNSET is not set on the runner`, 0},
		// A method written as it is is checked when the pattern loads
		// (patterns TestFetchNodeErrors); one an expression gives, here.
		{"bad method", `{url: SERVER/x, method: '${"GET /"}'}`, `method "GET /" is not an HTTP method (e.g. GET, POST)`, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, _ := loadHTTP(t, srv, "name: errs\nnodes:\n  f:\n    fetch: "+tt.fields+"\n")
			r.settle()
			out := r.fetch("f")
			require.NotNil(t, out.Error)
			assert.False(t, out.Pending)
			assert.Contains(t, *out.Error, strings.ReplaceAll(tt.want, "SERVER", srv.URL))
			if tt.status == 0 {
				assert.Nil(t, out.Result)
			} else {
				require.NotNil(t, out.Result)
				assert.Equal(t, tt.status, out.Result.Status)
			}
		})
	}
}

// A change of an input aborts the request in flight; its response, sent
// after the next one finished, is never written.
func TestFetchAbortNoStaleWrite(t *testing.T) {
	got := &requests{}
	reachedA := make(chan struct{})
	releaseA := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(releaseA) }) })
	answeredA := make(chan struct{})
	var abortedA atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.add(r)
		q := r.URL.Query().Get("q")
		if q == "a" {
			close(reachedA)
			// Held until the second request finished; the client going
			// away meanwhile is the abort.
			select {
			case <-r.Context().Done():
				abortedA.Store(true)
				<-releaseA
			case <-releaseA:
			}
			fmt.Fprint(w, "stale answer a")
			close(answeredA)
			return
		}
		fmt.Fprint(w, "answer "+q)
	}))
	t.Cleanup(srv.Close)
	r, _ := loadHTTP(t, srv, `
name: abort
cells:
  q: a
nodes:
  f:
    fetch: {url: 'SERVER/?q=${q}', timeout: 1h}
`)
	from := r.store.Version()
	<-reachedA
	r.set("q", `"b"`)
	r.settle()
	assert.Equal(t, "answer b", r.fetch("f").Result.Body)
	waitFor(t, "the first request to be aborted", abortedA.Load)
	once.Do(func() { close(releaseA) })
	<-answeredA
	r.set("q", `"c"`) // a later change, so anything written meanwhile is before it
	r.settle()
	assert.Equal(t, "answer c", r.fetch("f").Result.Body)
	assert.Equal(t, 1, got.count("GET /?q=a"))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := r.store.Watch(ctx, r.addr("f").Prefix(), from)
	require.NoError(t, err)
	for done := false; !done; {
		select {
		case batch := <-ch:
			for _, c := range batch.Changes {
				assert.NotContains(t, string(c.Cell.Value), "stale answer a", "the aborted request's response is never written")
				done = done || strings.Contains(string(c.Cell.Value), "answer c")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no final value of f in the change log")
		}
	}
}

// A finished request is remembered: a revert and a restart send no
// request; cache: false fetches every time.
func TestFetchCache(t *testing.T) {
	got := &requests{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.add(r)
		fmt.Fprint(w, r.URL.RequestURI())
	}))
	t.Cleanup(srv.Close)
	const yaml = `
name: cache
cells:
  page: 1
nodes:
  cached:
    fetch: {url: 'SERVER/cached?page=${page}'}
  fresh:
    fetch: {url: 'SERVER/fresh?page=${page}', cache: false}
`
	r, _ := loadHTTP(t, srv, yaml)
	r.settle()
	r.set("page", "2")
	r.settle()
	r.set("page", "1")
	r.settle()
	assert.Equal(t, "/cached?page=1", r.fetch("cached").Result.Body)
	assert.Equal(t, 1, got.count("GET /cached?page=1"), "a revert is served from the cache")
	assert.Equal(t, 2, got.count("GET /fresh?page=1"), "cache: false fetches again")

	// Restart the runtime on the same store.
	r.close(runtime.Shutdown)
	r = (&box{}).loadOn(t, r.store, strings.ReplaceAll(yaml, "SERVER", srv.URL), nil)
	r.settle()
	assert.Equal(t, "/cached?page=1", r.fetch("cached").Result.Body)
	assert.Equal(t, 1, got.count("GET /cached?page=1"), "a restart sends no request the cache answers")
	assert.Equal(t, 1, got.count("GET /cached?page=2"))
}

// fetch → exec → computed, end to end: a CSV fetched from a local HTTP
// server, cleaned in a real box, summarized by a computed cell; a new
// version on the server, fetched on a change of the URL, flows through.
func TestFetchExecComputed(t *testing.T) {
	b := newBox(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/csv")
		switch r.URL.Path {
		case "/v1.csv":
			fmt.Fprint(w, csvFiles["data.csv"])
		case "/v2.csv":
			fmt.Fprint(w, "name,value\nz, 7\n\nbad,row\n")
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	store, err := cells.OpenBolt(filepath.Join(t.TempDir(), "cells.db"), cells.Options{NoSync: true})
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	r := b.loadOn(t, store, `
name: fetch-clean
cells:
  source: `+srv.URL+`/v1.csv
nodes:
  data:
    fetch: {url: '${source}', timeout: 10s}
  clean:
    exec:
      command: python3 /workspace/clean.py
      files:
        /workspace/in.csv: ${data.result.body}
        /workspace/clean.py: {file: clean.py}
        /workspace/out.csv: text
        /workspace/stats.json: json
  summary:
    computed: '${clean.result?.files["/workspace/stats.json"]?.rows ?? "?"} rows, ${clean.result?.files["/workspace/stats.json"]?.dropped ?? "?"} dropped'
`, csvFiles)
	r.settle()
	data := r.fetch("data")
	require.Nil(t, data.Error)
	assert.Equal(t, "text/csv", data.Result.Headers["Content-Type"])
	clean := r.exec("clean")
	require.Nil(t, clean.Error)
	assert.Equal(t, "name,value\na,5\nb,20\nc,15\ne,30\n", clean.Result.Files["/workspace/out.csv"], "the fetched CSV was cleaned in the box")
	var summary string
	r.get("summary", &summary)
	assert.Equal(t, "4 rows, 1 dropped", summary)

	r.set("source", `"`+srv.URL+`/v2.csv"`)
	r.settle()
	r.get("summary", &summary)
	assert.Equal(t, "1 rows, 1 dropped", summary)
	assert.Equal(t, "name,value\nz,7\n", r.exec("clean").Result.Files["/workspace/out.csv"])

	// A URL the server does not have: the fetch fails with the status, and
	// the exec downstream reports its input's failure instead of running.
	r.set("source", `"`+srv.URL+`/v3.csv"`)
	r.settle()
	require.NotNil(t, r.fetch("data").Error)
	assert.Contains(t, *r.fetch("data").Error, "HTTP 404 Not Found")
	clean = r.exec("clean")
	require.NotNil(t, clean.Error)
	assert.Contains(t, *clean.Error, "upstream data failed: GET "+srv.URL+"/v3.csv: HTTP 404 Not Found")
	assert.Len(t, b.client.boxesCreated(), 2, "no box for a failed fetch")
	assert.Empty(t, b.list(t))
}
