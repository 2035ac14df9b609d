package state_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/cellbox/cellbox/sandbox/state"
)

// schema1 is a state file as the sandbox service wrote it before package
// state (schema 1): top-level buckets of raw values, meta with the schema
// and the instance id.
var schema1 = map[string]map[string]string{
	"meta":     {"schema": "1", "instance": "0123456789ab"},
	"sessions": {"s-1": `{"id":"s-1","token_hash":"ab","boxes":{"default":"cb-1"}}`, "s-2": `{"id":"s-2"}`},
	"boxes":    {"cb-1": `{"id":"cb-1","session":"s-1","previews":{"8080":"p-1"}}`},
	"snapshots": {
		"snap-1": `{"id":"snap-1","session":"s-1"}`,
		"snap-2": `{"id":"snap-2","session":"s-2"}`,
	},
	"snapshot_files": {"snap-1": `[{"p":"a","t":48}]`, "snap-2": `[]`},
	// Another store's bucket in the same file (the cell store's).
	"cells": {"default/p/x": "\x00\x01cell"},
}

func writeBuckets(t *testing.T, db *bolt.DB, buckets map[string]map[string]string) {
	t.Helper()
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		for name, kv := range buckets {
			b, err := tx.CreateBucketIfNotExists([]byte(name))
			if err != nil {
				return err
			}
			for k, v := range kv {
				if err := b.Put([]byte(k), []byte(v)); err != nil {
					return err
				}
			}
		}
		return nil
	}))
}

// topLevel returns the names of db's top-level buckets.
func topLevel(t *testing.T, db *bolt.DB) []string {
	t.Helper()
	var out []string
	require.NoError(t, db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
			out = append(out, string(name))
			return nil
		})
	}))
	return out
}

// TestBoltMigratesSchema1: a file of schema 1 opens with every record
// (snapshot_files as SnapshotManifests) byte for byte, each with a
// revision of its own, and its instance id; the old buckets are gone, the
// schema is 2 (which a cellbox of schema 1 refuses), other stores' buckets
// are untouched, and a second open migrates nothing again.
func TestBoltMigratesSchema1(t *testing.T) {
	db := openDB(t, filepath.Join(t.TempDir(), "cellbox.db"))
	writeBuckets(t, db, schema1)

	st, err := state.OpenBolt(ctx, db)
	require.NoError(t, err)
	id, err := st.Instance(ctx)
	require.NoError(t, err)
	assert.Equal(t, "0123456789ab", id)
	kinds := map[string]state.Kind{"sessions": state.Sessions, "boxes": state.Boxes, "snapshots": state.Snapshots, "snapshot_files": state.SnapshotManifests}
	listAll := func(st state.Store) map[state.Kind][]state.Record {
		out := map[state.Kind][]state.Record{}
		for _, kind := range kinds {
			rs, err := st.List(ctx, kind, "")
			require.NoError(t, err)
			out[kind] = rs
		}
		return out
	}
	migrated := listAll(st)
	revs := map[uint64]bool{}
	var last uint64
	for bucket, kind := range kinds {
		got := map[string]string{}
		for _, r := range migrated[kind] {
			got[r.Key] = string(r.Value)
			assert.NotZero(t, r.Revision)
			assert.False(t, revs[r.Revision], "each record a revision of its own")
			revs[r.Revision], last = true, max(last, r.Revision)
		}
		assert.Equal(t, schema1[bucket], got, "%s, as %s", bucket, kind)
	}
	assert.Len(t, revs, 7)
	rev, err := st.Commit(ctx, state.Put(state.Previews, "p", nil))
	require.NoError(t, err)
	assert.Greater(t, rev, last, "revisions go on after the migrated ones")

	assert.ElementsMatch(t, []string{"meta", "records", "reservations", "cells"}, topLevel(t, db), "the old buckets are gone")
	require.NoError(t, db.View(func(tx *bolt.Tx) error {
		assert.Equal(t, "2", string(tx.Bucket([]byte("meta")).Get([]byte("schema"))))
		assert.Equal(t, "\x00\x01cell", string(tx.Bucket([]byte("cells")).Get([]byte("default/p/x"))), "another store's bucket")
		return nil
	}))

	require.NoError(t, st.Close())
	st, err = state.OpenBolt(ctx, db)
	require.NoError(t, err)
	assert.Equal(t, migrated, listAll(st), "a second open migrates nothing again")
}

// TestBoltMigratesPartialSchema1: a schema 1 file from before snapshots
// existed (no snapshot buckets) opens too.
func TestBoltMigratesPartialSchema1(t *testing.T) {
	db := openDB(t, filepath.Join(t.TempDir(), "cellbox.db"))
	writeBuckets(t, db, map[string]map[string]string{
		"meta":     {"schema": "1", "instance": "aaaaaaaaaaaa"},
		"sessions": {"s-1": `{"id":"s-1"}`},
		"boxes":    {},
	})
	st, err := state.OpenBolt(ctx, db)
	require.NoError(t, err)
	r, err := st.Get(ctx, state.Sessions, "s-1")
	require.NoError(t, err)
	assert.Equal(t, `{"id":"s-1"}`, string(r.Value))
	rs, err := st.List(ctx, state.Snapshots, "")
	require.NoError(t, err)
	assert.Empty(t, rs)
}

// TestBoltRefusesOtherSchemas: a file of a newer (or unreadable) schema is
// refused, and left as it was.
func TestBoltRefusesOtherSchemas(t *testing.T) {
	for _, schema := range []string{"3", "x", "0"} {
		path := filepath.Join(t.TempDir(), "cellbox.db")
		db := openDB(t, path)
		writeBuckets(t, db, map[string]map[string]string{
			"meta":     {"schema": schema, "instance": "0123456789ab"},
			"sessions": {"s-1": `{"id":"s-1"}`},
		})
		before := topLevel(t, db)
		_, err := state.OpenBolt(ctx, db)
		require.Error(t, err, schema)
		assert.Contains(t, err.Error(), "upgrade cellbox", schema)
		assert.Equal(t, before, topLevel(t, db), schema)
		require.NoError(t, db.View(func(tx *bolt.Tx) error {
			assert.Equal(t, schema, string(tx.Bucket([]byte("meta")).Get([]byte("schema"))))
			return nil
		}))
	}
}

// TestBoltWritesNothingForNothing: reading, a commit of no ops, reserving
// what is held and releasing what is not leave the file as it was: no
// write transaction (and its sync) for nothing.
func TestBoltWritesNothingForNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cellbox.db")
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	defer db.Close()
	st, err := state.OpenBolt(ctx, db)
	require.NoError(t, err)
	_, err = st.Commit(ctx, state.Put(state.Boxes, "b", []byte("v")))
	require.NoError(t, err)
	require.NoError(t, st.Reserve(ctx, "boxes", "b", 1))
	before, err := os.ReadFile(path)
	require.NoError(t, err)

	_, err = st.Commit(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Reserve(ctx, "boxes", "b", 1))
	require.NoError(t, st.Release(ctx, "boxes", "nobody"))
	require.NoError(t, st.Release(ctx, "never", "nobody"))
	_, err = st.Get(ctx, state.Boxes, "b")
	require.NoError(t, err)
	_, err = st.List(ctx, state.Boxes, "")
	require.NoError(t, err)
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(before, after), "the file changed")
}

// TestBoltCloseLeavesDB: the store's Close leaves the shared DB open for
// its other users.
func TestBoltCloseLeavesDB(t *testing.T) {
	db := openDB(t, filepath.Join(t.TempDir(), "cellbox.db"))
	st, err := state.OpenBolt(ctx, db)
	require.NoError(t, err)
	require.NoError(t, st.Close())
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists([]byte("cells"))
		return err
	}), "the DB is still open")
}

// TestOpenBoltWritesOnlyWhatIsNew: a state file set up before opens
// without a commit (the file's bytes stay as they were, and its instance
// id with them); a new one is set up once.
func TestOpenBoltWritesOnlyWhatIsNew(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	open := func() string {
		db, err := bolt.Open(path, 0o600, nil)
		require.NoError(t, err)
		st, err := state.OpenBolt(t.Context(), db)
		require.NoError(t, err)
		id, err := st.Instance(t.Context())
		require.NoError(t, err)
		require.NoError(t, st.Close())
		require.NoError(t, db.Close())
		return id
	}
	first := open()
	before, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, first, open(), "the instance id stays")
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(before, after), "opening a state file set up before wrote to it")
}
