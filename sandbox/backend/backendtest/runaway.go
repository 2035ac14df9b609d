package backendtest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/agent"
)

// runaway: no runaway process can wedge a box. Each bomb takes every
// process slot of the box; the very next call must answer (one try, no
// retry loop) with the workspace intact. Before the agent swept leftovers
// and ended runaways on EAGAIN, the next call failed with `exec /bin/bash:
// resource temporarily unavailable` until the box was destroyed.
func (s *suite) runaway(t *testing.T) {
	if !s.enforced(t, "pids", s.enforcement().Pids) { // without it a bomb would hit the host
		return
	}
	bombs := []struct {
		name string
		run  func(ctx context.Context, c *agent.Client) error
		// owned: the bomb belongs to a background job, which the end of a
		// shell call leaves alone: only the next fork's failure ends it.
		owned bool
	}{
		{"background bomb in a shell call", func(ctx context.Context, c *agent.Client) error {
			_, err := c.Exec(ctx, agent.ExecRequest{Command: `f(){ f|f & }; f; sleep 2; echo done`, TimeoutMs: 60000}, nil)
			return err
		}, false},
		{"classic bomb, no timeout", func(ctx context.Context, c *agent.Client) error {
			_, err := c.Exec(ctx, agent.ExecRequest{Command: `:(){ :|:& };:`}, nil)
			return err
		}, false},
		{"setsid bomb", func(ctx context.Context, c *agent.Client) error {
			_, err := c.Exec(ctx, agent.ExecRequest{Command: `setsid bash -c 'f(){ f|f & }; f' </dev/null >/dev/null 2>&1 &`}, nil)
			return err
		}, false},
		{"background job forks to the limit, then sleeps", func(ctx context.Context, c *agent.Client) error {
			_, err := c.Start(ctx, agent.ExecRequest{Command: `python3 -c '
import os, signal
n = 0
try:
    while True:
        if os.fork() == 0:
            signal.pause()
        n += 1
except BlockingIOError:
    pass
print("forked", n, flush=True)
signal.pause()'`})
			if err != nil {
				return err
			}
			// Wait until it is at the limit (it says so).
			for {
				ps, err := c.Processes(ctx)
				if err != nil {
					return err
				}
				var buf strings.Builder
				if _, err := c.Logs(ctx, ps[len(ps)-1].ID, 0, false, &buf); err != nil {
					return err
				}
				if strings.Contains(buf.String(), "forked") {
					return nil
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(50 * time.Millisecond):
				}
			}
		}, true},
	}
	for _, bomb := range bombs {
		t.Run(bomb.name, func(t *testing.T) {
			t.Parallel()
			spec := s.spec(t, "bomb")
			spec.Limits.Pids = 64
			c := s.up(t, spec)
			ok(t, c, "echo precious > kept.txt")
			ctx := ctxFor(t, 2*time.Minute)
			require.NoError(t, bomb.run(ctx, c))

			next, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			begin := time.Now()
			res, err := c.Exec(next, agent.ExecRequest{Command: "cat kept.txt"}, nil)
			require.NoError(t, err, "the call after the bomb")
			t.Logf("the call after the bomb took %s; notices %q", time.Since(begin), res.Notices)
			assert.Equal(t, 0, res.ExitCode, "stderr %q", res.Stderr)
			assert.Equal(t, "precious\n", res.Stdout, "the workspace is intact")
			if bomb.owned {
				require.NotEmpty(t, res.Notices, "the agent says it ended the runaway job")
				assert.Contains(t, res.Notices[0], "out of processes (pids limit 64): ended")
			}
			// Nothing of the bomb is left: the box holds the agent.
			assert.Equal(t, []string{"1"}, others(t, c), "processes besides the agent")
		})
	}
}

// leftovers: what a shell call leaves running ends with it; a background
// job and what it starts live on; kill_all ends them too.
func (s *suite) leftovers(t *testing.T) {
	t.Parallel()
	spec := s.spec(t, "left")
	c := s.up(t, spec)
	ctx := ctxFor(t, time.Minute)
	job, err := c.Start(ctx, agent.ExecRequest{Command: "sleep 1001 & sleep 1002"})
	require.NoError(t, err)
	const jobs = procArgs + ` | grep '^sleep 100' | sort | cut -d' ' -f2`
	// Both run before the sweep is tried on them (a forked child shows
	// its shell's command line until it execs sleep: seen under load).
	require.Eventually(t, func() bool { return ok(t, c, jobs) == "1001\n1002" }, 10*time.Second, 20*time.Millisecond)
	res := sh(t, c, "sleep 1003 & setsid sleep 1004 & nohup sleep 1005 >/dev/null 2>&1 & echo started")
	assert.Equal(t, "started\n", res.Stdout)
	require.Len(t, res.Notices, 1, "the agent says it ended the leftovers")
	assert.Contains(t, res.Notices[0], "ended 3 processes the command left running")
	assert.Equal(t, "1001\n1002", ok(t, c, jobs), "the background job and its child live on")

	n, err := c.KillAll(ctx)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, n, 2, "kill_all ends the job (its shell, maybe) and its child")
	p := waitProcess(t, c, job.ID)
	assert.False(t, p.Running)
	assert.Equal(t, "", ok(t, c, procArgs+` | grep '^sleep 100' || true`))
}

func waitProcess(t *testing.T, c *agent.Client, id string) agent.Process {
	t.Helper()
	ctx := ctxFor(t, 30*time.Second)
	p, err := c.Wait(ctx, id)
	require.NoError(t, err)
	return p
}

// procArgs prints the command line of each process of the box, a line
// each: what `ps -eo args=` prints, from /proc (an image may have no ps),
// leaving out the pipes through which a remote engine reaches the agent
// (`cellbox agent --connect`, see agent.Pipe).
const procArgs = `for d in /proc/[0-9]*; do a=$(tr '\0' ' ' < $d/cmdline 2>/dev/null) || continue; case "$a" in "" | *"agent --connect"*) continue ;; esac; echo "${d#/proc/} $a"; done | cut -d' ' -f2-`

// others lists the pids of the box's processes but the shell that lists
// them and the agent's pipes (procArgs).
func others(t *testing.T, c *agent.Client) []string {
	t.Helper()
	ctx := ctxFor(t, time.Minute)
	list := `for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" = $$ ] && continue; a=$(tr '\0' ' ' < $d/cmdline 2>/dev/null) || continue; case "$a" in "" | *"agent --connect"*) continue ;; esac; echo $p; done`
	res, err := c.Exec(ctx, agent.ExecRequest{Argv: []string{"sh", "-c", list}}, nil)
	require.NoError(t, err)
	return strings.Fields(res.Stdout)
}
