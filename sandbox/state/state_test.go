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
