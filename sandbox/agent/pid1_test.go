package agent

import (
	"context"
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
)

// TestPID1 runs the real binary as PID 1 of a new PID namespace (as in a box)
// and checks that it reaps orphans and that SIGTERM stops it and its
// processes. The backends' suites run it in real boxes.
func TestPID1(t *testing.T) {
	testenv.RequireRoot(t, "for a PID namespace")
	unshare := testenv.RequireCommand(t, "unshare")
	bin := testenv.CellboxBinary(t)
	dir, err := os.MkdirTemp("", "cbag")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "agent.sock")
	ws := filepath.Join(dir, "ws")
	cmd := exec.Command(unshare, "--pid", "--fork", "--kill-child=SIGTERM", "--mount-proc", bin, "agent", "--socket", sock, "--workspace", ws)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer cmd.Process.Kill()

	c := Dial(sock)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, c.WaitReady(ctx))
	v, err := c.Version(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, v.PID)
	assert.Equal(t, ws, v.Workspace)

	// Orphans (grandchildren whose parent exited) are re-parented to the
	// agent, which reaps them: no zombies pile up.
	for i := 0; i < 5; i++ {
		res, err := c.Exec(ctx, ExecRequest{Command: "(sleep 0.05 &) ; sh -c 'true & exit 3'"}, nil)
		require.NoError(t, err)
		assert.Equal(t, 3, res.ExitCode, "exit statuses reach the right caller")
	}
	time.Sleep(300 * time.Millisecond)
	res, err := c.Exec(ctx, ExecRequest{Command: "ps -eo stat=,comm= | grep '^Z' || true"}, nil)
	require.NoError(t, err)
	assert.Empty(t, strings.TrimSpace(res.Stdout), "zombies in the box")

	// A background process survives its call and dies with the agent.
	p, err := c.Start(ctx, ExecRequest{Command: "trap '' TERM; sleep 1000"})
	require.NoError(t, err)
	res, err = c.Exec(ctx, ExecRequest{Argv: []string{"true"}}, nil)
	require.NoError(t, err)
	list, err := c.Processes(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, p.ID, list[0].ID)
	assert.True(t, list[0].Running)

	// unshare ignores SIGTERM while it waits: signal the agent, its child.
	children, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "task", strconv.Itoa(cmd.Process.Pid), "children"))
	require.NoError(t, err)
	agentPID, err := strconv.Atoi(strings.TrimSpace(string(children)))
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(agentPID, syscall.SIGTERM))
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("agent did not stop on SIGTERM")
	}
}
