package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestClientHealsUndeliveredRequests: a request that cannot reach the
// agent (its socket is gone: the agent died) calls the client's heal,
// which brings an agent back on the socket, and is sent once more, its
// body whole; a request that reached the agent is never sent twice, and a
// request under WithoutHeal (the health check itself) is not healed.
func TestClientHealsUndeliveredRequests(t *testing.T) {
	a := startAgent(t)
	dead := Dial(filepath.Join(filepath.Dir(a.socket), "dead.sock"))
	var heals atomic.Int32
	dead.SetHeal(func(ctx context.Context) error {
		heals.Add(1)
		return nil // says it healed, but nothing listens on the socket
	})
	// The retry fails too, once, and says why.
	_, err := dead.Version(ctxT(t))
	require.Error(t, err)
	assert.EqualValues(t, 1, heals.Load(), "one heal, one retry")

	healed := Dial(filepath.Join(filepath.Dir(a.socket), "healed.sock"))
	heals.Store(0)
	healed.SetHeal(func(ctx context.Context) error {
		heals.Add(1)
		return os.Link(a.socket, filepath.Join(filepath.Dir(a.socket), "healed.sock"))
	})
	_, err = healed.Version(WithoutHeal(ctxT(t)))
	require.Error(t, err, "no heal under WithoutHeal")
	assert.EqualValues(t, 0, heals.Load())

	n, err := healed.Upload(ctxT(t), "up.txt", strings.NewReader("all of it"), 0)
	require.NoError(t, err, "healed, then sent again")
	assert.EqualValues(t, 9, n)
	assert.EqualValues(t, 1, heals.Load())
	got, err := os.ReadFile(a.path("up.txt"))
	require.NoError(t, err)
	assert.Equal(t, "all of it", string(got), "the body went whole the second time")

	_, err = healed.Version(ctxT(t))
	require.NoError(t, err)
	assert.EqualValues(t, 1, heals.Load(), "a live agent: no heal")
}

// TestWaitReadyForALateAgent: WaitReady, begun before the agent's socket
// exists, sleeps on the socket's directory and returns once an agent
// serves there; cancelled, it says what it waited for.
func TestWaitReadyForALateAgent(t *testing.T) {
	dir, err := os.MkdirTemp("", "cbwr")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "agent.sock")
	c := Dial(sock)
	defer c.Close()

	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	go func() { done <- c.WaitReady(ctx) }()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "other"), nil, 0o644)) // an unrelated file wakes it; it waits on
	sctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- Serve(sctx, Options{Socket: sock, Workspace: t.TempDir()}) }()
	require.NoError(t, <-done)
	stop()
	require.NoError(t, <-served)

	cancel()
	gone := Dial(filepath.Join(dir, "never.sock"))
	err = gone.WaitReady(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "never.sock not ready")
}
