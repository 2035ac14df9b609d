package etcdkv_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/cells/cellstest"
	"github.com/cellbox/cellbox/cells/etcdkv"
	"github.com/cellbox/cellbox/internal/etcdtest"
)

// openKV opens the KV of prefix over c, closed when the test ends.
func openKV(t *testing.T, c *clientv3.Client, prefix string) *etcdkv.KV {
	t.Helper()
	kv, err := etcdkv.Open(t.Context(), c, prefix)
	require.NoError(t, err)
	t.Cleanup(func() { kv.Close() })
	return kv
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
	c := etcdtest.Start(t, 1).Dial(t)
	cellstest.Run(t, func(t *testing.T, opts cells.Options) (cells.Store, func(*testing.T) cells.Store) {
		prefix := etcdtest.Prefix()
		return open(t, c, prefix, opts), func(t *testing.T) cells.Store { return open(t, c, prefix, opts) }
	})
}

// TestTwoServersConflict: two Stores (two servers) over one prefix, each
// read-modify-writing one counter cell at once, lose no increment, and a
// watch on either sees every version of both.
func TestTwoServersConflict(t *testing.T) {
	cl := etcdtest.Start(t, 1)
	prefix := etcdtest.Prefix()
	a := open(t, cl.Dial(t), prefix, cells.Options{})
	b := open(t, cl.Dial(t), prefix, cells.Options{})
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
	var seen []uint64
	for len(seen) < 2*each {
		bt := <-w
		require.NoError(t, bt.Err)
		seen = append(seen, bt.Version)
	}
	// Read through b once its watch saw the last version: a read through
	// a server right after another's commit may miss it by the watch's
	// delay (docs/cluster.md), and a's may have been the last.
	c, err := b.Get(ctx, n)
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprint(2*each), string(c.Value), "no increment lost")
	for i, v := range seen {
		assert.Equal(t, uint64(i+1), v, "versions are dense and in order")
	}
}

// TestTooManyOps: a commit past the server's --max-txn-ops fails saying
// which flag to raise, and writes nothing.
func TestTooManyOps(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.WithMaxTxnOps(128))
	s := open(t, cl.Dial(t), etcdtest.Prefix(), cells.Options{})
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
	cl := etcdtest.Start(t, 1)
	prefix := etcdtest.Prefix()
	kv := openKV(t, cl.Dial(t), prefix)
	other := open(t, cl.Dial(t), prefix, cells.Options{})
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
	_, err := kv.Wait(context.Background(), 5)
	assert.True(t, errors.Is(err, cells.ErrClosed))
	_, err = kv.Begin(t.Context(), false)
	assert.True(t, errors.Is(err, cells.ErrClosed))
}

// TestForeignRevKey: a prefix whose rev key is not a number (another
// program's data) is refused with a clear error.
func TestForeignRevKey(t *testing.T) {
	c := etcdtest.Start(t, 1).Dial(t)
	prefix := etcdtest.Prefix()
	_, err := c.Put(t.Context(), prefix+"rev", "hello")
	require.NoError(t, err)
	_, err = etcdkv.Open(t.Context(), c, prefix)
	require.Error(t, err)
	assert.True(t, strings.Contains(err.Error(), "not a revision"), err.Error())
}

// TestLeaderKilledMidWrite: writers commit two cells together, through
// clients of every member, while the leader is killed. Each commit
// either succeeds or fails with an error (none hangs), no acknowledged
// write is lost, no commit is half there, and the versions a watch sees
// stay dense and in order.
func TestLeaderKilledMidWrite(t *testing.T) {
	cl := etcdtest.Start(t, 3)
	prefix := etcdtest.Prefix()
	st := open(t, cl.Dial(t), prefix, cells.Options{})
	defer st.Close()
	w, err := st.Watch(t.Context(), "", 0)
	require.NoError(t, err)

	const writers = 4
	acked := make([]int, writers)
	tried := make([]int, writers)
	failed := 0
	var mu sync.Mutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range writers {
		s := open(t, cl.Dial(t), prefix, cells.Options{})
		defer s.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 1; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				err := s.Update(ctx, func(tx cells.Tx) error {
					v := json.RawMessage(fmt.Sprint(n))
					if _, err := tx.Set(cells.Address{Space: "s", Pattern: "p", Name: fmt.Sprintf("x%d", i)}, v); err != nil {
						return err
					}
					_, err := tx.Set(cells.Address{Space: "s", Pattern: "p", Name: fmt.Sprintf("y%d", i)}, v)
					return err
				})
				cancel()
				mu.Lock()
				tried[i] = n
				if err == nil {
					acked[i] = n
				} else {
					failed++
					t.Logf("writer %d, write %d: %v", i, n, err)
				}
				mu.Unlock()
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	leader, err := cl.Leader(t.Context())
	require.NoError(t, err)
	cl.Member(leader).Kill()
	mu.Lock()
	atKill := acked[0] + acked[1] + acked[2] + acked[3]
	mu.Unlock()
	// Writes go on once a new leader is elected: wait until four more were
	// acknowledged (a loaded machine takes seconds to elect), with a
	// safety net.
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		mu.Lock()
		now := acked[0] + acked[1] + acked[2] + acked[3]
		mu.Unlock()
		if now >= atKill+4 {
			break
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("acknowledged %v of %v tried; %d failed", acked, tried, failed)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// What etcd holds, through a store opened now (it loads the prefix
	// at a linearizable read): st's copy may still lag the writers' last
	// commits while its watch, cut by the kill, is made again (a read
	// through another server lags by its watch: docs/cluster.md).
	fresh := open(t, cl.Dial(t), prefix, cells.Options{})
	defer fresh.Close()
	require.NoError(t, fresh.View(ctx, func(tx cells.Tx) error {
		for i := range writers {
			x, errx := tx.Get(cells.Address{Space: "s", Pattern: "p", Name: fmt.Sprintf("x%d", i)})
			y, erry := tx.Get(cells.Address{Space: "s", Pattern: "p", Name: fmt.Sprintf("y%d", i)})
			if errors.Is(errx, cells.ErrNotFound) {
				assert.Zero(t, acked[i], "writer %d: an acknowledged write is there", i)
				assert.ErrorIs(t, erry, cells.ErrNotFound, "writer %d: both cells of a commit, or neither", i)
				continue
			}
			require.NoError(t, errx)
			require.NoError(t, erry)
			assert.Equal(t, string(x.Value), string(y.Value), "writer %d: both cells of a commit, or neither", i)
			var n int
			fmt.Sscan(string(x.Value), &n)
			assert.GreaterOrEqual(t, n, acked[i], "writer %d: an acknowledged write is there", i)
			assert.LessOrEqual(t, n, tried[i])
		}
		return nil
	}))
	assert.Greater(t, acked[0]+acked[1]+acked[2]+acked[3], atKill, "writes went on after the leader was killed")
	last := uint64(0)
	for last < st.Version() {
		select {
		case b := <-w:
			require.NoError(t, b.Err)
			assert.Equal(t, last+1, b.Version, "dense versions")
			assert.Len(t, b.Changes, 2, "a commit is whole")
			last = b.Version
		case <-ctx.Done():
			t.Fatalf("the watch stopped at %d of %d", last, st.Version())
		}
	}
}

// TestFence: a commit under a fence goes through while the fence's key
// keeps its create revision, and fails with cells.ErrFenced, writing
// nothing and without running again, once the key was made anew (the
// lease is another holder's).
func TestFence(t *testing.T) {
	c := etcdtest.Start(t, 1).Dial(t)
	s := open(t, c, etcdtest.Prefix(), cells.Options{})
	defer s.Close()
	put, err := c.Put(t.Context(), "/lease/x", "a")
	require.NoError(t, err)
	fence := cells.Fence{Key: "/lease/x", Rev: put.Header.Revision}
	x := cells.Address{Space: "s", Pattern: "p", Name: "x"}
	runs := 0
	set := func(v string) error {
		return s.Update(cells.WithFence(t.Context(), fence), func(tx cells.Tx) error {
			runs++
			_, err := tx.Set(x, json.RawMessage(v))
			return err
		})
	}
	require.NoError(t, set(`1`), "the lease is the fence's")
	_, err = c.Delete(t.Context(), "/lease/x")
	require.NoError(t, err)
	_, err = c.Put(t.Context(), "/lease/x", "b")
	require.NoError(t, err)
	runs = 0
	err = set(`2`)
	require.ErrorIs(t, err, cells.ErrFenced)
	assert.Equal(t, 1, runs, "a fenced commit is not run again")
	got, err := s.Get(t.Context(), x)
	require.NoError(t, err)
	assert.JSONEq(t, `1`, string(got.Value), "nothing of the fenced commit was written")
	require.NoError(t, s.Update(t.Context(), func(tx cells.Tx) error {
		_, err := tx.Set(x, json.RawMessage(`3`))
		return err
	}), "a commit without a fence goes through")
}
