package runapi_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/patterns"
	"github.com/cellbox/cellbox/runtime"
	"github.com/cellbox/cellbox/server/runapi"
)

const tinyYAML = `name: tiny
cells:
  a: 1
  b:
    value: 2
    schema: {type: integer, minimum: 0}
  cfg:
    value: {port: 80}
    schema:
      type: object
      properties:
        port: {type: integer}
nodes:
  total: {computed: '${a + b}'}
  double: {computed: '${total * 2}'}
`

type fixture struct {
	store cells.Store
	rt    *runtime.Runtime
	api   *runapi.Server
	url   string
	c     *runapi.Client
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	store := cells.NewMemory(cells.Options{})
	rt := runtime.New(store, runtime.Options{})
	api := runapi.New(runapi.Config{Runtime: rt, Store: store, Logger: slog.New(slog.DiscardHandler)})
	ts := httptest.NewServer(api)
	t.Cleanup(func() {
		api.Shutdown()
		ts.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rt.Close(ctx)
		store.Close()
	})
	return &fixture{store: store, rt: rt, api: api, url: ts.URL, c: runapi.NewClient(ts.URL)}
}

// do sends a raw request and decodes the JSON answer.
func (f *fixture) do(t *testing.T, method, path, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, f.url+path, strings.NewReader(body))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"), "%s %s answers JSON", method, path)
	var out map[string]any
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		var v any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&v))
		out, _ = v.(map[string]any)
	}
	return resp.StatusCode, out
}

func (f *fixture) loadTiny(t *testing.T) runapi.Instance {
	t.Helper()
	status, _ := f.do(t, "POST", "/v1/patterns", tinyYAML)
	require.Equal(t, http.StatusCreated, status)
	ins, err := f.c.Patterns(context.Background())
	require.NoError(t, err)
	require.Len(t, ins, 1)
	return ins[0]
}

func (f *fixture) value(t *testing.T, addr string) string {
	t.Helper()
	c, err := f.c.Get(context.Background(), addr)
	require.NoError(t, err)
	return string(c.Value)
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "pattern.yaml"), []byte(tinyYAML), 0o644))
	for _, tc := range []struct {
		name, body, instance string
	}{
		{"yaml body", tinyYAML, "tiny"},
		{"yaml field", mustJSON(map[string]string{"yaml": tinyYAML}), "tiny"},
		{"folder path", mustJSON(map[string]string{"path": dir}), "tiny"},
		{"file path, renamed", mustJSON(map[string]string{"path": filepath.Join(dir, "pattern.yaml"), "name": "other", "space": "s"}), "other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			resp, err := http.Post(f.url+"/v1/patterns", "application/json", strings.NewReader(tc.body))
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			var in runapi.Instance
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&in))
			assert.Equal(t, tc.instance, in.Name)
			cellsByName := map[string]string{}
			for _, c := range in.Cells {
				cellsByName[c.Address[strings.LastIndex(c.Address, "/")+1:]] = string(c.Value)
			}
			assert.Equal(t, map[string]string{"a": "1", "b": "2", "cfg": `{"port":80}`, "total": "3", "double": "6"}, cellsByName)
			require.Len(t, in.Nodes, 2)
			for _, n := range in.Nodes {
				assert.Equal(t, "computed", n.Builtin)
				assert.Equal(t, "idle", n.State)
			}
		})
	}
}

func TestLoadErrors(t *testing.T) {
	f := newFixture(t)
	f.loadTiny(t)
	for _, tc := range []struct {
		name, body string
		status     int
		msg        string
	}{
		{"again", tinyYAML, 409, "already loaded"},
		{"relative path", `{"path": "examples/x"}`, 400, "relative"},
		{"missing path", `{"path": "/nonexistent/x"}`, 400, "no such file"},
		{"bad yaml", "name: [", 400, "malformed YAML"},
		{"unknown reference", "name: bad\nnodes:\n  x: {computed: '${nope + 1}'}\n", 400, `unknown cell or node "nope"`},
		{"empty", "", 400, "empty body"},
		// A JSON request whose fields have the wrong type says which (before:
		// it was parsed as a pattern: `unknown field "yaml"`).
		{"yaml not a string", `{"yaml": 5}`, 400, `"yaml" must be a string (got number)`},
		{"path not a string", `{"path": ["/x"]}`, 400, `"path" must be a string (got array)`},
		{"a device", `{"path": "/dev/zero"}`, 400, "not a regular file"},
		// A misspelt field is refused (before: ignored, the pattern loaded
		// under the default name and space).
		{"misspelt space", `{"yaml": "name: t2\ncells:\n  x: 1\n", "spcae": "other"}`, 400, `unknown field "spcae"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := f.do(t, "POST", "/v1/patterns", tc.body)
			assert.Equal(t, tc.status, status)
			assert.Contains(t, body["error"], tc.msg)
		})
	}
}

func TestGetSet(t *testing.T) {
	f := newFixture(t)
	f.loadTiny(t)
	ctx := context.Background()

	for _, addr := range []string{"total", "tiny/total", "default/tiny/total"} {
		assert.Equal(t, "3", f.value(t, addr), addr)
	}

	c, err := f.c.Set(ctx, "a", json.RawMessage(`10`))
	require.NoError(t, err)
	assert.Equal(t, "default/tiny/a", c.Address)
	assert.Equal(t, "10", string(c.Value))
	assert.Equal(t, "12", f.value(t, "total"), "computed dependents rerun before the write returns")
	assert.Equal(t, "24", f.value(t, "double"))

	list, err := f.c.Cells(ctx, "tiny")
	require.NoError(t, err)
	assert.Len(t, list.Cells, 5)
	assert.Equal(t, f.store.Version(), list.Version)

	for _, tc := range []struct {
		name, method, addr, body string
		status                   int
		want                     map[string]any
	}{
		{"schema minimum", "PUT", "b", `-1`, 422, map[string]any{"path": ""}},
		{"schema type in object", "PUT", "cfg", `{"port": "x"}`, 422, map[string]any{"path": "/port"}},
		{"unknown cell", "GET", "totl", "", 404, map[string]any{"suggestion": "total"}},
		{"unknown cell set", "PUT", "tiny/bb", `1`, 404, map[string]any{"suggestion": "b"}},
		{"unknown pattern", "GET", "tinny/a", "", 404, map[string]any{"suggestion": "default/tiny/a"}},
		{"node output", "PUT", "total", `1`, 409, nil},
		{"not JSON", "PUT", "a", `hello`, 400, nil},
		{"empty value", "PUT", "a", ``, 400, nil},
		{"bad address", "GET", "a/b/c/d", "", 400, nil},
		{"send to a plain cell", "POST", "a", `1`, 400, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := "/v1/cells/" + tc.addr
			if tc.method == "POST" {
				path = "/v1/send/" + tc.addr
			}
			status, body := f.do(t, tc.method, path, tc.body)
			assert.Equal(t, tc.status, status, "%v", body)
			assert.NotEmpty(t, body["error"])
			for k, v := range tc.want {
				assert.Equal(t, v, body[k], k)
			}
		})
	}

	_, body := f.do(t, "PUT", "/v1/cells/b", `-1`)
	assert.Equal(t, "must be >= 0 (got -1)", body["reason"])
	_, body = f.do(t, "PUT", "/v1/cells/a", `hello`)
	assert.Contains(t, body["error"], `'"hello"'`, "a bare word gets the quoting hint")
	assert.Equal(t, "2", f.value(t, "b"), "a refused write changes nothing")
	assert.Equal(t, "12", f.value(t, "total"))
}

// A bare name the first loaded instance lacks, but a later one has, is a
// 404 that names where it is (as the address to write instead).
func TestBareNameInAnotherInstance(t *testing.T) {
	f := newFixture(t)
	f.loadTiny(t)
	for _, y := range []string{"name: hello\ncells:\n  who: world\nnodes:\n  shout: {computed: '${upper(who)}'}\n", "name: other\ncells:\n  shout: quiet\n"} {
		status, body := f.do(t, "POST", "/v1/patterns", y)
		require.Equal(t, http.StatusCreated, status, "%v", body)
	}
	status, body := f.do(t, "GET", "/v1/cells/shout", "")
	assert.Equal(t, http.StatusNotFound, status)
	assert.Equal(t, `no cell "shout" in pattern default/tiny, the first loaded (a bare name is a cell of the first loaded pattern); loaded patterns that have it: hello/shout, other/shout`, body["error"])
	assert.Equal(t, "hello/shout", body["suggestion"])
	assert.Equal(t, `"WORLD"`, f.value(t, "hello/shout"))

	status, body = f.do(t, "GET", "/v1/cells/tiny/shout", "")
	assert.Equal(t, http.StatusNotFound, status)
	assert.NotContains(t, body["error"], "hello/shout", "pattern/name names its pattern: no hint about others")
	status, body = f.do(t, "GET", "/v1/cells/nowhere", "")
	assert.Equal(t, http.StatusNotFound, status)
	assert.Contains(t, body["error"], `no cell "nowhere" in pattern default/tiny (cells: `, "a name no instance has gets the usual answer")
}

func TestWatch(t *testing.T) {
	f := newFixture(t)
	f.loadTiny(t)
	ctx := context.Background()
	v0 := f.store.Version()
	_, err := f.c.Set(ctx, "a", json.RawMessage(`5`))
	require.NoError(t, err)
	v1 := f.store.Version()

	t.Run("snapshot then live", func(t *testing.T) {
		events := sse(t, f.url+"/v1/watch?prefix=tiny", "")
		first := <-events
		assert.Equal(t, strconv.FormatUint(v1, 10), first.id)
		assert.True(t, first.batch.Snapshot)
		assert.Len(t, first.batch.Changes, 5)
		_, err := f.c.Set(ctx, "b", json.RawMessage(`7`))
		require.NoError(t, err)
		next := <-events
		assert.Greater(t, next.batch.Version, v1)
		assert.Equal(t, map[string]string{"default/tiny/b": "7", "default/tiny/total": "12", "default/tiny/double": "24"}, values(next.batch),
			"one commit, one event, with the write and what it recomputed")
	})
	for _, tc := range []struct{ name, query, lastID string }{
		{"from", "?from=" + strconv.FormatUint(v0, 10), ""},
		{"Last-Event-ID", "", strconv.FormatUint(v0, 10)},
	} {
		t.Run("replay with "+tc.name, func(t *testing.T) {
			events := sse(t, f.url+"/v1/watch"+tc.query, tc.lastID)
			first := <-events
			assert.False(t, first.batch.Snapshot)
			assert.Equal(t, strconv.FormatUint(v1, 10), first.id, "the first commit after the version")
			assert.Equal(t, map[string]string{"default/tiny/a": "5", "default/tiny/total": "7", "default/tiny/double": "14"}, values(first.batch))
		})
	}
	t.Run("client", func(t *testing.T) {
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var got []runapi.Batch
		err := f.c.Watch(wctx, "default/tiny/a", &v0, func(b runapi.Batch) error {
			got = append(got, b)
			cancel()
			return nil
		})
		assert.ErrorIs(t, err, context.Canceled)
		require.Len(t, got, 1)
		assert.Equal(t, map[string]string{"default/tiny/a": "5"}, values(got[0]), "the prefix filters changes")
	})
	status, body := f.do(t, "GET", "/v1/watch?from=x", "")
	assert.Equal(t, 400, status)
	assert.Contains(t, body["error"], "want a version")
}

// A prefix names whole segments, as written and after it is resolved:
// big/s (the cell s of pattern big) is not big/small, repl is the node's
// output and its streams but not the cell replay, space big's pattern s
// is not its pattern small. GET /v1/cells and a watch's snapshot agree.
func TestPrefixWholeSegments(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for _, y := range []string{"name: big\ncells:\n  s: 1\n  small: 2\n", "name: bigger\ncells:\n  s: 3\n"} {
		status, body := f.do(t, "POST", "/v1/patterns", y)
		require.Equal(t, http.StatusCreated, status, "%v", body)
	}
	require.NoError(t, f.rt.Load(ctx, runtime.Pattern{Space: "default", Name: "box", Cells: []runtime.Cell{{Name: "replay"}},
		Nodes: []runtime.Node{{Name: "repl", Kind: quietService{}, Streams: []string{"run"}}}}))
	require.NoError(t, f.rt.Load(ctx, runtime.Pattern{Space: "big", Name: "small", Cells: []runtime.Cell{{Name: "a"}}}))

	big := []string{"default/big/s", "default/big/small"}
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{"big/s", []string{"default/big/s"}},
		{"default/big/s", []string{"default/big/s"}},
		{"s", []string{"default/big/s"}},
		{"big", big},
		{"default/big", big},
		{"default/big/", big},
		{"default/bi", nil},
		{"box/repl", []string{"default/box/repl", "default/box/repl.run"}},
		{"default/box/repl.run", []string{"default/box/repl.run"}},
		{"big/small", []string{"big/small/a"}},
		{"big/sm", nil},
		{"big/", big}, // the instance big, as "big"
		{"big/small/", []string{"big/small/a"}},
		{"", []string{"big/small/a", "default/big/s", "default/big/small", "default/bigger/s", "default/box/repl", "default/box/repl.run", "default/box/replay"}},
	} {
		t.Run(tc.prefix, func(t *testing.T) {
			list, err := f.c.Cells(ctx, tc.prefix)
			require.NoError(t, err)
			var got []string
			for _, c := range list.Cells {
				got = append(got, c.Address)
			}
			assert.Equal(t, tc.want, got, "GET /v1/cells?prefix=%s", tc.prefix)

			first := <-sse(t, f.url+"/v1/watch?prefix="+url.QueryEscape(tc.prefix), "")
			require.True(t, first.batch.Snapshot)
			got = nil
			for _, ch := range first.batch.Changes {
				got = append(got, ch.Cell.Address)
			}
			assert.Equal(t, tc.want, got, "GET /v1/watch?prefix=%s", tc.prefix)
		})
	}
}

type sseEvent struct {
	id    string
	batch runapi.Batch
}

// sse reads server-sent events from url (sending lastID as Last-Event-ID)
// until the test ends.
func sse(t *testing.T, url, lastID string) <-chan sseEvent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	require.NoError(t, err)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	ch := make(chan sseEvent, 16)
	go func() {
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "id: "):
				ev.id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "data: "):
				if json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev.batch) != nil {
					return
				}
			case line == "":
				ch <- ev
				ev = sseEvent{}
			}
		}
	}()
	return ch
}

func values(b runapi.Batch) map[string]string {
	out := map[string]string{}
	for _, c := range b.Changes {
		out[c.Cell.Address] = string(c.Cell.Value)
	}
	return out
}

func TestSend(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	// A stream cell with no handler: events queue on it.
	require.NoError(t, f.rt.Load(ctx, runtime.Pattern{Space: "s", Name: "p", Cells: []runtime.Cell{{Name: "in.events", Stream: true}}}))
	sent, err := f.c.Send(ctx, "s/p/in.events", json.RawMessage(`{"command": "ls"}`))
	require.NoError(t, err)
	assert.Equal(t, "s/p/in.events", sent.Address)
	var queued []cells.Event
	require.NoError(t, f.store.View(context.Background(), func(tx cells.Tx) error {
		queued, err = tx.Events(cells.Address{Space: "s", Pattern: "p", Name: "in.events"})
		return err
	}))
	require.Len(t, queued, 1)
	assert.Equal(t, sent.Event.ID, queued[0].ID)
	assert.JSONEq(t, `{"command": "ls"}`, string(queued[0].Payload))

	status, body := f.do(t, "PUT", "/v1/cells/s/p/in.events", `1`)
	assert.Equal(t, 400, status)
	assert.Contains(t, body["error"], "is a stream")

	// A send to a node's output (not one of its streams) names the
	// streams; to a node with none, says so; never suggests a PUT, which
	// a node's output refuses.
	require.NoError(t, f.rt.Load(ctx, runtime.Pattern{Space: "s", Name: "box",
		Nodes: []runtime.Node{{Name: "repl", Kind: quietService{}, Streams: []string{"run", "destroy"}}}}))
	status, body = f.do(t, "POST", "/v1/send/s/box/repl", `{"command": "ls"}`)
	assert.Equal(t, 400, status)
	assert.Equal(t, "s/box/repl is not a stream: send events to one of its streams: repl.destroy, repl.run (e.g. `cellbox send repl.run JSON`, POST /v1/send/s/box/repl.run)", body["error"])
	f.loadTiny(t)
	status, body = f.do(t, "POST", "/v1/send/tiny/total", `1`)
	assert.Equal(t, 400, status)
	assert.Contains(t, body["error"], "default/tiny/total is the output of node total, not a stream, and the node has no streams")
	assert.NotContains(t, body["error"], "PUT")

	// A send to a stream of an instance not loaded says so once.
	require.NoError(t, f.rt.Stop(ctx, "s", "box"))
	status, body = f.do(t, "POST", "/v1/send/s/box/repl.run", `{"command": "ls"}`)
	assert.Equal(t, 409, status)
	assert.Equal(t, 1, strings.Count(body["error"].(string), "send to s/box/repl.run"), "%v", body["error"])
	status, body = f.do(t, "POST", "/v1/send/s/p/in.event", `1`)
	assert.Equal(t, 404, status)
	assert.Equal(t, "in.events", body["suggestion"])
	status, _ = f.do(t, "POST", "/v1/send/s/p/in.events", `not json`)
	assert.Equal(t, 400, status)

	// A stopped pattern takes no events: one queued ran, unchecked,
	// whenever the pattern was loaded again.
	require.NoError(t, f.rt.Stop(ctx, "s", "p"))
	status, body = f.do(t, "POST", "/v1/send/s/p/in.events", `{"command": "rm -rf ."}`)
	assert.Equal(t, 409, status)
	assert.Contains(t, body["error"], "pattern s/p is stopped, or was never loaded here; load it first")
	require.NoError(t, f.store.View(context.Background(), func(tx cells.Tx) error {
		queued, err = tx.Events(cells.Address{Space: "s", Pattern: "p", Name: "in.events"})
		return err
	}))
	assert.Len(t, queued, 1, "nothing was queued")
}

// quietService is a service node kind that does nothing.
type quietService struct{}

func (quietService) Open(context.Context, runtime.Handle, runtime.Inputs) error { return nil }
func (quietService) Update(context.Context, runtime.Inputs) error               { return nil }
func (quietService) Event(context.Context, string, cells.Event) error           { return nil }
func (quietService) Close(context.Context, runtime.CloseReason) error           { return nil }

func TestGraph(t *testing.T) {
	f := newFixture(t)
	f.loadTiny(t)
	for _, tc := range []struct {
		format string
		want   []string
	}{
		{"", []string{`digraph "tiny" {`, `"a" [shape=ellipse`, `"total" [shape=box, style=rounded, label="total\ncomputed"]`, `"a" -> "total";`, `"b" -> "total";`, `"total" -> "double";`}},
		{"dot", []string{`"total" -> "double";`}},
		{"mermaid", []string{"flowchart LR", `c_a(["a"])`, `n_total("total<br/><i>computed</i>")`, "c_a --> n_total", "n_total --> n_double"}},
	} {
		t.Run("format "+tc.format, func(t *testing.T) {
			text, err := f.c.Graph(context.Background(), "tiny", tc.format)
			require.NoError(t, err)
			for _, w := range tc.want {
				assert.Contains(t, text, w)
			}
			assert.NotContains(t, text, `"cfg" ->`, "nothing reads cfg")
		})
	}
	status, body := f.do(t, "GET", "/v1/graph/tiny?format=svg", "")
	assert.Equal(t, 400, status)
	assert.Contains(t, body["error"], "want dot or mermaid")
	status, body = f.do(t, "GET", "/v1/graph/nope", "")
	assert.Equal(t, 404, status)
	assert.Contains(t, body["error"], "default/tiny")
}

func TestStop(t *testing.T) {
	f := newFixture(t)
	f.loadTiny(t)
	require.NoError(t, f.c.Stop(context.Background(), "tiny"))
	ins, err := f.c.Patterns(context.Background())
	require.NoError(t, err)
	assert.Empty(t, ins)
	status, _ := f.do(t, "GET", "/v1/patterns/tiny", "")
	assert.Equal(t, 404, status)
	status, _ = f.do(t, "DELETE", "/v1/patterns/tiny", "")
	assert.Equal(t, 404, status)
	assert.Equal(t, "3", f.value(t, "default/tiny/total"), "a stopped pattern's cells stay")
	assert.Equal(t, "3", f.value(t, "total"), "with nothing loaded a bare name is looked up in the store")

	status, _ = f.do(t, "POST", "/v1/patterns", tinyYAML)
	assert.Equal(t, 201, status, "loading it again resumes it")
	assert.Equal(t, "3", f.value(t, "total"))

	status, body := f.do(t, "GET", "/v1/nothing", "")
	assert.Equal(t, 404, status)
	assert.Contains(t, body["error"], "no endpoint GET /v1/nothing")
	for _, r := range [][2]string{{"DELETE", "/v1/cells/tiny/a"}, {"POST", "/v1/cells"}, {"PUT", "/v1/patterns"}, {"GET", "/v1/send/x.run"}} {
		status, body = f.do(t, r[0], r[1], "")
		assert.Equal(t, 405, status, "%s %s", r[0], r[1])
		assert.Contains(t, body["error"], "method not allowed: "+r[0]+" "+r[1])
	}
}

func TestOwns(t *testing.T) {
	for path, want := range map[string]bool{
		"/v1/patterns": true, "/v1/patterns/x": true, "/v1/cells": true, "/v1/cells/a/b": true, "/v1/watch": true,
		"/v1/send/a.run": true, "/v1/graph/p": true, "/v1/retry/p/fail": true, "/v1/sessions": false, "/v1/tools": false, "/v1/cellsx": false,
		"/v1/retryx": false, "/healthz": false,
	} {
		assert.Equal(t, want, runapi.Owns(path), path)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// With Persist, a restarted server resumes the instances that were loaded
// (from a request's YAML or a folder), with their cells as they stood; a

// persisting returns how to start a server that records its loaded
// patterns in store (Persist), as serve runs it, and how to stop it, as
// a restart does.
func persisting(t *testing.T, store cells.Store) (start func() (*runtime.Runtime, *runapi.Server, *httptest.Server), stop func(*runtime.Runtime, *runapi.Server, *httptest.Server)) {
	start = func() (*runtime.Runtime, *runapi.Server, *httptest.Server) {
		rt := runtime.New(store, runtime.Options{})
		api := runapi.New(runapi.Config{Runtime: rt, Store: store, Logger: slog.New(slog.DiscardHandler), Persist: true})
		return rt, api, httptest.NewServer(api)
	}
	stop = func(rt *runtime.Runtime, api *runapi.Server, ts *httptest.Server) {
		api.Shutdown()
		ts.Close()
		require.NoError(t, rt.Close(context.Background()))
	}
	return start, stop
}

// stopped instance is forgotten.
func TestPersistResume(t *testing.T) {
	store := cells.NewMemory(cells.Options{})
	defer store.Close()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "pattern.yaml"), []byte(strings.Replace(tinyYAML, "name: tiny", "name: fromdir", 1)), 0o644))
	start, stop := persisting(t, store)

	rt, api, ts := start()
	c := runapi.NewClient(ts.URL)
	resp, err := http.Post(ts.URL+"/v1/patterns", "application/yaml", strings.NewReader(tinyYAML))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	_, err = c.Load(context.Background(), dir, "", "")
	require.NoError(t, err)
	_, err = c.Set(context.Background(), "tiny/a", json.RawMessage(`40`))
	require.NoError(t, err)
	stop(rt, api, ts)

	rt, api, ts = start()
	resumed, err := api.Resume(context.Background())
	require.NoError(t, err)
	var names []string
	for _, in := range resumed {
		names = append(names, in.Name)
	}
	assert.ElementsMatch(t, []string{"tiny", "fromdir"}, names)
	require.NoError(t, rt.Wait(context.Background()))
	got, err := store.Get(context.Background(), cells.Address{Space: runapi.DefaultSpace, Pattern: "tiny", Name: "total"})
	require.NoError(t, err)
	assert.Equal(t, "42", string(got.Value), "the resumed instance kept its cells")
	require.NoError(t, api.Stop(context.Background(), "tiny"))
	stop(rt, api, ts)

	rt, api, ts = start()
	resumed, err = api.Resume(context.Background())
	require.NoError(t, err)
	require.Len(t, resumed, 1, "a stopped instance is not resumed")
	assert.Equal(t, "fromdir", resumed[0].Name)
	stop(rt, api, ts)

	// A pattern file broken at a start (saved half way) is kept, and
	// resumed at the next start once it is whole again (it was forgotten
	// for good); Stop of its name forgets it.
	good, err := os.ReadFile(filepath.Join(dir, "pattern.yaml"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "pattern.yaml"), append(good, "nodes: [broken\n"...), 0o644))
	rt, api, ts = start()
	resumed, err = api.Resume(context.Background())
	require.ErrorContains(t, err, "kept: it is tried again at the next start")
	assert.Empty(t, resumed)
	stop(rt, api, ts)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "pattern.yaml"), good, 0o644))
	rt, api, ts = start()
	resumed, err = api.Resume(context.Background())
	require.NoError(t, err)
	require.Len(t, resumed, 1, "resumed once whole again")
	stop(rt, api, ts)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "pattern.yaml"), append(good, "nodes: [broken\n"...), 0o644))
	rt, api, ts = start()
	defer stop(rt, api, ts)
	_, err = api.Resume(context.Background())
	require.Error(t, err)
	require.NoError(t, api.Stop(context.Background(), "fromdir"), "stop forgets a pattern that did not resume")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "pattern.yaml"), good, 0o644))
	resumed, err = api.Resume(context.Background())
	require.NoError(t, err)
	assert.Empty(t, resumed, "forgotten")
	assert.Error(t, api.Stop(context.Background(), "fromdir"), "nothing left to stop")
}

// A restarted server resumes its instances in the order they were loaded,
// not in the order of their names: GET /v1/patterns lists them so, and a
// bare cell name still means a cell of the first loaded one.
func TestResumeKeepsLoadOrder(t *testing.T) {
	store := cells.NewMemory(cells.Options{})
	defer store.Close()
	start, stop := persisting(t, store)
	names := func(c *runapi.Client) []string {
		ins, err := c.Patterns(context.Background())
		require.NoError(t, err)
		var out []string
		for _, in := range ins {
			out = append(out, in.Name)
		}
		return out
	}
	order := []string{"hello", "zeta", "aaa"}
	rt, api, ts := start()
	c := runapi.NewClient(ts.URL)
	for _, name := range order {
		resp, err := http.Post(ts.URL+"/v1/patterns", "application/yaml", strings.NewReader("name: "+name+"\ncells:\n  who: "+name+"\n"))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode)
	}
	require.Equal(t, order, names(c))
	stop(rt, api, ts)

	for restart := 0; restart < 2; restart++ {
		rt, api, ts = start()
		c = runapi.NewClient(ts.URL)
		resumed, err := api.Resume(context.Background())
		require.NoError(t, err)
		require.Len(t, resumed, 3)
		for i, in := range resumed {
			assert.Equal(t, order[i], in.Name, "resumed in load order")
		}
		assert.Equal(t, order, names(c), "GET /v1/patterns lists them in load order after restart %d", restart+1)
		who, err := c.Get(context.Background(), "who")
		require.NoError(t, err)
		assert.Equal(t, `"hello"`, string(who.Value), "a bare name is a cell of the first loaded instance")
		stop(rt, api, ts)
	}
}

// A watch the server must end (its store's change log is unreadable) ends
// with an event that says why, and the client returns it as an error.
func TestWatchEndsWithReason(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "cellbox.db"), 0o600, nil)
	require.NoError(t, err)
	defer db.Close()
	store, err := cells.OpenBoltDB(db, cells.Options{})
	require.NoError(t, err)
	defer store.Close()
	rt := runtime.New(store, runtime.Options{})
	defer rt.Close(context.Background())
	api := runapi.New(runapi.Config{Runtime: rt, Store: store, Logger: slog.New(slog.DiscardHandler)})
	ts := httptest.NewServer(api)
	defer ts.Close()
	defer api.Shutdown()
	c := runapi.NewClient(ts.URL)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "pattern.yaml"), []byte(tinyYAML), 0o644))
	_, err = c.Load(context.Background(), dir, "", "")
	require.NoError(t, err)
	_, err = c.Set(context.Background(), "a", json.RawMessage(`5`))
	require.NoError(t, err)
	last := store.Version()
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("log")).Put(binary.BigEndian.AppendUint64(nil, last), []byte{0xff, 0xff})
	}))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	from := uint64(0)
	var seen []uint64
	err = c.Watch(ctx, "", &from, func(b runapi.Batch) error { seen = append(seen, b.Version); return nil })
	require.Error(t, err, "the watch does not end as if all was well")
	assert.Contains(t, err.Error(), fmt.Sprintf("the server ended the watch: watch \"\" after version %d: change log entry %d:", last-1, last))
	assert.Equal(t, last-1, seen[len(seen)-1], "every readable commit came first")
}

// TestCheckJSON: a bare word gets the quotes it needs, and a number past a
// 64-bit float says so (it gave encoding/json's "cannot unmarshal number
// 1e400 into Go value of type float64", as if the JSON were wrong).
func TestCheckJSON(t *testing.T) {
	for _, ok := range []string{`1`, `-2.5e10`, `"x"`, `{"a":[1,null]}`, `true`} {
		assert.NoError(t, runapi.CheckJSON([]byte(ok)), ok)
	}
	assert.ErrorContains(t, runapi.CheckJSON([]byte(`hello`)), `a string needs quotes: '"hello"'`)
	assert.ErrorContains(t, runapi.CheckJSON([]byte(`1e400`)), "the number 1e400 is out of range: numbers must fit a 64-bit float")
	assert.ErrorContains(t, runapi.CheckJSON([]byte(`{"a": -1e999}`)), "the number -1e999 is out of range")
	assert.Error(t, runapi.CheckJSON([]byte(`{"a":`)))

	// As deep as a pattern's YAML may nest, no deeper (5,000 levels were
	// stored); brackets inside strings do not count.
	deep := func(n int) []byte {
		return []byte(strings.Repeat(`{"a":[`, n/2) + `"[[{\"[\\"` + strings.Repeat(`]}`, n/2))
	}
	assert.NoError(t, runapi.CheckJSON(deep(patterns.MaxDepth)))
	assert.ErrorContains(t, runapi.CheckJSON(deep(patterns.MaxDepth+2)), "it nests 1002 levels deep; a cell's value may nest at most 1000, as in a pattern")
}

// TestMaxString: with ?max_string=N the reads of many cells cut long
// strings in values (keeping their shape and numbers) and say so; without
// it, and for one cell, values are whole.
func TestMaxString(t *testing.T) {
	f := newFixture(t)
	status, body := f.do(t, "POST", "/v1/patterns", "name: big\ncells:\n  s: 0\n  small: {value: {a: 1}}\nnodes:\n  copy: {computed: '${s}'}\n")
	require.Equal(t, http.StatusCreated, status, "%v", body)
	ctx := context.Background()
	blob := strings.Repeat("x", 10000)
	whole := `{"blob":"` + blob + `","n":12345678901234567890,"files":{"out.txt":"short"},"list":[1,2.50,"` + blob + `"]}`
	_, err := f.c.Set(ctx, "s", json.RawMessage(whole))
	require.NoError(t, err)
	const cutS = `{"blob":"xxxxxxxxxx…","n":12345678901234567890,"files":{"out.txt":"short"},"list":[1,2.50,"xxxxxxxxxx…"]}`
	copyWhole := f.value(t, "copy")

	get := func(path string, out any) {
		t.Helper()
		resp, err := http.Get(f.url + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		require.NoError(t, json.NewDecoder(resp.Body).Decode(out), path)
	}
	check := func(what string, cs []runapi.Cell, cut bool) {
		t.Helper()
		byName := map[string]runapi.Cell{}
		for _, c := range cs {
			byName[c.Address[strings.LastIndex(c.Address, "/")+1:]] = c
		}
		s, cp, small := byName["s"], byName["copy"], byName["small"]
		if cut {
			assert.True(t, s.Cut && cp.Cut, "%s: the big cells say they are cut", what)
			assert.Equal(t, []int{len(whole), len(copyWhole)}, []int{s.Size, cp.Size}, "%s: with their whole sizes", what)
			assert.Equal(t, cutS, string(s.Value), "%s: strings cut; shape, keys and numbers kept", what)
			assert.True(t, strings.Contains(string(cp.Value), `"blob":"xxxxxxxxxx…"`), "%s: the copy is cut too", what)
		} else {
			assert.False(t, s.Cut || cp.Cut, what)
			assert.Zero(t, s.Size+cp.Size, what)
			assert.True(t, string(s.Value) == whole && string(cp.Value) == copyWhole, "%s: values whole", what)
		}
		assert.False(t, small.Cut, what)
		assert.Equal(t, `{"a":1}`, string(small.Value), "%s: a small value is untouched", what)
	}

	var ins, insWhole []runapi.Instance
	get("/v1/patterns?max_string=10", &ins)
	require.Len(t, ins, 1)
	check("GET /v1/patterns?max_string=10", ins[0].Cells, true)
	get("/v1/patterns", &insWhole)
	check("GET /v1/patterns", insWhole[0].Cells, false)
	var in runapi.Instance
	get("/v1/patterns/big?max_string=10", &in)
	check("GET /v1/patterns/big?max_string=10", in.Cells, true)
	var list, listWhole runapi.CellList
	get("/v1/cells?prefix=big&max_string=10", &list)
	check("GET /v1/cells?max_string=10", list.Cells, true)
	get("/v1/cells?prefix=big", &listWhole)
	check("GET /v1/cells", listWhole.Cells, false)
	var one runapi.Cell
	get("/v1/cells/s?max_string=10", &one)
	assert.True(t, string(one.Value) == whole && !one.Cut, "one cell is always whole")
	var roomy []runapi.Instance
	get("/v1/patterns?max_string=10000", &roomy)
	check("GET /v1/patterns?max_string=10000", roomy[0].Cells, false)

	// The watch: its snapshot and its live batches.
	events := sse(t, f.url+"/v1/watch?prefix=big&max_string=10", "")
	first := <-events
	require.True(t, first.batch.Snapshot)
	var cs []runapi.Cell
	for _, ch := range first.batch.Changes {
		cs = append(cs, ch.Cell)
	}
	check("watch snapshot", cs, true)
	_, err = f.c.Set(ctx, "s", json.RawMessage(`"`+blob+`y"`))
	require.NoError(t, err)
	next := <-events
	assert.Equal(t, map[string]string{"default/big/s": `"xxxxxxxxxx…"`, "default/big/copy": `"xxxxxxxxxx…"`}, values(next.batch))
	for _, ch := range next.batch.Changes {
		assert.True(t, ch.Cell.Cut, ch.Cell.Address)
		assert.Equal(t, len(blob)+3, ch.Cell.Size, ch.Cell.Address)
	}
	plain := <-sse(t, f.url+"/v1/watch?prefix=big", "")
	assert.True(t, values(plain.batch)["default/big/s"] == `"`+blob+`y"`, "a watch without max_string is whole")

	for _, path := range []string{"/v1/patterns?max_string=x", "/v1/patterns/big?max_string=-1", "/v1/cells?max_string=", "/v1/watch?max_string=1e3"} {
		status, body := f.do(t, "GET", path, "")
		assert.Equal(t, http.StatusBadRequest, status, path)
		assert.Contains(t, body["error"], "max_string", path)
	}
}

// TestLoadSaysResets: loading a pattern edited since its cells were stored
// answers which cells it started anew and why (they were said only in the
// server's log).
func TestLoadSaysResets(t *testing.T) {
	store := cells.NewMemory(cells.Options{})
	defer store.Close()
	rt := runtime.New(store, runtime.Options{})
	defer rt.Close(context.Background())
	api := runapi.New(runapi.Config{Runtime: rt, Store: store, Logger: slog.New(slog.DiscardHandler)})
	ts := httptest.NewServer(api)
	defer ts.Close()
	defer api.Shutdown()
	load := func(yaml string) (answer runapi.Instance) {
		t.Helper()
		resp, err := http.Post(ts.URL+"/v1/patterns", "application/yaml", strings.NewReader(yaml))
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&answer))
		return answer
	}
	assert.Empty(t, load("name: ed\ncells:\n  s: abc\n").Resets)
	require.NoError(t, api.Stop(context.Background(), "ed"))
	got := load("name: ed\ncells:\n  s: {value: h, schema: {type: string, maxLength: 2}}\n")
	require.Len(t, got.Resets, 1)
	assert.Equal(t, "s", got.Resets[0].Cell)
	assert.Contains(t, got.Resets[0].Why, `its stored value "abc" does not satisfy the cell's schema`)
}
