package sandbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	leases "github.com/cellbox/cellbox/sandbox/lease"
	"github.com/cellbox/cellbox/sandbox/state"
)

// TestReaperTakesOverOrphanedSessions: a session whose server is gone
// (its lease free) and that no client calls again is taken over by the
// server holding the reaper's lease, which expires it as its own and
// removes its box; before, it stayed in the shared state, its box running
// on, for ever.
func TestReaperTakesOverOrphanedSessions(t *testing.T) {
	defer func(d time.Duration) { orphanScanInterval = d }(orphanScanInterval)
	orphanScanInterval = 10 * time.Millisecond
	shared, st := leases.NewLocal(), state.NewMemory()
	be := newFakeBackend(t)
	sharedCfg := func(holder string, reap time.Duration) func(*Config) {
		return func(c *Config) {
			c.Shared, c.Leaser, c.State, c.Holder = true, shared, st, holder
			c.ReapInterval, c.SessionTTL = reap, 300*time.Millisecond
		}
	}
	a := newTestService(t, be, "", sharedCfg("a", time.Hour))
	h := newSession(t, a)
	id := h.tool("sandbox_create", map[string]any{"sandbox": "left"})["id"].(string)
	require.NoError(t, a.Close()) // its server gone: the session's lease is free
	require.Equal(t, 1, be.count())

	b := newTestService(t, be, "", sharedCfg("b", 20*time.Millisecond))
	require.Eventually(t, func() bool { return be.count() == 0 }, 30*time.Second, 10*time.Millisecond,
		"the orphaned session was never expired: its box %s still runs", id)
	// Its record goes after its boxes (DeleteSession).
	require.Eventually(t, func() bool {
		_, err := st.Get(context.Background(), state.Sessions, h.id)
		return errors.Is(err, state.ErrNotFound)
	}, 30*time.Second, 10*time.Millisecond, "the session's record is gone")
	_, err := b.session(h.id)
	assert.ErrorIs(t, err, ErrNoSession)
}
