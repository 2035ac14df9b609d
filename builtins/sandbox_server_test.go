package builtins_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/builtins"
	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/runtime"
)

// serverPattern keeps a Python web server running in the box: it writes
// its pid (exec keeps it) and serves /workspace on port 8123; the start
// command is a template over the version cell.
const serverPattern = `
name: srv
cells:
  version: 1
  page: hello
nodes:
  web:
    sandbox:
      files:
        /workspace/index.html: ${page}
      start:
        command: 'echo "v${version} up"; echo $$ > /tmp/server.pid; exec python3 -u -m http.server 8123 --bind 127.0.0.1'
        port: 8123
`

// fetchInBox is a run event that fetches a page of the server from inside
// the box.
const fetchInBox = `{"command": "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8123/index.html', timeout=5).read().decode())\""}`

func (r *run) server(node string) builtins.ServerStatus {
	r.t.Helper()
	var o struct {
		Server *builtins.ServerStatus `json:"server"`
	}
	r.get(node, &o)
	if o.Server == nil {
		return builtins.ServerStatus{}
	}
	return *o.Server
}

// lastRun sends a run event and returns its history entry.
func (r *run) lastRun(node, event string) builtins.HistoryEntry {
	r.t.Helper()
	r.send(node+".run", event)
	r.settle()
	h := r.sandbox(node).History
	require.NotEmpty(r.t, h)
	return h[len(h)-1]
}

// TestSandboxServer: start: runs the server when the box comes up, shows
// it ready once its port accepts connections, restarts it when it dies
// and when its command changes, starts it again after a runtime restart,
// and stops it with the pattern. Over both clients.
func TestSandboxServer(t *testing.T) {
	for _, tc := range []struct {
		name string
		box  func(*testing.T) *box
	}{{"in-process", newBox}, {"http", newBoxHTTP}} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.box(t)
			store, err := cells.OpenBolt(filepath.Join(t.TempDir(), "cells.db"), cells.Options{NoSync: true})
			require.NoError(t, err)
			t.Cleanup(func() { store.Close() })
			r := b.loadOn(t, store, serverPattern, nil)
			r.settle()
			ready := func(what string, restarts int) builtins.ServerStatus {
				t.Helper()
				waitFor(t, what, func() bool {
					st := r.server("web")
					return st.State == builtins.ServerReady && st.Restarts == restarts
				})
				return r.server("web")
			}
			st := ready("the server to be ready", 0)
			assert.Contains(t, st.Output, "v1 up")
			e := r.lastRun("web", fetchInBox)
			assert.Equal(t, "hello\n", e.Stdout, "the port answers from inside the box: %s", e.Stderr)
			waitFor(t, "the request in the server's output", func() bool {
				return strings.Contains(r.server("web").Output, `"GET /index.html HTTP/1.1" 200`)
			})
			pid := strings.TrimSpace(r.lastRun("web", `{"command": "cat /tmp/server.pid"}`).Stdout)

			// Killed: it is restarted (after the backoff), ready again.
			require.Equal(t, 0, r.lastRun("web", `{"command": "kill -9 $(cat /tmp/server.pid)"}`).ExitCode)
			st = ready("the killed server to be restarted", 1)
			require.NotNil(t, st.ExitCode, "%+v", st)
			assert.Equal(t, -1, *st.ExitCode, "killed by a signal")
			assert.NotEqual(t, pid, strings.TrimSpace(r.lastRun("web", `{"command": "cat /tmp/server.pid"}`).Stdout))
			assert.Equal(t, "hello\n", r.lastRun("web", fetchInBox).Stdout)

			// A new command (its template's input changed) restarts it.
			r.set("version", "2")
			waitFor(t, "the new command to run", func() bool {
				st := r.server("web")
				return strings.Contains(st.Command, "v2") && st.State == builtins.ServerReady && strings.Contains(st.Output, "v2 up")
			})
			assert.Equal(t, "hello\n", r.lastRun("web", fetchInBox).Stdout)

			// A runtime restart stops it with the runtime and starts it again.
			r.close(runtime.Shutdown)
			assert.Equal(t, builtins.ServerStopped, r.server("web").State)
			r = b.loadOn(t, store, serverPattern, nil)
			r.settle()
			assert.Len(t, b.client.boxesCreated(), 1, "the same box, reattached")
			waitFor(t, "the server to be ready after the restart", func() bool {
				return r.server("web").State == builtins.ServerReady
			})
			e = r.lastRun("web", fetchInBox)
			assert.Equal(t, "hello\n", e.Stdout, "%s %+v", e.Stderr, r.server("web"))

			// Stopping the pattern stops it (and destroys the box).
			r.close(runtime.Stopped)
			assert.Equal(t, builtins.ServerStopped, r.server("web").State)
			assert.Empty(t, b.list(t))
		})
	}
}

// TestSandboxServerCrashLoop: a command that keeps failing is restarted
// with a doubling pause, its exit code and output shown, never in a
// tight loop.
func TestSandboxServerCrashLoop(t *testing.T) {
	b := newBox(t)
	r := b.load(t, `
name: crash
nodes:
  app:
    sandbox:
      start: "echo boom-$RANDOM; echo oops >&2; exit 3"
`, nil)
	r.settle()
	var seen []int64
	waitFor(t, "three backoffs", func() bool {
		st := r.server("app")
		if st.State == builtins.ServerBackoff && (len(seen) == 0 || seen[len(seen)-1] != st.RetryMs) {
			seen = append(seen, st.RetryMs)
		}
		return len(seen) >= 3
	})
	assert.Equal(t, []int64{500, 1000, 2000}, seen[:3], "the pause doubles")
	st := r.server("app")
	require.NotNil(t, st.ExitCode)
	assert.Equal(t, 3, *st.ExitCode)
	assert.GreaterOrEqual(t, strings.Count(st.Output, "boom-"), 3, "every run's output is kept: %q", st.Output)
	assert.Contains(t, st.Output, "oops")
	assert.LessOrEqual(t, st.Restarts, 4, "no tight loop: %+v", st)
}

// TestSandboxServerOutputTail: a server's output is followed however much
// it writes, and only its tail is kept.
func TestSandboxServerOutputTail(t *testing.T) {
	b := newBox(t)
	r := b.load(t, `
name: chatty
nodes:
  app:
    sandbox:
      start: "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo the-end; sleep 600"
`, nil)
	r.settle()
	waitFor(t, "the end of the output", func() bool {
		return strings.Contains(r.server("app").Output, "the-end")
	})
	st := r.server("app")
	assert.LessOrEqual(t, len(st.Output), builtins.ServerOutputLimit)
	assert.Equal(t, builtins.ServerRunning, st.State, "no port or ready probe: running is all that is known")
	raw, _ := json.Marshal(st)
	assert.Less(t, len(raw), 2*builtins.ServerOutputLimit)
}

// TestSandboxServerBoxRemade: when the box goes behind the node's back
// (destroyed, lost), the server's exec fails and its next start brings it
// up in the box the service makes anew.
func TestSandboxServerBoxRemade(t *testing.T) {
	b := newBox(t)
	r := b.load(t, serverPattern, nil)
	r.settle()
	waitFor(t, "the server to be ready", func() bool { return r.server("web").State == builtins.ServerReady })
	require.NoError(t, b.client.DestroyBox(t.Context(), r.sandbox("web").Box))
	waitFor(t, "the server to be ready in the new box", func() bool {
		st := r.server("web")
		return st.State == builtins.ServerReady && st.Restarts == 1
	})
	st := r.server("web")
	assert.Nil(t, st.ExitCode, "the exec failed: no exit code")
	e := r.lastRun("web", `{"command": "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8123/', timeout=5).status)\""}`)
	assert.Equal(t, "200\n", e.Stdout, e.Stderr)
}
