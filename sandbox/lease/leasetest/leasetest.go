// Package leasetest is the conformance suite of lease.Leaser: every
// implementation (the process-local one, one on a shared store) runs Run.
package leasetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/lease"
)

// Run runs the suite on the Leasers open makes (a fresh one each, every
// name unused in it). A lease's time to live in the suite is a second
// (etcd's least): the expiry tests wait for it, with a generous bound.
func Run(t *testing.T, open func(t *testing.T) lease.Leaser) {
	ctx := context.Background()
	const ttl = time.Second

	t.Run("AcquireAndHolder", func(t *testing.T) {
		l := open(t)
		h, err := l.Holder(ctx, "n")
		require.NoError(t, err)
		assert.Empty(t, h, "no one holds a new name")
		a, err := l.Acquire(ctx, "n", "a", ttl)
		require.NoError(t, err)
		assert.Equal(t, "n", a.Name)
		assert.Equal(t, "a", a.Holder)
		assert.True(t, a.Expires.After(time.Now()))
		h, err = l.Holder(ctx, "n")
		require.NoError(t, err)
		assert.Equal(t, "a", h)
		again, err := l.Acquire(ctx, "n", "a", ttl)
		require.NoError(t, err, "acquiring what one holds renews it")
		assert.Equal(t, a.Token, again.Token, "the same holder keeps its token")
		_, err = l.Acquire(ctx, "other", "b", ttl)
		require.NoError(t, err, "names are independent")
	})

	t.Run("HeldByAnother", func(t *testing.T) {
		l := open(t)
		_, err := l.Acquire(ctx, "n", "a", ttl)
		require.NoError(t, err)
		_, err = l.Acquire(ctx, "n", "b", ttl)
		require.ErrorIs(t, err, lease.ErrHeld)
		assert.Contains(t, err.Error(), "a", "the error names the holder")
	})

	t.Run("Release", func(t *testing.T) {
		l := open(t)
		a, err := l.Acquire(ctx, "n", "a", ttl)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx, a))
		require.NoError(t, l.Release(ctx, a), "releasing twice is not an error")
		b, err := l.Acquire(ctx, "n", "b", ttl)
		require.NoError(t, err, "a released name is free at once")
		assert.Greater(t, b.Token, a.Token, "the token grows when the lease changes hands")
		_, err = l.Renew(ctx, a)
		assert.ErrorIs(t, err, lease.ErrLost, "the released lease is lost")
		require.NoError(t, l.Release(ctx, a), "releasing a lost lease leaves the new holder's alone")
		h, err := l.Holder(ctx, "n")
		require.NoError(t, err)
		assert.Equal(t, "b", h)
	})

	t.Run("Renew", func(t *testing.T) {
		l := open(t)
		a, err := l.Acquire(ctx, "n", "a", ttl)
		require.NoError(t, err)
		r, err := l.Renew(ctx, a)
		require.NoError(t, err)
		assert.False(t, r.Expires.Before(a.Expires), "renewing moves the expiry on")
		assert.Equal(t, a.Token, r.Token)
	})

	t.Run("Expiry", func(t *testing.T) {
		l := open(t)
		a, err := l.Acquire(ctx, "n", "a", ttl)
		require.NoError(t, err)
		// Not renewed: another takes it once it expires.
		var b lease.Lease
		waitFor(t, "the unrenewed lease to expire", func() bool {
			b, err = l.Acquire(ctx, "n", "b", ttl)
			return err == nil
		})
		assert.Greater(t, b.Token, a.Token)
		_, err = l.Renew(ctx, a)
		assert.ErrorIs(t, err, lease.ErrLost, "the expired holder cannot renew")
	})

	t.Run("ConcurrentAcquire", func(t *testing.T) {
		l := open(t)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var won []string
		for i := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				holder := fmt.Sprintf("h%d", i)
				if _, err := l.Acquire(ctx, "n", holder, ttl); err == nil {
					mu.Lock()
					won = append(won, holder)
					mu.Unlock()
				} else if !errors.Is(err, lease.ErrHeld) {
					t.Errorf("acquire: %v", err)
				}
			}()
		}
		wg.Wait()
		assert.Len(t, won, 1, "exactly one holder gets the lease: %v", won)
	})

	t.Run("Invalid", func(t *testing.T) {
		l := open(t)
		for _, tc := range []struct {
			name, holder string
			ttl          time.Duration
		}{{"", "a", ttl}, {"n", "", ttl}, {"n", "a", 0}, {"n", "a", -time.Second}} {
			_, err := l.Acquire(ctx, tc.name, tc.holder, tc.ttl)
			assert.Error(t, err, "%+v", tc)
		}
	})

	t.Run("Keep", func(t *testing.T) {
		l := open(t)
		kctx, cancel := context.WithCancel(ctx)
		defer cancel()
		// A kept lease renews every third of its ttl: three seconds leave a
		// starved renewal a second of slack on a loaded machine.
		const keepTTL = 3 * ttl
		h, err := lease.Keep(kctx, l, "n", "a", keepTTL)
		require.NoError(t, err)
		// Kept past several times its ttl: no one else can take it.
		deadline := time.Now().Add(2 * keepTTL)
		for time.Now().Before(deadline) {
			_, err := l.Acquire(ctx, "n", "b", ttl)
			require.ErrorIs(t, err, lease.ErrHeld, "a kept lease stays its holder's")
			select {
			case <-h.Lost():
				t.Fatal("a kept lease was lost")
			case <-time.After(ttl / 4):
			}
		}
		_, err = lease.Keep(ctx, l, "n", "b", keepTTL)
		require.ErrorIs(t, err, lease.ErrHeld)
		require.NoError(t, h.Release(ctx))
		_, err = l.Acquire(ctx, "n", "b", ttl)
		require.NoError(t, err, "released by Release")
	})

	t.Run("KeepLost", func(t *testing.T) {
		l := open(t)
		h, err := lease.Keep(ctx, l, "n", "a", 3*ttl)
		require.NoError(t, err)
		defer h.Release(ctx)
		// Taken from under its holder (released behind its back, then
		// acquired): the holder hears of it.
		require.NoError(t, l.Release(ctx, h.Lease()))
		_, err = l.Acquire(ctx, "n", "b", ttl)
		require.NoError(t, err)
		select {
		case <-h.Lost():
		case <-time.After(30 * time.Second): // a safety net: Keep renews every ttl/3
			t.Fatal("the holder was not told its lease was lost")
		}
	})

	t.Run("KeepEndsWithContext", func(t *testing.T) {
		l := open(t)
		kctx, cancel := context.WithCancel(ctx)
		_, err := lease.Keep(kctx, l, "n", "a", ttl)
		require.NoError(t, err)
		cancel()
		waitFor(t, "the lease to be released when its context ended", func() bool {
			h, err := l.Holder(ctx, "n")
			return err == nil && h == ""
		})
	})
}

// waitFor polls cond until it holds, or fails after a generous while (a
// safety net: the suite waits for events, not for a machine's speed).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited in vain for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
