package cells_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/cells/cellstest"
	"github.com/cellbox/cellbox/cells/kvtest"
)

// TestMemoryStore runs the conformance suite on the in-memory store.
func TestMemoryStore(t *testing.T) {
	cellstest.Run(t, func(t *testing.T, opts cells.Options) (cells.Store, func(*testing.T) cells.Store) {
		return cells.NewMemory(opts), nil
	})
}

// TestBoltStore runs the conformance suite on OpenBolt's store, reopened
// over the same file.
func TestBoltStore(t *testing.T) {
	cellstest.Run(t, func(t *testing.T, opts cells.Options) (cells.Store, func(*testing.T) cells.Store) {
		path := filepath.Join(t.TempDir(), "cells.db")
		open := func(t *testing.T) cells.Store {
			s, err := cells.OpenBolt(path, opts)
			require.NoError(t, err)
			return s
		}
		return open(t), open
	})
}

// TestBoltDBStore runs the conformance suite on OpenBoltDB's store, in a
// bbolt file it shares with other state (as the sandbox service's), and
// reopened over the same open file.
func TestBoltDBStore(t *testing.T) {
	cellstest.Run(t, func(t *testing.T, opts cells.Options) (cells.Store, func(*testing.T) cells.Store) {
		db, err := bolt.Open(filepath.Join(t.TempDir(), "cellbox.db"), 0o600, &bolt.Options{NoSync: true})
		require.NoError(t, err)
		t.Cleanup(func() { db.Close() })
		require.NoError(t, db.Update(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte("sessions"))
			if err != nil {
				return err
			}
			return b.Put([]byte("s-1"), []byte(`{"id":"s-1"}`))
		}))
		open := func(t *testing.T) cells.Store {
			s, err := cells.OpenBoltDB(db, opts)
			require.NoError(t, err)
			return s
		}
		return open(t), open
	})
}

// TestRemoteStore runs the conformance suite on a Store over kvtest's
// remote KV (values copied in and out, optimistic transactions that
// conflict, revisions from a counter), reopened over the same server:
// the KV contract holds no more than a remote store can give.
func TestRemoteStore(t *testing.T) {
	cellstest.Run(t, func(t *testing.T, opts cells.Options) (cells.Store, func(*testing.T) cells.Store) {
		srv := kvtest.NewServer()
		open := func(t *testing.T) cells.Store {
			s, err := cells.Open(t.Context(), srv.Client(), opts)
			require.NoError(t, err)
			return s
		}
		return open(t), open
	})
}
