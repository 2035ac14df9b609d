package sandbox

import (
	"context"
	"encoding/json"
	"slices"

	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/docker"
	"github.com/cellbox/cellbox/sandbox/local"
)

// realBox is a service on a real backend, for the tests of what happens
// when boxes die behind its back.
type realBox struct {
	t     *testing.T
	kind  string // "local" or "docker"
	s     *Service
	be    backend.Backend
	local string // the local backend's root
	sess  string
}

// newRealService starts a Service on the real backend kind over a fresh
// short data directory, with one session; cleanup removes its boxes.
func newRealService(t *testing.T, kind string, mod func(*Config)) *realBox {
	t.Helper()
	dir, err := os.MkdirTemp("", "cbh-")
	require.NoError(t, err)
	rb := &realBox{t: t, kind: kind}
	switch kind {
	case "local":
		testenv.RequireBwrap(t)
		rb.local = filepath.Join(dir, "local")
		lb, err := local.New(local.Options{Root: rb.local, ImagesDir: testenv.ImagesDir()})
		require.NoError(t, err)
		rb.be = lb
	case "docker":
		testenv.RequireDocker(t)
		db, err := docker.New(context.Background(), docker.Options{})
		require.NoError(t, err)
		t.Cleanup(func() { db.Close() })
		rb.be = db
	}
	cfg := Config{
		Backend:      rb.be,
		DataDir:      dir,
		AgentBinary:  testenv.CellboxBinary(t),
		Pool:         map[string]int{},
		ReapInterval: time.Hour, // tests that want the reaper set it
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(context.Background(), cfg)
	require.NoError(t, err)
	rb.s = s
	t.Cleanup(func() {
		s.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if infos, err := rb.be.List(ctx, map[string]string{labelInstance: s.st.instance}); err == nil {
			for _, in := range infos {
				_ = rb.be.Remove(ctx, in.ID)
			}
		}
		testenv.UnmountUnder(t, dir)
		os.RemoveAll(dir)
	})
	rb.sess, _, err = s.NewSession(context.Background())
	require.NoError(t, err)
	return rb
}

// call runs a tool and returns its decoded result.
func (rb *realBox) call(name string, input any) map[string]any {
	rb.t.Helper()
	raw, err := json.Marshal(input)
	require.NoError(rb.t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := rb.s.CallTool(ctx, rb.sess, name, raw)
	require.NoError(rb.t, err)
	var m map[string]any
	require.NoError(rb.t, json.Unmarshal(out, &m))
	return m
}

// ok runs a tool that must succeed.
func (rb *realBox) ok(name string, input any) map[string]any {
	rb.t.Helper()
	m := rb.call(name, input)
	require.Equal(rb.t, false, m["is_error"], "%s: %v", name, m["error"])
	return m
}

// id is the backend id of the session's box name.
func (rb *realBox) id(name string) string {
	rb.s.mu.Lock()
	defer rb.s.mu.Unlock()
	return rb.s.sessions[rb.sess].boxes[name].rec.ID
}

// agentPID is the host pid of box id's agent (its PID 1).
func (rb *realBox) agentPID(id string) int {
	rb.t.Helper()
	pid, err := rb.findAgentPID(id)
	require.NoError(rb.t, err)
	require.NotZero(rb.t, pid)
	return pid
}

// findAgentPID is agentPID, 0 for a box that does not run.
func (rb *realBox) findAgentPID(id string) (int, error) {
	if rb.kind == "local" {
		data, err := os.ReadFile(filepath.Join(rb.local, id, "state.json"))
		if err != nil {
			return 0, err
		}
		var st struct {
			Agent struct {
				PID int `json:"pid"`
			} `json:"agent"`
		}
		err = json.Unmarshal(data, &st)
		return st.Agent.PID, err
	}
	out, err := exec.Command("docker", "inspect", "-f", "{{.State.Pid}}", id).Output()
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(out)))
}

// waitStopped waits until the backend no longer runs box id.
func (rb *realBox) waitStopped(id string) {
	rb.t.Helper()
	require.Eventually(rb.t, func() bool {
		in, err := rb.be.Inspect(context.Background(), id)
		return err == nil && in.State != backend.StateRunning
	}, time.Minute, 50*time.Millisecond, "box %s still runs", id)
}

// deaths are the ways a box dies behind the server's back.
var deaths = []struct {
	name     string
	backends []string
	limits   map[string]any // sandbox_create limits, if any
	kill     func(rb *realBox, id string)
	why      map[string]string // backend -> what the notice says of the death
}{
	{
		name:     "kill -9 of the agent",
		backends: []string{"local", "docker"},
		kill: func(rb *realBox, id string) {
			require.NoError(rb.t, syscall.Kill(rb.agentPID(id), syscall.SIGKILL))
		},
		why: map[string]string{"local": "agent exited", "docker": "container exited with code 137"},
	},
	{
		// The agent is a Go program: the runtime handles SIGSEGV, so a
		// SIGSEGV sent to PID 1 from inside the box is delivered and
		// crashes it (SIGKILL from inside is ignored). If the agent learns
		// to survive this, make this case check that it does.
		name:     "the box kills its own agent",
		backends: []string{"local", "docker"},
		kill: func(rb *realBox, id string) {
			m := rb.call("shell", map[string]any{"sandbox": "b", "command": "kill -SEGV 1"})
			assert.Contains(rb.t, m["error"], "died during this call")
		},
		why: map[string]string{"local": "SIGSEGV", "docker": "SIGSEGV"},
	},
	{
		name:     "docker kill",
		backends: []string{"docker"},
		kill: func(rb *realBox, id string) {
			out, err := exec.Command("docker", "kill", id).CombinedOutput()
			require.NoError(rb.t, err, "%s", out)
		},
		why: map[string]string{"docker": "container exited with code 137"},
	},
	// An OOM no longer kills the agent: every command runs with
	// oom_score_adj 1000, so the kernel kills commands first
	// (backendtest's OOMSparesAgent). An agent the kernel kills anyway
	// dies as by kill -9 above and heals the same way; how the backends
	// report an OOM kill is in TestExitSummary.
}

// TestDeadBoxHeals kills boxes behind the server's back; the next call
// restarts the box with its workspace and says so.
func TestDeadBoxHeals(t *testing.T) {
	for _, kind := range []string{"local", "docker"} {
		for _, d := range deaths {
			if !slices.Contains(d.backends, kind) {
				continue
			}
			t.Run(kind+"/"+d.name, func(t *testing.T) {
				rb := newRealService(t, kind, nil)
				if d.limits != nil {
					rb.ok("sandbox_create", map[string]any{"sandbox": "b", "limits": d.limits})
				}
				rb.ok("shell", map[string]any{"sandbox": "b", "command": "echo kept > kept.txt"})
				id := rb.id("b")
				d.kill(rb, id)
				rb.waitStopped(id)

				m := rb.ok("shell", map[string]any{"sandbox": "b", "command": "cat kept.txt"})
				assert.Equal(t, "kept\n", m["stdout"])
				require.Contains(t, m["notice"], "restarted with its workspace")
				t.Logf("notice: %s", m["notice"])
				assert.Contains(t, m["notice"], d.why[kind])

				l := rb.ok("sandbox_list", nil)
				boxes := l["sandboxes"].([]any)
				require.Len(t, boxes, 1)
				assert.Equal(t, "running", boxes[0].(map[string]any)["status"])
			})
		}
	}
}

// TestDeadBoxInFlightCall: a call running when its box dies gets an error
// that says so; the next call works.
func TestDeadBoxInFlightCall(t *testing.T) {
	for _, kind := range []string{"local", "docker"} {
		t.Run(kind, func(t *testing.T) {
			rb := newRealService(t, kind, nil)
			rb.ok("shell", map[string]any{"command": "true"})
			id := rb.id("default")
			done := make(chan map[string]any, 1)
			go func() {
				done <- callResult(context.Background(), rb.s, rb.sess, "shell", map[string]any{"command": "touch started; sleep 60"})
			}()
			require.Eventually(t, func() bool {
				m := rb.call("shell", map[string]any{"command": "test -e started"})
				return m["exit_code"] == float64(0)
			}, time.Minute, 100*time.Millisecond)
			require.NoError(t, syscall.Kill(rb.agentPID(id), syscall.SIGKILL))
			var m map[string]any
			select {
			case m = <-done:
			case <-time.After(time.Minute):
				t.Fatal("the call in flight did not return")
			}
			require.Equal(t, true, m["is_error"], "%v", m)
			assert.Contains(t, m["error"], "died during this call")
			rb.waitStopped(id)
			rb.ok("shell", map[string]any{"command": "true"})
		})
	}
}

// TestReaperHealsDeadBox: the reaper's health check restarts a dead box
// without any call; sandbox_list then shows it running, and the next call
// hears what happened.
func TestReaperHealsDeadBox(t *testing.T) {
	for _, kind := range []string{"local", "docker"} {
		t.Run(kind, func(t *testing.T) {
			rb := newRealService(t, kind, func(c *Config) { c.ReapInterval = 100 * time.Millisecond })
			rb.ok("shell", map[string]any{"command": "echo kept > kept.txt"})
			id := rb.id("default")
			pid := rb.agentPID(id)
			require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
			require.Eventually(t, func() bool {
				in, err := rb.be.Inspect(context.Background(), id)
				if err != nil || in.State != backend.StateRunning {
					return false
				}
				now, err := rb.findAgentPID(id)
				return err == nil && now != 0 && now != pid
			}, 2*time.Minute, 100*time.Millisecond, "the reaper did not restart the dead box")
			l := rb.ok("sandbox_list", nil)
			assert.Equal(t, "running", l["sandboxes"].([]any)[0].(map[string]any)["status"])
			m := rb.ok("shell", map[string]any{"command": "cat kept.txt"})
			assert.Equal(t, "kept\n", m["stdout"])
			assert.Contains(t, m["notice"], "had died")
		})
	}
}

// TestBoxThatCannotStartSaysWhy: a box whose agent cannot run (one pid is
// not enough for the Go runtime) fails with the backend's reason, without
// waiting for the ready timeout. (The local backend already fails at once:
// bwrap itself cannot fork.)
func TestBoxThatCannotStartSaysWhy(t *testing.T) {
	rb := newRealService(t, "docker", nil)
	m := rb.call("sandbox_create", map[string]any{"sandbox": "tiny", "limits": map[string]any{"pids": 1}})
	require.Equal(t, true, m["is_error"], "%v", m)
	msg := m["error"].(string)
	assert.Contains(t, msg, "stopped while starting: container exited with code 2")
	assert.Contains(t, msg, "failed to create new OS thread", "the agent's own last words")
	assert.NotContains(t, msg, "did not answer within")
}

// TestListTellsTheTruth: sandbox_list checks the running boxes, so a box
// that died behind the server's back is not listed as running while dead:
// it is restarted and the notice says so.
func TestListTellsTheTruth(t *testing.T) {
	for _, kind := range []string{"local", "docker"} {
		t.Run(kind, func(t *testing.T) {
			rb := newRealService(t, kind, nil)
			rb.ok("shell", map[string]any{"command": "true"})
			id := rb.id("default")
			pid := rb.agentPID(id)
			require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
			rb.waitStopped(id)
			l := rb.ok("sandbox_list", nil)
			assert.Contains(t, l["notice"], "had died")
			assert.Equal(t, "running", l["sandboxes"].([]any)[0].(map[string]any)["status"])
			in, err := rb.be.Inspect(context.Background(), id)
			require.NoError(t, err)
			assert.Equal(t, backend.StateRunning, in.State, "listed running, and running")
			assert.NotEqual(t, pid, rb.agentPID(id))
			rb.s.metrics.mu.Lock()
			assert.EqualValues(t, 1, rb.s.metrics.revived)
			rb.s.metrics.mu.Unlock()
		})
	}
}
