package etcdlease_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellbox/cellbox/internal/etcdconn"
	"github.com/cellbox/cellbox/internal/etcdtest"
	"github.com/cellbox/cellbox/sandbox/lease"
	"github.com/cellbox/cellbox/sandbox/lease/etcdlease"
	"github.com/cellbox/cellbox/sandbox/lease/leasetest"
)

// TestLeaser runs the lease conformance suite on etcd's leases, each
// Leaser under a prefix of its own.
func TestLeaser(t *testing.T) {
	c := dial(t, startCluster(t, 1))
	var mu sync.Mutex
	n := 0
	leasetest.Run(t, func(t *testing.T) lease.Leaser {
		mu.Lock()
		n++
		defer mu.Unlock()
		return etcdlease.New(c, fmt.Sprintf("/t%d/", n))
	})
}

// TestHolderDies: a server that holds a lease and is cut off from etcd
// (its client closed, as when its process is killed) loses it when the
// time to live runs out, and a server on another member takes it with a
// greater token.
func TestHolderDies(t *testing.T) {
	cl := startCluster(t, 3)
	a := etcdlease.New(dial(t, cl), "")
	dying := dial(t, cl)
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

// startCluster starts etcd members that take what cellbox asks of them
// (docs/cluster.md: --max-request-bytes).
func startCluster(t *testing.T, members int, opts ...etcdtest.Option) *etcdtest.Cluster {
	opts = append([]etcdtest.Option{etcdtest.WithMaxRequestBytes(etcdconn.MaxRequestBytes)}, opts...)
	return etcdtest.Start(t, members, opts...)
}

// dial is a client of cl as a cellbox server makes it (etcdconn.Dial).
func dial(t *testing.T, cl *etcdtest.Cluster) *clientv3.Client {
	c, err := etcdconn.Dial(t.Context(), cl.Endpoints())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}
