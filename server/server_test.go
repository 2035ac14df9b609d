package server_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/patterns"
	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/sandboxtest"
	"github.com/cellbox/cellbox/server"
	"github.com/cellbox/cellbox/server/runapi"
)

// dirtyPattern's stage first shows what its box holds (files in
// /workspace and /tmp, processes, environment), then leaves traces of
// every kind: files, a process that outlives the command, a variable.
const dirtyPattern = `name: dirty
cells:
  n: {value: "0"}
nodes:
  stage:
    exec:
      cache: false
      command: >-
        echo "run ${n}"; ls -A /workspace /tmp; ps -eo comm; env;
        echo left > /workspace/left-${n}; echo left > /tmp/left-${n};
        export LEFT_BY=${n}; (setsid sleep 300 >/dev/null 2>&1 &)
`

// TestRunExecBoxFromPoolIsFresh runs an exec stage under `cellbox run`'s
// setup (RunConfig) again and again: from the second run on its box comes from the
// warm pool (before, run kept no pool and every stage waited for a cold
// create), and each box holds nothing the previous run left: no file, no
// process, no variable.
func TestRunExecBoxFromPoolIsFresh(t *testing.T) {
	testenv.RequireBwrap(t)
	ctx := context.Background()
	data, err := os.MkdirTemp("", "cbr-")
	require.NoError(t, err)
	t.Cleanup(func() {
		sandboxtest.RemoveBoxes(t, data)
		os.RemoveAll(data)
	})
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, patterns.FileName), []byte(dirtyPattern), 0o644))
	p, err := patterns.Load(dir)
	require.NoError(t, err)

	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	r, err := server.Open(ctx, server.RunConfig(data, "local", testenv.CellboxBinary(t), log))
	require.NoError(t, err)
	defer func() { require.NoError(t, r.Close()) }()
	rt := r.Host.Runtime()
	_, err = r.Host.API().Load(ctx, p, runapi.LoadOptions{Space: runapi.DefaultSpace, Name: p.Name, Source: dir})
	require.NoError(t, err)
	require.NoError(t, rt.Wait(ctx))

	svc, _, err := r.Sandboxes.Get(ctx) // opened by the first run
	require.NoError(t, err)
	stage := cells.Address{Space: runapi.DefaultSpace, Pattern: p.Name, Name: "stage"}
	for n := 1; n <= 3; n++ {
		// The pool grows with use: wait for a ready box, so that this run
		// takes one.
		require.Eventually(t, func() bool { return poolReady(svc) > 0 }, time.Minute, 5*time.Millisecond, "a warm box for run %d", n)
		taken := svc.Metrics().WarmTaken
		require.NoError(t, rt.Set(ctx, cells.Address{Space: runapi.DefaultSpace, Pattern: p.Name, Name: "n"}, json.RawMessage(strconv.Quote(strconv.Itoa(n)))))
		require.NoError(t, rt.Wait(ctx))
		assert.Equal(t, taken+1, svc.Metrics().WarmTaken, "run %d took its box from the warm pool", n)

		c, err := r.State.Cells.Get(context.Background(), stage)
		require.NoError(t, err)
		require.Empty(t, c.Error)
		var res struct{ Result struct{ Stdout string } }
		require.NoError(t, json.Unmarshal(c.Value, &res))
		out := res.Result.Stdout
		require.Contains(t, out, "run "+strconv.Itoa(n), "this run's output: %s", c.Value)
		assert.NotContains(t, out, "left-", "a file of an earlier run")
		assert.NotRegexp(t, `(?m)^sleep$`, out, "a process of an earlier run")
		assert.NotContains(t, out, "LEFT_BY", "a variable of an earlier run")
	}
}

// poolReady is the number of warm boxes ready in svc.
func poolReady(svc *sandbox.Service) int {
	n := 0
	for _, c := range svc.Metrics().PoolReady {
		n += c.N
	}
	return n
}
