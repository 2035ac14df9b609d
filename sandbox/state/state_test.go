package state_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/cellbox/cellbox/sandbox/state"
	"github.com/cellbox/cellbox/sandbox/state/statetest"
)

// TestMemoryStore runs the conformance suite on the in-memory store.
func TestMemoryStore(t *testing.T) {
	statetest.Run(t, func(t *testing.T) (state.Store, func(*testing.T) state.Store) {
		return state.NewMemory(), nil
	})
}

// TestBoltStore runs the conformance suite on OpenBolt's store, in a bbolt
// file it shares with other state (as cellbox run and serve share it with
// the cell store), reopened over the same open file.
func TestBoltStore(t *testing.T) {
	statetest.Run(t, func(t *testing.T) (state.Store, func(*testing.T) state.Store) {
		db := openDB(t, filepath.Join(t.TempDir(), "cellbox.db"))
		open := func(t *testing.T) state.Store {
			s, err := state.OpenBolt(ctx, db)
			require.NoError(t, err)
			return s
		}
		return open(t), open
	})
}

func openDB(t *testing.T, path string) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoSync: true})
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db
}

var ctx = context.Background()

// TestOneProcessIgnoresFences: the stores of one process commit under
// fences as without them (no lease key of theirs to compare).
func TestOneProcessIgnoresFences(t *testing.T) {
	bs, err := state.OpenBolt(ctx, openDB(t, filepath.Join(t.TempDir(), "cellbox.db")))
	require.NoError(t, err)
	for _, s := range []state.Store{state.NewMemory(), bs} {
		fenced := state.WithFences(ctx, state.Fence{Key: "/no/such/lease", Rev: 7})
		_, err := s.Commit(fenced, state.Put(state.Sessions, "s-1", []byte("v")))
		require.NoError(t, err)
		r, err := s.Get(ctx, state.Sessions, "s-1")
		require.NoError(t, err)
		require.Equal(t, "v", string(r.Value))
	}
}
