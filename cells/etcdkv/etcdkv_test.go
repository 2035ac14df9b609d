package etcdkv_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/cells/cellstest"
	"github.com/cellbox/cellbox/cells/etcdkv"
	"github.com/cellbox/cellbox/internal/etcdconn"
	"github.com/cellbox/cellbox/internal/etcdtest"
)

// prefixes hands each store of a test a prefix of its own on the one
// cluster the package's tests share.
var prefixes = make(chan int, 1)

func init() { prefixes <- 0 }

func nextPrefix() string {
	n := <-prefixes
	prefixes <- n + 1
	return fmt.Sprintf("/t%d/", n)
}

func open(t *testing.T, c *clientv3.Client, prefix string, opts cells.Options) cells.Store {
	t.Helper()
	kv, err := etcdkv.Open(t.Context(), c, prefix)
	require.NoError(t, err)
	s, err := cells.Open(t.Context(), kv, opts)
	require.NoError(t, err)
	return s
}

// TestStore runs the cells conformance suite on a Store over etcd,
// reopened over the same prefix.
func TestStore(t *testing.T) {
	c := dial(t, startCluster(t, 1))
	cellstest.Run(t, func(t *testing.T, opts cells.Options) (cells.Store, func(*testing.T) cells.Store) {
		prefix := nextPrefix()
		return open(t, c, prefix, opts), func(t *testing.T) cells.Store { return open(t, c, prefix, opts) }
	})
}

// TestTwoServersConflict: two Stores (two servers) over one prefix, each
// read-modify-writing one counter cell at once, lose no increment, and a
// watch on either sees every version of both.
func TestTwoServersConflict(t *testing.T) {
	cl := startCluster(t, 1)
	prefix := nextPrefix()
	a := open(t, dial(t, cl), prefix, cells.Options{})
	b := open(t, dial(t, cl), prefix, cells.Options{})
	defer a.Close()
	defer b.Close()
	n := cells.Address{Space: "s", Pattern: "p", Name: "n"}
	ctx := t.Context()
	w, err := b.Watch(ctx, "", 0)
	require.NoError(t, err)
	const each = 20
	errs := make(chan error, 2)
	for _, s := range []cells.Store{a, b} {
		go func() {
			for range each {
				err := s.Update(ctx, func(tx cells.Tx) error {
					v := 0
					if c, err := tx.Get(n); err == nil {
						fmt.Sscan(string(c.Value), &v)
					}
					_, err := tx.Set(n, json.RawMessage(fmt.Sprint(v+1)))
					return err
				})
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	c, err := a.Get(ctx, n)
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprint(2*each), string(c.Value), "no increment lost")
	var seen []uint64
	for len(seen) < 2*each {
		bt := <-w
		require.NoError(t, bt.Err)
		seen = append(seen, bt.Version)
	}
	for i, v := range seen {
		assert.Equal(t, uint64(i+1), v, "versions are dense and in order")
	}
}

// TestTooManyOps: a commit past the server's --max-txn-ops fails saying
// which flag to raise, and writes nothing.
func TestTooManyOps(t *testing.T) {
	cl := startCluster(t, 1, etcdtest.WithMaxTxnOps(128))
	s := open(t, dial(t, cl), nextPrefix(), cells.Options{})
	defer s.Close()
	err := s.Update(t.Context(), func(tx cells.Tx) error {
		for i := range 200 {
			if _, err := tx.Set(cells.Address{Space: "s", Pattern: "p", Name: fmt.Sprintf("c%d", i)}, json.RawMessage("1")); err != nil {
				return err
			}
		}
		return nil
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--max-txn-ops")
	require.NoError(t, s.View(t.Context(), func(tx cells.Tx) error {
		cs, err := tx.List("s/p/")
		assert.Empty(t, cs, "nothing of the refused commit was written")
		return err
	}))
}

// TestWaitHearsOtherServers: a Store's watch wakes for a commit another
// server made (through the rev key's etcd watch), with no write of its own.
func TestWaitHearsOtherServers(t *testing.T) {
	cl := startCluster(t, 1)
	prefix := nextPrefix()
	kv, err := etcdkv.Open(t.Context(), dial(t, cl), prefix)
	require.NoError(t, err)
	defer kv.Close()
	other := open(t, dial(t, cl), prefix, cells.Options{})
	defer other.Close()
	done := make(chan uint64, 1)
	go func() {
		v, _ := kv.Wait(context.Background(), 0)
		done <- v
	}()
	require.NoError(t, other.Update(t.Context(), func(tx cells.Tx) error {
		_, err := tx.Set(cells.Address{Space: "s", Pattern: "p", Name: "x"}, json.RawMessage("1"))
		return err
	}))
	assert.Equal(t, uint64(1), <-done)
	require.NoError(t, kv.Close())
	_, err = kv.Wait(context.Background(), 5)
	assert.True(t, errors.Is(err, cells.ErrClosed))
	_, err = kv.Begin(t.Context(), false)
	assert.True(t, errors.Is(err, cells.ErrClosed))
}

// TestForeignRevKey: a prefix whose rev key is not a number (another
// program's data) is refused with a clear error.
func TestForeignRevKey(t *testing.T) {
	c := dial(t, startCluster(t, 1))
	prefix := nextPrefix()
	_, err := c.Put(t.Context(), prefix+"rev", "hello")
	require.NoError(t, err)
	_, err = etcdkv.Open(t.Context(), c, prefix)
	require.Error(t, err)
	assert.True(t, strings.Contains(err.Error(), "not a revision"), err.Error())
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
