package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandboxclient"
	"github.com/cellbox/cellbox/server"
)

// TestServeStopSleepsBoxes stops `cellbox serve` as a user would (SIGTERM)
// while a tool API session's box runs: no process of the box is left (its
// bwrap, or its container), its disk is unmounted and no box of the data
// dir runs (the warm pool's are removed) — nothing holds the data dir —
// and the next serve over the data dir wakes the box, with its
// files, on its next call. Before, the box ran on after its server with
// nobody left to put it to sleep, and its mounted disk made removing the
// data dir fail with EBUSY.
func TestServeStopSleepsBoxes(t *testing.T) {
	for _, name := range []string{"local", "docker"} {
		t.Run(name, func(t *testing.T) {
			if name == "docker" {
				testenv.RequireDocker(t)
			} else {
				testenv.RequireBwrap(t)
			}
			data := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			be, err := server.OpenBackend(ctx, name, data, "")
			require.NoError(t, err)

			srv := startServe(t, data, "--pool", "1", "--backend", name)
			c, err := sandboxclient.NewSessionWithKey(ctx, srv.url, srv.key)
			require.NoError(t, err)
			sess, token := c.Session()
			out, err := c.Tool(ctx, "sandbox_create", map[string]any{"sandbox": "work"})
			require.NoError(t, err)
			var created api.SandboxCreateOutput
			require.NoError(t, json.Unmarshal(out, &created))
			id := created.ID
			if name == "docker" { // startServe's cleanup removes local boxes only
				t.Cleanup(func() { be.Remove(context.Background(), id) })
			}
			_, err = c.Tool(ctx, "write_file", map[string]any{"sandbox": "work", "path": "kept.txt", "content": "written before the stop"})
			require.NoError(t, err)
			info, err := be.Inspect(ctx, id)
			require.NoError(t, err)
			require.Equal(t, backend.StateRunning, info.State)

			require.NoError(t, srv.stop(t), "a graceful stop exits 0")
			info, err = be.Inspect(ctx, id)
			require.NoError(t, err)
			assert.Equal(t, backend.StateStopped, info.State, "no process of the box runs on")
			assert.Empty(t, testenv.Mounts(t, id), "the box's disk is unmounted")
			listed, err := be.List(ctx, map[string]string{backend.LabelManaged: "1"})
			require.NoError(t, err)
			for _, in := range listed {
				if strings.HasPrefix(in.HostDir, data+"/") {
					assert.NotEqual(t, backend.StateRunning, in.State, "no box of the data dir runs (warm pool boxes are removed): %s", in.ID)
				}
			}

			srv = startServe(t, data, "--pool", "0", "--backend", name)
			c = sandboxclient.New(srv.url, sess, token)
			out, err = c.Tool(ctx, "read_file", map[string]any{"sandbox": "work", "path": "kept.txt"})
			require.NoError(t, err)
			var rf api.ReadFileOutput
			require.NoError(t, json.Unmarshal(out, &rf))
			assert.Equal(t, "written before the stop", rf.Content, "the next serve wakes the box with its files")
		})
	}
}

// TestServeStopAnswersCallsInFlight stops `cellbox serve` while a tool call
// runs a command longer than --shutdown-grace: once the grace is over, the
// command is ended and the call answered that the server is shutting down
// (before, its connection was cut with no answer).
func TestServeStopAnswersCallsInFlight(t *testing.T) {
	testenv.RequireBwrap(t)
	data := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := startServe(t, data, "--pool", "0", "--shutdown-grace", "1s")
	c, err := sandboxclient.NewSessionWithKey(ctx, srv.url, srv.key)
	require.NoError(t, err)
	_, err = c.Tool(ctx, "shell", map[string]any{"command": "true"}) // the box is up
	require.NoError(t, err)
	type answer struct {
		out []byte
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		out, err := c.Tool(ctx, "shell", map[string]any{"command": "echo started > started; sleep 60", "timeout_ms": 120000})
		answered <- answer{out, err}
	}()
	require.Eventually(t, func() bool {
		out, err := c.Tool(ctx, "read_file", map[string]any{"path": "started"})
		return err == nil && strings.Contains(string(out), "started")
	}, time.Minute, 50*time.Millisecond, "the long call runs")

	require.NoError(t, srv.stop(t), "a graceful stop exits 0")
	a := <-answered
	var failed *sandboxclient.ToolError
	require.ErrorAs(t, a.err, &failed, "the call is answered with an error result, not cut")
	assert.Equal(t, "shell: the server is shutting down: the call was ended, its command stopped; call again once the server is back", a.err.Error())
	assert.Equal(t, api.CodeUnavailable, failed.Code, "call again once the server is back: not internal, a fault")
	assert.ErrorIs(t, a.err, sandboxclient.ErrUnavailable)
}
