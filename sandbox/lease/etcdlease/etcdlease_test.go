package etcdlease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellbox/cellbox/internal/etcdtest"
	"github.com/cellbox/cellbox/sandbox/lease"
	"github.com/cellbox/cellbox/sandbox/lease/etcdlease"
	"github.com/cellbox/cellbox/sandbox/lease/leasetest"
)

// TestLeaser runs the lease conformance suite on etcd's leases, each
// Leaser under a prefix of its own.
func TestLeaser(t *testing.T) {
	c := etcdtest.Start(t, 1).Dial(t)
	leasetest.Run(t, func(t *testing.T) lease.Leaser {
		return etcdlease.New(c, etcdtest.Prefix())
	})
}

// TestHolderDies: a server that holds a lease and is cut off from etcd
// (its client closed, as when its process is killed) loses it when the
// time to live runs out, and a server on another member takes it with a
// greater token.
func TestHolderDies(t *testing.T) {
	cl := etcdtest.Start(t, 3)
	a := etcdlease.New(cl.Dial(t), "")
	dying := cl.Dial(t)
	d := etcdlease.New(dying, "")
	held, err := d.Acquire(t.Context(), "pattern/x", "dying", 2*time.Second)
	require.NoError(t, err)
	_, err = a.Acquire(t.Context(), "pattern/x", "a", 2*time.Second)
	require.ErrorIs(t, err, lease.ErrHeld)
	require.NoError(t, dying.Close())
	start := time.Now()
	var got lease.Lease
	for {
		got, err = a.Acquire(t.Context(), "pattern/x", "a", 2*time.Second)
		if err == nil {
			break
		}
		require.ErrorIs(t, err, lease.ErrHeld)
		require.Less(t, time.Since(start), 30*time.Second, "the dead holder's lease never expired")
		time.Sleep(50 * time.Millisecond)
	}
	assert.Greater(t, got.Token, held.Token)
	_, err = d.Renew(context.Background(), held)
	assert.Error(t, err, "the dead holder cannot renew")
}

// TestSpareGrants: names taken one after another each get an etcd lease
// of their own (a name its holder stops renewing expires alone), and a
// lease granted ahead that went stale is not handed out: every lease
// acquired has nearly its whole time to live left in etcd, whatever the
// pause before it.
func TestSpareGrants(t *testing.T) {
	c := etcdtest.Start(t, 1).Dial(t)
	l := etcdlease.New(c, etcdtest.Prefix())
	ids := map[int64]string{}
	for i, pause := range []time.Duration{0, 0, 3 * time.Second, 0, 2500 * time.Millisecond} {
		time.Sleep(pause)
		name := "session/" + string(rune('a'+i))
		le, err := l.Acquire(t.Context(), name, "me", 3*time.Second)
		require.NoError(t, err)
		require.NotContains(t, ids, le.ID, "%s shares its etcd lease with %s", name, ids[le.ID])
		ids[le.ID] = name
		ttl, err := c.TimeToLive(t.Context(), clientv3.LeaseID(le.ID))
		require.NoError(t, err)
		assert.GreaterOrEqual(t, ttl.TTL, int64(2), "%s after a pause of %s: %d s left of 3", name, pause, ttl.TTL)
		assert.WithinDuration(t, time.Now().Add(3*time.Second), le.Expires, 800*time.Millisecond, "what Acquire says is what etcd keeps")
	}
}
