package agent

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// starve delays every read of a command's output pipe by d, as an agent
// starved of CPU between a command's exit and the read of its output.
func starve(t *testing.T, d time.Duration) {
	pipeReadDelay.Store(int64(d))
	t.Cleanup(func() { pipeReadDelay.Store(0) })
}

// payload is n bytes of numbered lines, tagged, so that a lost or
// misplaced byte shows.
func payload(tag string, n int) (cmd, want string) {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "%s %06d\n", tag, i)
	}
	lines := strings.Count(b.String(), "\n")
	return fmt.Sprintf("for i in $(seq 0 %d); do printf '%s %%06d\\n' $i; done", lines-1, tag), b.String()
}

// sameOutput fails with where got first differs from want, not both whole.
func sameOutput(t *testing.T, want, got string, what string, args ...any) bool {
	t.Helper()
	if want == got {
		return true
	}
	i := 0
	for i < len(want) && i < len(got) && want[i] == got[i] {
		i++
	}
	t.Errorf("%s: got %d bytes, want %d; they differ from byte %d: got %.40q, want %.40q",
		fmt.Sprintf(what, args...), len(got), len(want), i, got[i:], want[i:])
	return false
}

// Everything a command wrote before it exited reaches its result, however
// late the agent reads its pipes (each read here waits 3× the grace after
// exit; a read deadline dropped what was still in the pipe).
func TestOutputSurvivesASlowAgent(t *testing.T) {
	a := startAgent(t)
	starve(t, 3*exitGrace)
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, wantOut := payload(fmt.Sprintf("out%d", i), 1+i*9000) // one byte to ~100 KB: several reads
			errCmd, wantErr := payload(fmt.Sprintf("err%d", i), 20)
			res, err := a.c.Exec(ctxT(t), ExecRequest{Command: out + "; { " + errCmd + "; } >&2"}, nil)
			if !assert.NoError(t, err) {
				return
			}
			sameOutput(t, wantOut, res.Stdout, "call %d stdout", i)
			sameOutput(t, wantErr, res.Stderr, "call %d stderr", i)
			assert.Empty(t, res.Notices, "call %d", i)
		}()
	}
	wg.Wait()

	t.Run("streamed", func(t *testing.T) {
		cmd, want := payload("stream", 40_000)
		var got bytes.Buffer
		res, err := a.c.Exec(ctxT(t), ExecRequest{Command: cmd}, func(stream string, data []byte) { got.Write(data) })
		require.NoError(t, err)
		sameOutput(t, want, got.String(), "followed")
		assert.Equal(t, 0, res.ExitCode)
	})

	t.Run("process logs followed", func(t *testing.T) {
		cmd, want := payload("logs", 20_000)
		p, err := a.c.Start(ctxT(t), ExecRequest{Command: cmd})
		require.NoError(t, err)
		var got bytes.Buffer
		_, err = a.c.Logs(ctxT(t), p.ID, 0, true, &got)
		require.NoError(t, err)
		sameOutput(t, want, got.String(), "followed")
	})

	t.Run("code context", func(t *testing.T) {
		id := newContext(t, a, "bash")
		cmd, want := payload("cell", 10_000)
		res := runCell(t, a, id, cmd, 0)
		sameOutput(t, want, res.Stdout, "cell")
	})
}

// A pipe that something the command left running holds is cut after the
// grace, and the result says so; what was buffered when it was cut is
// still in the result, however late the agent reads.
func TestOutputHeldByALeftover(t *testing.T) {
	a := startAgent(t)
	starve(t, 3*exitGrace)
	res, err := a.c.Exec(ctxT(t), ExecRequest{
		Command:       "echo before; (sleep 0.05; echo buffered; sleep 30; echo late) & sleep 0.1",
		KeepLeftovers: true,
	}, nil)
	require.NoError(t, err)
	assert.Equal(t, "before\nbuffered\n", res.Stdout)
	require.Len(t, res.Notices, 1)
	assert.Contains(t, res.Notices[0], "stdout and stderr: a process the command left running still holds it open")
	a.c.KillAll(ctxT(t))
}
