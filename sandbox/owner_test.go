package sandbox

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/backend"
	leases "github.com/cellbox/cellbox/sandbox/lease"
)

// TestReaperActsOnlyWithItsLease: the reaper puts idle boxes to sleep only
// while this server holds its lease; while another server holds it, an idle
// box is left alone (that server's reaper is the one that acts), and once it
// is released this one takes over. The same for the warm pool.
func TestReaperActsOnlyWithItsLease(t *testing.T) {
	ctx := context.Background()
	shared := leases.NewLocal()
	other, err := shared.Acquire(ctx, leaseReaper, "another server", time.Hour)
	require.NoError(t, err)
	pool, err := shared.Acquire(ctx, leaseWarmPool, "another server", time.Hour)
	require.NoError(t, err)

	be := newFakeBackend(t)
	s := newTestService(t, be, "", func(c *Config) {
		c.ReapInterval = 20 * time.Millisecond
		c.Leaser = shared
		c.Pool = map[string]int{backend.DefaultImage: 1}
	})
	h := newSession(t, s)
	id := h.tool("sandbox_create", map[string]any{"sandbox": "nap", "sleep_after_ms": 50})["id"].(string)
	// Many reaper rounds and several sleep_after_ms go by: the box runs on,
	// and no warm box is made.
	for range 20 {
		time.Sleep(20 * time.Millisecond)
		require.Equal(t, backend.StateRunning, be.state(id), "the reaper acted without its lease")
	}
	assert.Equal(t, 1, be.count(), "the warm pool filled without its lease")

	require.NoError(t, shared.Release(ctx, other))
	require.NoError(t, shared.Release(ctx, pool))
	require.Eventually(t, func() bool { return be.state(id) == backend.StateStopped }, 30*time.Second, 10*time.Millisecond,
		"once the lease is free, this server's reaper takes it and acts")
	require.Eventually(t, func() bool { return be.count() == 2 }, 30*time.Second, 10*time.Millisecond, "and the warm pool fills")
	holder, err := shared.Holder(ctx, leaseReaper)
	require.NoError(t, err)
	assert.Equal(t, s.cfg.Holder, holder)

	require.NoError(t, s.Close())
	holder, err = shared.Holder(ctx, leaseReaper)
	require.NoError(t, err)
	assert.Empty(t, holder, "Close gives the leases up for another server to take at once")
}
