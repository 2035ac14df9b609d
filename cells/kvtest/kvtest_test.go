package kvtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/cells/kvtest"
)

// The remote KV keeps the contract of cells.KV at its own level: the
// Store's tests (cellstest over it, in package cells) rely on it.

func begin(t *testing.T, kv cells.KV, writable bool) cells.KVTx {
	t.Helper()
	tx, err := kv.Begin(t.Context(), writable)
	require.NoError(t, err)
	t.Cleanup(tx.Rollback)
	return tx
}

func bucket(t *testing.T, tx cells.KVTx) cells.KVBucket {
	t.Helper()
	b, err := tx.Bucket("b")
	require.NoError(t, err)
	return b
}

func get(t *testing.T, tx cells.KVTx, key string) string {
	t.Helper()
	v, err := bucket(t, tx).Get(t.Context(), key)
	require.NoError(t, err)
	if v == nil {
		return "(none)"
	}
	return string(v)
}

func scan(t *testing.T, tx cells.KVTx, from, to string) []string {
	t.Helper()
	var out []string
	require.NoError(t, bucket(t, tx).Scan(t.Context(), from, to, func(k string, v []byte) bool {
		out = append(out, k+"="+string(v))
		return true
	}))
	return out
}

// put commits key=value (or a delete, for "") in a transaction of its own.
func put(t *testing.T, kv cells.KV, versioned bool, kvs ...string) uint64 {
	t.Helper()
	tx := begin(t, kv, true)
	for i := 0; i < len(kvs); i += 2 {
		if kvs[i+1] == "" {
			require.NoError(t, bucket(t, tx).Delete(kvs[i]))
		} else {
			require.NoError(t, bucket(t, tx).Put(kvs[i], []byte(kvs[i+1])))
		}
	}
	rev, err := tx.Commit(t.Context(), versioned)
	require.NoError(t, err)
	return rev
}

func TestSnapshotsAndOwnWrites(t *testing.T) {
	srv := kvtest.NewServer()
	a, b := srv.Client(), srv.Client()
	put(t, a, false, "k1", "1", "k3", "3")
	old := begin(t, b, false)
	put(t, a, false, "k1", "one", "k2", "2", "k3", "")
	put(t, a, false, "k1", "uno")
	assert.Equal(t, "1", get(t, old, "k1"), "a snapshot keeps its versions")
	assert.Equal(t, []string{"k1=1", "k3=3"}, scan(t, old, "", ""))
	now := begin(t, b, false)
	assert.Equal(t, []string{"k1=uno", "k2=2"}, scan(t, now, "", ""))

	w := begin(t, a, true)
	require.NoError(t, bucket(t, w).Put("k0", []byte("0")))
	require.NoError(t, bucket(t, w).Put("k2", []byte("two")))
	require.NoError(t, bucket(t, w).Delete("k1"))
	assert.Equal(t, "(none)", get(t, w, "k1"))
	assert.Equal(t, []string{"k0=0", "k2=two"}, scan(t, w, "", ""), "own writes, in order among the stored")
	assert.Equal(t, []string{"k2=two"}, scan(t, w, "k1", "k3"))
	assert.Equal(t, "uno", get(t, now, "k1"), "unseen before the commit")
	_, err := w.Commit(t.Context(), false)
	require.NoError(t, err)
	assert.Equal(t, []string{"k0=0", "k2=two"}, scan(t, begin(t, b, false), "", ""))

	ro := begin(t, b, false)
	assert.ErrorIs(t, bucket(t, ro).Put("x", []byte("y")), cells.ErrReadOnly)
}

func TestConflicts(t *testing.T) {
	for _, tc := range []struct {
		name      string
		read      func(t *testing.T, tx cells.KVTx)
		other     []string // committed by another client after the read
		versioned [2]bool  // this commit's, the other's
		conflict  bool
	}{
		{"key changed", func(t *testing.T, tx cells.KVTx) { get(t, tx, "k") }, []string{"k", "new"}, [2]bool{}, true},
		{"key deleted", func(t *testing.T, tx cells.KVTx) { get(t, tx, "k") }, []string{"k", ""}, [2]bool{}, true},
		{"missing key made", func(t *testing.T, tx cells.KVTx) { get(t, tx, "none") }, []string{"none", "1"}, [2]bool{}, true},
		{"other key", func(t *testing.T, tx cells.KVTx) { get(t, tx, "k") }, []string{"j", "1"}, [2]bool{}, false},
		{"key added in a range", func(t *testing.T, tx cells.KVTx) { scan(t, tx, "a", "m") }, []string{"c", "1"}, [2]bool{}, true},
		{"key added past a range", func(t *testing.T, tx cells.KVTx) { scan(t, tx, "a", "m") }, []string{"m", "1"}, [2]bool{}, false},
		{"key added in a range to the end", func(t *testing.T, tx cells.KVTx) { scan(t, tx, "k", "") }, []string{"z", "1"}, [2]bool{}, true},
		{"both versioned", func(*testing.T, cells.KVTx) {}, []string{"j", "1"}, [2]bool{true, true}, true},
		{"the other versioned", func(*testing.T, cells.KVTx) {}, []string{"j", "1"}, [2]bool{false, true}, false},
		{"this versioned", func(*testing.T, cells.KVTx) {}, []string{"j", "1"}, [2]bool{true, false}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := kvtest.NewServer()
			a, b := srv.Client(), srv.Client()
			put(t, a, true, "k", "0")
			tx := begin(t, a, true)
			tc.read(t, tx)
			require.NoError(t, bucket(t, tx).Put("w", []byte("mine")))
			put(t, b, tc.versioned[1], tc.other...)
			rev, err := tx.Commit(t.Context(), tc.versioned[0])
			if !tc.conflict {
				require.NoError(t, err)
				assert.Equal(t, "mine", get(t, begin(t, b, false), "w"))
				want := uint64(1)
				for _, v := range tc.versioned {
					if v {
						want++
					}
				}
				assert.Equal(t, want, b.Revision())
				if tc.versioned[0] {
					assert.Equal(t, want, rev)
				}
				return
			}
			require.ErrorIs(t, err, cells.ErrConflict)
			assert.Equal(t, "(none)", get(t, begin(t, b, false), "w"), "nothing written")
			assert.Equal(t, 1, srv.Stats().Conflicts)
		})
	}
}

func TestRevisions(t *testing.T) {
	srv := kvtest.NewServer()
	a, b := srv.Client(), srv.Client()
	assert.Equal(t, uint64(0), a.Revision())
	assert.Equal(t, uint64(1), put(t, a, true, "k", "1"))
	assert.Equal(t, uint64(1), put(t, a, false, "k", "2"), "a commit that is not versioned takes none")
	assert.Equal(t, uint64(2), put(t, b, true, "k", "3"), "the next, through every client")
	assert.Equal(t, uint64(2), begin(t, a, false).Revision())

	got := make(chan uint64, 1)
	go func() {
		rev, err := a.Wait(t.Context(), 2)
		assert.NoError(t, err)
		got <- rev
	}()
	put(t, b, false, "k", "4")
	select {
	case <-got:
		t.Fatal("Wait returned for a commit that took no revision")
	case <-time.After(50 * time.Millisecond):
	}
	put(t, b, true, "k", "5")
	select {
	case rev := <-got:
		assert.Equal(t, uint64(3), rev, "another client's commit wakes Wait")
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return")
	}
	rev, err := a.Wait(t.Context(), 1)
	assert.NoError(t, err)
	assert.Equal(t, uint64(3), rev, "at once when past")

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = a.Wait(ctx, 3)
	assert.ErrorIs(t, err, context.Canceled)
	require.NoError(t, a.Close())
	_, err = a.Wait(t.Context(), 3)
	assert.ErrorIs(t, err, cells.ErrClosed)
	_, err = a.Begin(t.Context(), false)
	assert.ErrorIs(t, err, cells.ErrClosed)
	assert.Equal(t, "5", get(t, begin(t, b, false), "k"), "the data stays")
}

// Values are copied in and out, and what a transaction handed out is
// overwritten when it ends.
func TestCopies(t *testing.T) {
	srv := kvtest.NewServer()
	kv := srv.Client()
	v := []byte("value")
	tx := begin(t, kv, true)
	require.NoError(t, bucket(t, tx).Put("k", v))
	copy(v, "XXXXX")
	_, err := tx.Commit(t.Context(), false)
	require.NoError(t, err)
	tx = begin(t, kv, false)
	got, err := bucket(t, tx).Get(t.Context(), "k")
	require.NoError(t, err)
	assert.Equal(t, "value", string(got))
	got[0] = 'V'
	assert.Equal(t, "value", get(t, tx, "k"))
	tx.Rollback()
	assert.NotEqual(t, "Value", string(got), "overwritten when the transaction ended")
}
