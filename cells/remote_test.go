package cells_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/cells/kvtest"
)

// What a KV with several clients asks of the Store beyond cellstest, which
// runs one Store at a time: Stores over one remote KV (as servers over one
// etcd) share its data, its version sequence and its watches.

func openRemote(t *testing.T, srv *kvtest.Server) cells.Store {
	t.Helper()
	s, err := cells.Open(t.Context(), srv.Client(), cells.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// Two Stores over one KV: their read-modify-write Updates, at once, lose
// nothing (whatever conflicts they meet are retried: cellstest's
// InterleavedUpdates and TestUpdateConflictsBounded make sure of some),
// their commits take one sequence of versions, and a watch on either gets
// every commit of both, in order, whole.
func TestRemoteStoresShareData(t *testing.T) {
	srv := kvtest.NewServer()
	stores := []cells.Store{openRemote(t, srv), openRemote(t, srv)}
	n, m := cells.Address{Space: "s", Pattern: "p", Name: "n"}, cells.Address{Space: "s", Pattern: "p", Name: "m"}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var watches []<-chan cells.Batch
	for _, s := range stores {
		w, err := s.Watch(ctx, "", 0)
		require.NoError(t, err)
		watches = append(watches, w)
	}

	const perStore, each = 3, 15
	var wg sync.WaitGroup
	for _, s := range stores {
		for range perStore {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range each {
					err := s.Update(ctx, func(tx cells.Tx) error {
						v := 0
						if c, err := tx.Get(n); err == nil {
							v, _ = strconv.Atoi(string(c.Value))
						}
						next := json.RawMessage(strconv.Itoa(v + 1))
						if _, err := tx.Set(n, next); err != nil {
							return err
						}
						_, err := tx.Set(m, next)
						return err
					})
					if !assert.NoError(t, err) {
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	total := len(stores) * perStore * each
	for i, s := range stores {
		c, err := s.Get(ctx, n)
		require.NoError(t, err)
		assert.Equal(t, strconv.Itoa(total), string(c.Value), "store %d: no update lost", i)
		assert.Equal(t, uint64(total), s.Version(), "store %d: one sequence", i)
	}
	t.Logf("%d commits, %d conflicts retried", srv.Stats().Commits, srv.Stats().Conflicts)

	for i, w := range watches {
		for v := 1; v <= total; v++ {
			select {
			case b := <-w:
				require.NoError(t, b.Err)
				require.Equal(t, uint64(v), b.Version, "watch on store %d", i)
				require.Len(t, b.Changes, 2)
				assert.Equal(t, strconv.Itoa(v), string(b.Changes[0].Cell.Value))
				assert.Equal(t, strconv.Itoa(v), string(b.Changes[1].Cell.Value))
			case <-ctx.Done():
				t.Fatalf("watch on store %d: %d batches of %d", i, v-1, total)
			}
		}
	}

	// A commit of one wakes a watch on the other, waiting live.
	w, err := stores[1].Watch(ctx, "s/p/", stores[1].Version())
	require.NoError(t, err)
	require.NoError(t, stores[0].Update(ctx, func(tx cells.Tx) error {
		_, err := tx.Set(n, json.RawMessage(`"live"`))
		return err
	}))
	select {
	case b := <-w:
		assert.Equal(t, uint64(total+1), b.Version)
		assert.Equal(t, `"live"`, string(b.Changes[0].Cell.Value))
	case <-ctx.Done():
		t.Fatal("the other store's commit did not reach the watch")
	}
}

// An Update whose every commit meets a conflict (another Store commits
// what it read while its fn runs) runs fn again, up to a bound, then
// returns an error wrapping ErrConflict, having written nothing; an error
// of fn's own that wraps ErrConflict is not a conflict of the commit, and
// fn runs once.
func TestUpdateConflictsBounded(t *testing.T) {
	srv := kvtest.NewServer()
	a, b := openRemote(t, srv), openRemote(t, srv)
	x := cells.Address{Space: "s", Pattern: "p", Name: "x"}
	runs := 0
	err := a.Update(t.Context(), func(tx cells.Tx) error {
		runs++
		v, _ := tx.Meta("m").Get("k")
		require.NoError(t, b.Update(t.Context(), func(tx cells.Tx) error {
			return tx.Meta("m").Put("k", []byte(strconv.Itoa(runs)))
		}), "the other store commits what fn read")
		if _, err := tx.Set(x, json.RawMessage(`"lost"`)); err != nil {
			return err
		}
		return tx.Meta("m").Put("k", append(v, '+'))
	})
	require.ErrorIs(t, err, cells.ErrConflict)
	assert.Equal(t, 32, runs, "fn ran once per commit")
	assert.Equal(t, 32, srv.Stats().Conflicts)
	_, err = a.Get(t.Context(), x)
	assert.ErrorIs(t, err, cells.ErrNotFound, "nothing written")
	assert.Equal(t, uint64(0), a.Version())
	require.NoError(t, a.View(t.Context(), func(tx cells.Tx) error {
		v, _ := tx.Meta("m").Get("k")
		assert.Equal(t, "32", string(v), "the other store's writes stand")
		return nil
	}))

	runs = 0
	own := fmt.Errorf("fn's own: %w", cells.ErrConflict)
	err = a.Update(t.Context(), func(tx cells.Tx) error { runs++; return own })
	assert.Same(t, own, err)
	assert.Equal(t, 1, runs)

	// An Update whose context ends between its runs stops there.
	ctx, cancel := context.WithCancel(t.Context())
	runs = 0
	err = a.Update(ctx, func(tx cells.Tx) error {
		runs++
		tx.Meta("m").Get("k")
		require.NoError(t, b.Update(t.Context(), func(tx cells.Tx) error { return tx.Meta("m").Put("k", []byte("again")) }))
		cancel()
		return tx.Meta("m").Put("k", []byte("mine"))
	})
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, 1, runs)
}

// A failure of the KV in a call that cannot return it (Bucket.Get) fails
// the transaction: Update and View return it although fn returned nil,
// and nothing commits.
func TestKVFailureFailsTransaction(t *testing.T) {
	srv := kvtest.NewServer()
	s := openRemote(t, srv)
	x := cells.Address{Space: "s", Pattern: "p", Name: "x"}
	require.NoError(t, s.Update(t.Context(), func(tx cells.Tx) error { return tx.Meta("m").Put("k", []byte("v")) }))
	down := errors.New("connection refused")
	srv.FailReads(down)
	err := s.Update(t.Context(), func(tx cells.Tx) error {
		if _, ok := tx.Meta("m").Get("k"); ok {
			t.Error("a failed read found the key")
		}
		tx.Set(x, json.RawMessage(`1`)) // its error ignored
		return tx.Meta("m").Put("other", []byte("w"))
	})
	assert.ErrorIs(t, err, down, "Update")
	err = s.View(t.Context(), func(tx cells.Tx) error {
		tx.Meta("m").Get("k")
		return nil
	})
	assert.ErrorIs(t, err, down, "View")
	srv.FailReads(nil)
	_, err = s.Get(t.Context(), x)
	assert.ErrorIs(t, err, cells.ErrNotFound, "nothing committed")
	require.NoError(t, s.View(t.Context(), func(tx cells.Tx) error {
		_, ok := tx.Meta("m").Get("other")
		assert.False(t, ok, "nothing committed")
		return nil
	}))
	assert.Equal(t, uint64(0), s.Version())
}
