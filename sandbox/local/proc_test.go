package local

import (
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// waitGone ends when the process ends (a zombie not yet reaped has
// ended), says when it still runs at the deadline, and never waits on
// another process that reused the pid.
func TestWaitGone(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	p, err := currentProc(cmd.Process.Pid)
	require.NoError(t, err)

	assert.ErrorIs(t, p.waitGone(50*time.Millisecond), errStillRunning, "a running process is not gone")
	reused := proc{PID: p.PID, Start: p.Start + 1}
	assert.NoError(t, reused.waitGone(2*time.Second), "the process of that pid and start time is gone, whoever holds the pid now")

	done := make(chan error, 1)
	go func() { done <- p.waitGone(time.Minute) }()
	require.NoError(t, cmd.Process.Kill()) // not reaped: a zombie
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("waitGone did not see a killed process end")
	}

	short := exec.Command("sleep", "0.05")
	require.NoError(t, short.Start())
	sp, err := currentProc(short.Process.Pid)
	require.NoError(t, err)
	go func() { _ = short.Wait() }()
	assert.NoError(t, sp.waitGone(time.Minute), "a process that exits on its own")
}
