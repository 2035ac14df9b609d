package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/cellbox/cellbox/sandbox/state"
)

// schema1Buckets are the buckets a cellbox before package state kept its
// records in (schema 1), by the kind they are now.
var schema1Buckets = map[string]state.Kind{
	"sessions":       state.Sessions,
	"boxes":          state.Boxes,
	"snapshots":      state.Snapshots,
	"snapshot_files": state.SnapshotManifests,
}

// TestRestartOverStateOfSchema1: a data dir whose state file a cellbox
// before package state wrote (schema 1) serves on: its sessions, boxes
// (reattached, previews kept) and snapshots (listed, restored, deleted)
// are all there, under the same instance id, every record byte for byte.
func TestRestartOverStateOfSchema1(t *testing.T) {
	rb := newRealService(t, "local", func(cfg *Config) { cfg.BaseURL = "http://127.0.0.1:7077" })
	rb.sh("default", "echo kept > keep.txt")
	snap := rb.ok("snapshot", map[string]any{"label": "v1"})["id"].(string)
	rb.sh("default", "echo changed > keep.txt")
	rb.ok("sandbox_create", map[string]any{"sandbox": "second"})
	preview := rb.ok("browse", map[string]any{"port": 8080})["url"].(string)
	ids := map[string]string{"default": rb.id("default"), "second": rb.id("second")}
	instance := rb.s.st.instance

	cfg := rb.s.cfg
	require.NoError(t, rb.s.Close())
	records := rewriteAsSchema1(t, filepath.Join(cfg.DataDir, StateFile))
	require.Len(t, records["sessions"], 1)
	require.Len(t, records["boxes"], 2)
	require.Len(t, records["snapshots"], 1)
	require.Len(t, records["snapshot_files"], 1)

	s, err := New(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	rb.s = s
	assert.Equal(t, instance, s.st.instance, "the instance id (the backend boxes' label)")
	for bucket, kind := range schema1Buckets {
		rs, err := s.st.st.List(context.Background(), kind, "")
		require.NoError(t, err)
		got := map[string]string{}
		for _, r := range rs {
			got[r.Key] = string(r.Value)
		}
		assert.Equal(t, records[bucket], got, "%s, byte for byte", bucket)
	}

	assert.Equal(t, ids, map[string]string{"default": rb.id("default"), "second": rb.id("second")}, "the session's boxes")
	assert.Equal(t, "changed\n", rb.sh("default", "cat keep.txt"), "the box reattached, its files there")
	assert.Equal(t, preview, rb.ok("browse", map[string]any{"port": 8080})["url"], "the preview kept its id")
	list := rb.ok("snapshot_list", nil)["snapshots"].([]any)
	require.Len(t, list, 1)
	assert.Equal(t, snap, list[0].(map[string]any)["id"])
	assert.Equal(t, "v1", list[0].(map[string]any)["label"])
	rb.ok("restore", map[string]any{"snapshot": snap})
	assert.Equal(t, "kept\n", rb.sh("default", "cat keep.txt"), "restored from the old manifest")
	rb.ok("snapshot_delete", map[string]any{"snapshot": snap})
	assert.Empty(t, rb.ok("snapshot_list", nil)["snapshots"])
}

// rewriteAsSchema1 replaces the state file at path with the one a cellbox
// before package state would have written for the same state: meta with
// schema "1" and the instance id, and each record's JSON, as is, in the
// top-level bucket of its kind. It returns the records by bucket.
func rewriteAsSchema1(t *testing.T, path string) map[string]map[string]string {
	t.Helper()
	ctx := context.Background()
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	st, err := state.OpenBolt(ctx, db)
	require.NoError(t, err)
	instance, err := st.Instance(ctx)
	require.NoError(t, err)
	records := map[string]map[string]string{}
	for bucket, kind := range schema1Buckets {
		rs, err := st.List(ctx, kind, "")
		require.NoError(t, err)
		records[bucket] = map[string]string{}
		for _, r := range rs {
			records[bucket][r.Key] = string(r.Value)
		}
	}
	require.NoError(t, st.Close())
	require.NoError(t, db.Close())

	require.NoError(t, os.Remove(path))
	db, err = bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucket([]byte("meta"))
		if err != nil {
			return err
		}
		if err := meta.Put([]byte("schema"), []byte("1")); err != nil {
			return err
		}
		if err := meta.Put([]byte("instance"), []byte(instance)); err != nil {
			return err
		}
		for bucket, kv := range records {
			b, err := tx.CreateBucket([]byte(bucket))
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
	return records
}
