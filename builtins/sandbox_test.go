package builtins_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/httpapi"

	"github.com/cellbox/cellbox/builtins"
	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/runtime"
)

const replPattern = `
name: repl
cells:
  cfg: {value: {port: 8080}}
nodes:
  repl:
    sandbox:
      env: {GREETING: hi}
      files:
        /workspace/config.json: ${cfg}
        /workspace/port.txt: 'port ${cfg.port + 1}'
        /workspace/out/result.txt: text
        /workspace/data.json: json
  latest: {computed: '${len(repl.history) > 0 ? repl.history[len(repl.history)-1].stdout : ""}'}
`

// sandboxOut is a sandbox node's output cell.
type sandboxOut struct {
	Pending  bool                        `json:"pending"`
	Status   string                      `json:"status"`
	Box      string                      `json:"box"`
	Error    string                      `json:"error"`
	History  []builtins.HistoryEntry     `json:"history"`
	Files    map[string]json.RawMessage  `json:"files"`
	Previews map[string]builtins.Preview `json:"previews"`
	Made     []string                    `json:"made"`
}

func (r *run) sandbox(name string) sandboxOut {
	r.t.Helper()
	var o sandboxOut
	r.get(name, &o)
	return o
}

func (r *run) file(node, path string) string {
	r.t.Helper()
	return string(r.sandbox(node).Files[path])
}

func TestSandbox(t *testing.T) {
	b := newBox(t)
	r := b.load(t, replPattern, nil)
	r.settle()
	out := r.sandbox("repl")
	assert.Equal(t, "running", out.Status)
	assert.False(t, out.Pending)
	assert.Empty(t, out.History)
	assert.Equal(t, []string{out.Box}, b.list(t))
	cfg, ok := b.read(out.Box, "/workspace/config.json")
	assert.True(t, ok)
	assert.JSONEq(t, `{"port": 8080}`, cfg)
	waitFor(t, "output files read", func() bool { return len(r.sandbox("repl").Files) == 2 })
	assert.Equal(t, "null", r.file("repl", "/workspace/out/result.txt"), "a missing output file is null")

	t.Run("run stream", func(t *testing.T) {
		r.send("repl.run", `{"command": "echo $GREETING; cat /workspace/config.json"}`)
		r.send("repl.run", `{"command": "echo nope >&2; exit 3"}`)
		r.send("repl.run", `{"command": "cat /workspace/x.txt", "files": {"/workspace/x.txt": "from the event"}}`)
		r.settle()
		out := r.sandbox("repl")
		require.Len(t, out.History, 3)
		h := out.History
		assert.Equal(t, "echo $GREETING; cat /workspace/config.json", h[0].Command)
		assert.Equal(t, "hi\n{\"port\":8080}", h[0].Stdout)
		assert.Equal(t, 0, h[0].ExitCode)
		assert.WithinDuration(t, time.Now(), h[0].Started, time.Minute)
		assert.Equal(t, builtins.HistoryEntry{Command: "echo nope >&2; exit 3", Stderr: "nope\n", ExitCode: 3, Started: h[1].Started, DurationMs: h[1].DurationMs}, h[1],
			"a non-zero exit is history, not a failure")
		assert.Equal(t, "from the event", h[2].Stdout)
		assert.False(t, out.Pending)
		var last string
		r.get("latest", &last)
		assert.Equal(t, "from the event", last, "dependents see the history")

		_, err := r.rt.Send(context.Background(), r.addr("repl.run"), json.RawMessage(`{"cmd": "ls"}`))
		assert.ErrorContains(t, err, `unknown field "cmd"`, "a malformed event is refused when sent")
		r.settle()
		assert.Len(t, r.sandbox("repl").History, 3, "a malformed event is refused")
	})

	t.Run("input binding", func(t *testing.T) {
		r.set("cfg", `{"port": 9090}`)
		waitFor(t, "config.json and port.txt rewritten", func() bool {
			cfg, _ := b.read(out.Box, "/workspace/config.json")
			port, _ := b.read(out.Box, "/workspace/port.txt")
			return cfg == `{"port":9090}` && port == "port 9091"
		})

		r.set("cfg", `{"port": "x"}`)
		waitFor(t, "the input problem reported", func() bool {
			return strings.Contains(r.sandbox("repl").Error, "file /workspace/port.txt")
		})
		assert.Equal(t, "running", r.sandbox("repl").Status, "a failing input binding does not stop the box")
		r.set("cfg", `{"port": 9090}`)
		waitFor(t, "the problem gone", func() bool { return r.sandbox("repl").Error == "" })
	})

	t.Run("output bindings", func(t *testing.T) {
		r.send("repl.run", `{"command": "echo done > /workspace/out/result.txt; echo '{\"a\": [1, 2]}' > /workspace/data.json"}`)
		waitFor(t, "files updated", func() bool {
			o := r.sandbox("repl")
			return string(o.Files["/workspace/out/result.txt"]) == `"done\n"` && string(o.Files["/workspace/data.json"]) == `{"a":[1,2]}`
		})
		r.send("repl.run", `{"command": "rm /workspace/out/result.txt; echo '{' > /workspace/data.json"}`)
		waitFor(t, "result.txt gone, data.json error", func() bool {
			o := r.sandbox("repl")
			return string(o.Files["/workspace/out/result.txt"]) == "null" && strings.Contains(o.Error, "output file /workspace/data.json is not JSON")
		})
		assert.Equal(t, `{"a":[1,2]}`, r.file("repl", "/workspace/data.json"), "a file that does not parse keeps its last value")
		r.send("repl.run", `{"command": "echo 7 > /workspace/data.json"}`)
		waitFor(t, "data.json fixed, and its command in the history", func() bool {
			o := r.sandbox("repl")
			h := o.History
			return string(o.Files["/workspace/data.json"]) == "7" && o.Error == "" &&
				len(h) > 0 && h[len(h)-1].Command == "echo 7 > /workspace/data.json"
		})
		// Two broken outputs at once: error names both (it named one, the
		// other kept its old value without a word).
		r.send("repl.run", `{"command": "echo '{' > /workspace/data.json; mkdir /workspace/out/result.txt"}`)
		waitFor(t, "both problems reported", func() bool {
			e := r.sandbox("repl").Error
			return strings.Contains(e, "output file /workspace/data.json is not JSON") && strings.Contains(e, "/workspace/out/result.txt")
		})
		r.send("repl.run", `{"command": "echo 7 > /workspace/data.json; rmdir /workspace/out/result.txt"}`)
		// The files are read again as the command writes them, which may
		// be before its run ends: wait for both.
		waitFor(t, "both fixed, and the command in the history", func() bool {
			o := r.sandbox("repl")
			h := o.History
			return o.Error == "" && len(h) > 0 && h[len(h)-1].Command == "echo 7 > /workspace/data.json; rmdir /workspace/out/result.txt"
		})
	})

	t.Run("destroy and run again", func(t *testing.T) {
		n := len(r.sandbox("repl").History)
		r.send("repl.destroy", `{}`)
		r.settle()
		assert.Equal(t, "destroyed", r.sandbox("repl").Status)
		assert.Empty(t, b.list(t))

		r.send("repl.run", `{"command": "cat /workspace/config.json; ls /workspace"}`)
		r.settle()
		o := r.sandbox("repl")
		assert.Equal(t, "running", o.Status, "a run after destroy makes a fresh box")
		require.Len(t, o.History, n+1, "history is kept")
		assert.Equal(t, "{\"port\":9090}config.json\nout\nport.txt\n", o.History[n].Stdout, "a fresh box: inputs written anew, nothing else")
		assert.Equal(t, []string{o.Box}, b.list(t))
	})

	t.Run("stop destroys the box", func(t *testing.T) {
		r.close(runtime.Stopped)
		assert.Empty(t, b.list(t))
		assert.Equal(t, "destroyed", r.sandbox("repl").Status)
	})
}

// TestSandboxNodeRemovedAndBack: a sandbox node removed from the pattern
// while the runner was down, then put back, starts from a box of its own:
// the earlier node's box, which the reattach found with its files, is
// removed.
func TestSandboxNodeRemovedAndBack(t *testing.T) {
	b := newBox(t)
	store, err := cells.OpenBolt(filepath.Join(t.TempDir(), "cells.db"), cells.Options{NoSync: true})
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	r := b.loadOn(t, store, replPattern, nil)
	r.settle()
	r.send("repl.run", `{"command": "echo SECRET-OLD > /workspace/marker.txt"}`)
	r.settle()
	old := r.sandbox("repl").Box
	r.close(runtime.Shutdown)

	// The pattern without the node: its cells and state go (the box is
	// the runner session's, and stays).
	r = b.loadOn(t, store, "name: repl\ncells:\n  cfg: {value: {port: 8080}}\n", nil)
	r.settle()
	r.close(runtime.Shutdown)

	r = b.loadOn(t, store, replPattern, nil)
	r.settle()
	o := r.sandbox("repl")
	assert.Equal(t, "running", o.Status)
	assert.Empty(t, o.History)
	_, found := b.read(o.Box, "/workspace/marker.txt")
	assert.False(t, found, "the earlier node's files are not the new node's")
	assert.Equal(t, []string{old}, b.list(t), "one box of that name, made anew")
}

func TestSandboxReattach(t *testing.T) {
	b := newBox(t)
	store, err := cells.OpenBolt(filepath.Join(t.TempDir(), "cells.db"), cells.Options{NoSync: true})
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })

	r := b.loadOn(t, store, replPattern, nil)
	r.settle()
	r.send("repl.run", `{"command": "echo kept > /workspace/keep.txt"}`)
	r.settle()
	box := r.sandbox("repl").Box
	r.close(runtime.Shutdown)
	assert.Equal(t, []string{box}, b.list(t), "a shutdown keeps the box")
	var asleep sandboxOut
	require.NoError(t, store.View(context.Background(), func(tx cells.Tx) error {
		c, err := tx.Get(cells.Address{Space: "default", Pattern: "repl", Name: "repl"})
		if err == nil {
			err = json.Unmarshal(c.Value, &asleep)
		}
		return err
	}))
	assert.Equal(t, "asleep", asleep.Status, "the cell says so while no runner runs")

	r = b.loadOn(t, store, replPattern, nil)
	r.settle()
	assert.Len(t, b.client.boxesCreated(), 1, "the restarted runner reattached")
	s, ok := b.read(box, "/workspace/keep.txt")
	assert.True(t, ok)
	assert.Equal(t, "kept\n", s)
	o := r.sandbox("repl")
	assert.Equal(t, "running", o.Status)
	assert.Len(t, o.History, 1)

	// A destroyed sandbox stays destroyed across a restart.
	r.send("repl.destroy", `{}`)
	r.settle()
	r.close(runtime.Shutdown)
	r = b.loadOn(t, store, replPattern, nil)
	r.settle()
	assert.Equal(t, "destroyed", r.sandbox("repl").Status)
	assert.Empty(t, b.list(t))
}

func TestSandboxHistoryLimits(t *testing.T) {
	b := newBox(t)
	r := b.load(t, `
name: hist
nodes:
  sh: {sandbox: {}}
`, nil)
	r.settle()
	r.send("sh.run", fmt.Sprintf(`{"command": "head -c %d /dev/zero | tr '\\0' x; echo; echo end"}`, 2*builtins.HistoryOutputLimit))
	r.settle()
	e := r.sandbox("sh").History[0]
	assert.True(t, e.Truncated)
	assert.LessOrEqual(t, len(e.Stdout), builtins.HistoryOutputLimit)

	for i := range builtins.HistoryLimit + 2 {
		r.send("sh.run", fmt.Sprintf(`{"command": "echo %d"}`, i))
	}
	r.settle()
	// So many commands so fast back the node off (the runtime holds its
	// writes for a second): wait for the last one.
	var raw struct{ History []json.RawMessage }
	waitFor(t, "the history of all commands", func() bool {
		require.NoError(t, json.Unmarshal(r.get("sh", nil).Value, &raw))
		return len(raw.History) == builtins.HistoryLimit+1
	})
	assert.JSONEq(t, `{"dropped": 3}`, string(raw.History[0]))
	var first, last builtins.HistoryEntry
	require.NoError(t, json.Unmarshal(raw.History[1], &first))
	require.NoError(t, json.Unmarshal(raw.History[builtins.HistoryLimit], &last))
	assert.Equal(t, "echo 2", first.Command)
	assert.Equal(t, fmt.Sprintf("echo %d", builtins.HistoryLimit+1), last.Command)

	// A command that leaves a process running: the notice points to
	// what a pattern can do (start:), not the shell tool's background.
	r.send("sh.run", `{"command": "sleep 300 & echo bg"}`)
	r.settle()
	var bg sandboxOut
	waitFor(t, "the background command in the history", func() bool {
		r.get("sh", &bg)
		return bg.History[len(bg.History)-1].Command == "sleep 300 & echo bg"
	})
	require.Len(t, bg.History[len(bg.History)-1].Notices, 1)
	assert.Contains(t, bg.History[len(bg.History)-1].Notices[0], "ended 1 process the command left running")
	assert.Contains(t, bg.History[len(bg.History)-1].Notices[0], "keep a server running with the node's start: field")
	assert.NotContains(t, bg.History[len(bg.History)-1].Notices[0], "background: true")

	r.send("sh.run", `{"command": "sleep 30", "timeout_ms": 300}`)
	r.settle()
	// The node may still be backing off its writes: wait for the entry.
	var o sandboxOut
	waitFor(t, "the timed-out command in the history", func() bool {
		r.get("sh", &o)
		return o.History[len(o.History)-1].Command == "sleep 30"
	})
	assert.True(t, o.History[len(o.History)-1].TimedOut)

	// What the agent saw goes with the entry (a kill for memory said only
	// exit -1 in the history, while the shell tool said why).
	r.send("sh.run", `{"command": "kill -9 $$"}`)
	r.settle()
	waitFor(t, "the killed command in the history", func() bool {
		r.get("sh", &o)
		return o.History[len(o.History)-1].Command == "kill -9 $$"
	})
	e = o.History[len(o.History)-1]
	require.NotEmpty(t, e.Notices, "%+v", e)
	assert.Contains(t, e.Notices[0], "killed by SIGKILL, which in a box is most often the kernel's out-of-memory killer")
}

// TestFileBindingsRoundTrips follows a sandbox's file bindings both ways,
// several times over: cell written -> file in the box, and file written in
// the box -> output cell updated. (`cellbox bench runtime` measures how
// long each takes.)
func TestFileBindingsRoundTrips(t *testing.T) {
	b := newBox(t)
	r := b.load(t, replPattern, nil)
	r.settle()
	box := r.sandbox("repl").Box
	waitFor(t, "output files read", func() bool { return len(r.sandbox("repl").Files) == 2 })
	const n = 5
	for i := range n {
		want := fmt.Sprintf(`{"port":%d}`, 10000+i)
		r.set("cfg", want)
		waitFor(t, "file in the box", func() bool {
			s, _ := b.read(box, "/workspace/config.json")
			return s == want
		})

		text := fmt.Sprintf("v%d", i)
		_, err := b.client.Upload(context.Background(), box, "/workspace/out/result.txt", strings.NewReader(text))
		require.NoError(t, err)
		waitFor(t, "output cell", func() bool {
			c, err := r.store.Get(context.Background(), r.addr("repl"))
			return err == nil && strings.Contains(string(c.Value), `"/workspace/out/result.txt":"`+text+`"`)
		})
	}
}

// TestOverHTTP runs exec and sandbox nodes through the HTTP client of the
// sandbox API (cellbox serve), as a runner on another machine would.
func TestOverHTTP(t *testing.T) {
	b := newBoxHTTP(t)
	r := b.load(t, `
name: http
cells:
  msg: hello
nodes:
  job:
    exec:
      command: tr a-z A-Z < in.txt > out.txt
      files:
        /workspace/in.txt: ${msg}
        /workspace/out.txt: text
  missing:
    exec:
      command: "true"
      files: {/workspace/never.json: json}
  repl:
    sandbox:
      files:
        /workspace/in.txt: ${msg}
        /workspace/out.txt: text
`, nil)
	r.settle()
	assert.Equal(t, map[string]any{"/workspace/out.txt": "HELLO"}, r.exec("job").Result.Files)
	require.NotNil(t, r.exec("missing").Error)
	assert.Contains(t, *r.exec("missing").Error, "output file /workspace/never.json (json) was not written")
	r.send("repl.run", `{"command": "tr a-z A-Z < in.txt > out.txt"}`)
	waitFor(t, "the output file", func() bool { return r.file("repl", "/workspace/out.txt") == `"HELLO"` })
	r.set("msg", `"bye"`)
	r.settle()
	assert.Equal(t, map[string]any{"/workspace/out.txt": "BYE"}, r.exec("job").Result.Files)
	s, _ := b.read(r.sandbox("repl").Box, "/workspace/in.txt")
	assert.Equal(t, "bye", s)
	r.close(runtime.Stopped)
	assert.Empty(t, b.list(t))
}

// TestSandboxPreviews publishes the preview URLs of a sandbox's ports,
// which answer once a server listens, and publishes new ones when the box
// is made anew.
func TestSandboxPreviews(t *testing.T) {
	b := newBox(t)
	pattern := `
name: web
nodes:
  web:
    sandbox:
      ports: [8000, 8001]
      files: {/workspace/site/index.html: hello from the box}
  link: {computed: '${web.previews["8000"]?.url ?? ""}'}
`
	t.Run("no base URL: an error, not a failure", func(t *testing.T) {
		r := b.load(t, pattern, nil)
		r.settle()
		o := r.sandbox("web")
		assert.Equal(t, "running", o.Status)
		assert.Contains(t, o.Error, "preview URL of port 8000: ")
		assert.Contains(t, o.Error, "no base URL")
		assert.Equal(t, map[string]builtins.Preview{}, o.Previews)
		r.close(runtime.Stopped)
	})

	hs := httptest.NewServer(httpapi.Handler(b.svc))
	t.Cleanup(hs.Close)
	b.svc.SetBaseURL(hs.URL)
	r := b.load(t, pattern, nil)
	r.settle()
	o := r.sandbox("web")
	require.Equal(t, "running", o.Status)
	assert.Empty(t, o.Error)
	require.Len(t, o.Previews, 2)
	first := o.Previews["8000"]
	assert.Regexp(t, `^http://p[0-9a-f]{32}\.localhost:\d+/$`, first.URL, "a preview has its own origin")
	assert.Regexp(t, `^http://p[0-9a-f]{32}\.localhost:\d+/$`, first.HostURL)
	assert.NotEqual(t, first.URL, o.Previews["8001"].URL)
	var link string
	r.get("link", &link)
	assert.Equal(t, first.URL, link, "expressions read previews")

	status, _ := get(t, first.URL, "")
	assert.Equal(t, http.StatusBadGateway, status, "nothing listens yet")
	serve := `{"command": "cd /workspace/site && setsid python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 & sleep 0.5"}`
	r.send("web.run", serve)
	r.settle()
	status, _ = get(t, first.URL, "")
	assert.Equal(t, http.StatusBadGateway, status, "a server a run command leaves behind ends with it")
	r.close(runtime.Stopped)

	pattern = strings.Replace(pattern, "ports: [8000, 8001]", "ports: [8000, 8001]\n      start: {command: cd /workspace/site && python3 -m http.server 8000 --bind 127.0.0.1, port: 8000}", 1)
	r = b.load(t, pattern, nil)
	r.settle()
	o = r.sandbox("web")
	first = o.Previews["8000"]
	waitFor(t, "the server to answer through the preview URL", func() bool {
		status, body := get(t, first.URL+"index.html", "")
		return status == http.StatusOK && body == "hello from the box"
	})
	hostURL, err := url.Parse(first.HostURL)
	require.NoError(t, err)
	status, body := get(t, hs.URL+"/index.html", hostURL.Host)
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, "hello from the box", body, "the host URL reaches the same server")

	t.Run("destroy, then run: new URLs", func(t *testing.T) {
		r.send("web.destroy", `{}`)
		r.settle()
		o := r.sandbox("web")
		assert.Equal(t, "destroyed", o.Status)
		assert.Equal(t, map[string]builtins.Preview{}, o.Previews, "no box, no URLs")
		status, _ := get(t, first.URL, "")
		assert.Equal(t, http.StatusNotFound, status)

		r.send("web.run", `{"command": "true"}`) // makes the box anew; start: serves again
		r.settle()
		o = r.sandbox("web")
		require.Equal(t, "running", o.Status)
		require.Len(t, o.Previews, 2)
		second := o.Previews["8000"].URL
		assert.NotEqual(t, first.URL, second, "the new box has new preview URLs")
		var link string
		r.get("link", &link)
		assert.Equal(t, second, link)
		waitFor(t, "the new box's server to answer", func() bool {
			status, body := get(t, second+"index.html", "")
			return status == http.StatusOK && body == "hello from the box"
		})
	})
}

// get fetches url (with Host header host, if set) and returns the status
// and body.
func get(t *testing.T, url, host string) (int, string) {
	resp, body := testenv.HTTPGet(t, url, host)
	return resp.StatusCode, body
}

// refusing is a store whose next fails Updates fail (a full disk).
type refusing struct {
	cells.Store
	fails atomic.Int32
}

func (s *refusing) Update(ctx context.Context, fn func(cells.Tx) error) error {
	if s.fails.Add(-1) >= 0 {
		return errors.New("write cellbox.db: no space left on device")
	}
	return s.Store.Update(ctx, fn)
}

// A command's history entry the store refuses is written again; when the
// store keeps refusing, the event fails with the reason (a failed status),
// instead of the entry vanishing into the log after the event was acked.
func TestSandboxHistoryWriteRefused(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fails   int32
		entries int
		failed  string
	}{
		{"once", 1, 1, ""},
		{"every attempt", 4, 0, `record the result of "echo hi" in the history: write default/hist/repl: write cellbox.db: no space left on device`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBox(t)
			bolt, err := cells.OpenBolt(filepath.Join(t.TempDir(), "cells.db"), cells.Options{NoSync: true})
			require.NoError(t, err)
			t.Cleanup(func() { bolt.Close() })
			store := &refusing{Store: bolt}
			r := b.loadOn(t, store, `
name: hist
nodes:
  repl: {sandbox: {}}
`, nil)
			r.settle()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			statuses := r.rt.Subscribe(ctx, 64)
			release := b.client.holdCommand(t, "echo hi")
			r.send("repl.run", `{"command": "echo hi"}`)
			select {
			case <-b.client.reached:
			case <-time.After(30 * time.Second):
				t.Fatal("the command never ran")
			}
			store.fails.Store(tc.fails) // the event is acked: the history write comes next
			release()
			r.settle()
			assert.Len(t, r.sandbox("repl").History, tc.entries)
			var failed []string
			for done := false; !done; {
				select {
				case s := <-statuses:
					if s.Kind == runtime.Failed {
						failed = append(failed, s.Err)
					}
				default:
					done = true
				}
			}
			if tc.failed == "" {
				assert.Empty(t, failed)
			} else {
				require.Len(t, failed, 1)
				assert.Contains(t, failed[0], tc.failed)
			}
		})
	}
}

// An output cell that does not hold a sandbox output (another writer, an
// older format) is not reset silently: its value is kept in the history
// and the node's error says so.
func TestSandboxUnreadableOutputKept(t *testing.T) {
	b := newBox(t)
	store, err := cells.OpenBolt(filepath.Join(t.TempDir(), "cells.db"), cells.Options{NoSync: true})
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	addr := cells.Address{Space: "default", Pattern: "odd", Name: "repl"}
	require.NoError(t, store.Update(context.Background(), func(tx cells.Tx) error {
		if err := tx.Declare(addr, cells.Spec{}); err != nil {
			return err
		}
		_, err := tx.Set(addr, json.RawMessage(`{"history": "precious", "status": "running"}`))
		return err
	}))
	r := b.loadOn(t, store, `
name: odd
nodes:
  repl: {sandbox: {}}
`, nil)
	r.settle()
	var o struct {
		History []json.RawMessage `json:"history"`
	}
	r.get("repl", &o)
	require.NotEmpty(t, o.History, "the old value is not dropped")
	var kept struct {
		Error string          `json:"error"`
		Value json.RawMessage `json:"unreadable_output"`
	}
	require.NoError(t, json.Unmarshal(o.History[0], &kept))
	assert.JSONEq(t, `{"history": "precious", "status": "running"}`, string(kept.Value))
	assert.Contains(t, kept.Error, "the node's output held a value that is not a sandbox output (json: cannot unmarshal string")

	r.send("repl.run", `{"command": "echo next"}`)
	r.settle()
	r.get("repl", &o)
	require.Len(t, o.History, 2, "the history goes on after it")
	assert.Contains(t, string(o.History[1]), `"stdout":"next\n"`)
}

// TestSandboxNetwork: a sandbox node's `network:` allow list lets its box
// reach what it names (here a server of the test on the host's loopback)
// and nothing else, and a changed list reaches a box that outlived it.
func TestSandboxNetwork(t *testing.T) {
	b := newBox(t)
	// On 127.0.0.2: the box's NO_PROXY sends 127.0.0.1 to its own
	// loopback, so only another host address goes through the proxy.
	serve := func(body string) *httptest.Server {
		ln, err := net.Listen("tcp", "127.0.0.2:0")
		require.NoError(t, err)
		s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, body) }))
		s.Listener.Close()
		s.Listener = ln
		s.Start()
		t.Cleanup(s.Close)
		return s
	}
	allowed, other := serve("allowed"), serve("other")
	pattern := func(host string) string {
		return fmt.Sprintf(`
name: net
nodes:
  box:
    sandbox:
      network: {allow: ["%s"]}
`, host)
	}
	fetch := func(r *run, u string) builtins.HistoryEntry {
		t.Helper()
		before := len(r.sandbox("box").History)
		cmd := fmt.Sprintf(`python3 -c 'import urllib.request as u; print(u.urlopen("%s/", timeout=5).read().decode())'`, u)
		r.send("box.run", fmt.Sprintf(`{"command": %q}`, cmd))
		r.settle()
		h := r.sandbox("box").History
		require.Len(t, h, before+1)
		return h[before]
	}
	store, err := cells.OpenBolt(filepath.Join(t.TempDir(), "cells.db"), cells.Options{NoSync: true})
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	host := strings.TrimPrefix(allowed.URL, "http://")
	r := b.loadOn(t, store, pattern(host), nil)
	r.settle()
	require.Equal(t, "running", r.sandbox("box").Status, r.sandbox("box").Error)
	got := fetch(r, allowed.URL)
	assert.Equal(t, "allowed\n", got.Stdout, got.Stderr)
	got = fetch(r, other.URL)
	assert.NotEqual(t, 0, got.ExitCode, "a host off the list is refused")
	assert.Contains(t, got.Stderr, "403")
	box := r.sandbox("box").Box
	r.close(runtime.Shutdown)

	// The runner restarts with a changed list; the box (kept by the
	// shutdown) is reattached and takes the new list.
	r = b.loadOn(t, store, pattern(strings.TrimPrefix(other.URL, "http://")), nil)
	r.settle()
	require.Equal(t, box, r.sandbox("box").Box, "the box was reattached")
	got = fetch(r, other.URL)
	assert.Equal(t, "other\n", got.Stdout, got.Stderr)
	got = fetch(r, allowed.URL)
	assert.NotEqual(t, 0, got.ExitCode, "the old entry is gone")
	r.close(runtime.Stopped)
}

// TestSandboxSnapshots: a snapshot event records a snapshot in the
// history, and a sandbox node whose snapshot field names it starts its
// next box with that workspace.
func TestSandboxSnapshots(t *testing.T) {
	b := newBox(t)
	r := b.load(t, `
name: snaps
cells:
  base: {value: ""}
nodes:
  a: {sandbox: {}}
  b: {sandbox: {snapshot: '${base}'}}
`, nil)
	r.settle()
	r.send("a.run", `{"command": "mkdir -p src && echo hello > src/keep.txt"}`)
	r.send("a.snapshot", `{"label": "first"}`)
	r.settle()
	h := r.sandbox("a").History
	require.Len(t, h, 2)
	snap := h[1]
	assert.Equal(t, "snapshot first", snap.Command)
	assert.Equal(t, "snapshot", snap.Tool)
	assert.Empty(t, snap.Error)
	assert.Regexp(t, `^snap-[0-9a-f]+$`, snap.Snapshot)
	assert.Contains(t, snap.Stdout, "1 files")

	_, err := r.rt.Send(context.Background(), r.addr("a.snapshot"), json.RawMessage(`{"name": "x"}`))
	assert.ErrorContains(t, err, `unknown field "name"`, "a malformed snapshot event is refused when sent")

	r.set("base", fmt.Sprintf("%q", snap.Snapshot))
	r.settle() // b has the new input before the events
	r.send("b.destroy", `{}`)
	r.send("b.run", `{"command": "cat src/keep.txt"}`)
	r.settle()
	hb := r.sandbox("b").History
	require.Len(t, hb, 1)
	assert.Equal(t, "hello\n", hb[0].Stdout, "the new box started from the snapshot")

	// A snapshot that does not exist (or is another session's) fails the
	// box with a clear error.
	r.set("base", `"snap-0000"`)
	r.settle()
	r.send("b.destroy", `{}`)
	r.send("b.run", `{"command": "true"}`)
	r.settle()
	assert.Contains(t, r.sandbox("b").History[1].Error, `no snapshot "snap-0000"`)
}

// TestSandboxOutputFileTooLarge: an output file over MaxOutputFile is not
// read into the node's output (which a runner would hold in memory and
// store): the node says it is too large and what the cap is, and the
// file's cell keeps its last value until the file fits again.
func TestSandboxOutputFileTooLarge(t *testing.T) {
	b := newBox(t)
	r := b.load(t, `
name: big
nodes:
  b:
    sandbox:
      files: {/workspace/out.txt: text}
`, nil)
	r.settle()
	r.send("b.run", `{"command": "echo small > /workspace/out.txt"}`)
	waitFor(t, "the small file read", func() bool { return r.file("b", "/workspace/out.txt") == `"small\n"` })

	// Written beside and renamed into place: a file read while a command
	// still writes it is read as far as it got (the watch sees each
	// write), which under load was a partial file under the cap.
	r.send("b.run", fmt.Sprintf(`{"command": "head -c %d /dev/zero | tr '\\0' a > /workspace/big.tmp && mv /workspace/big.tmp /workspace/out.txt"}`, builtins.MaxOutputFile+1))
	waitFor(t, "the too-large file reported", func() bool { return r.sandbox("b").Error != "" })
	o := r.sandbox("b")
	assert.Contains(t, o.Error, "output file /workspace/out.txt is larger than 16 MiB, the cap on an output file: it was not read")
	assert.Equal(t, `"small\n"`, string(o.Files["/workspace/out.txt"]), "the cell keeps its last value")
	assert.Equal(t, "running", o.Status)

	r.send("b.run", `{"command": "echo fits > /workspace/out.txt"}`)
	waitFor(t, "the file read again", func() bool {
		o := r.sandbox("b")
		return string(o.Files["/workspace/out.txt"]) == `"fits\n"` && o.Error == ""
	})
}
