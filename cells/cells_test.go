package cells

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// backend opens a fresh store of one implementation, for the tests of
// what both share below the Store contract (whose tests are the
// conformance suite, cellstest, run by conformance_test.go).
type backend struct {
	name string
	open func(t *testing.T, opts Options) Store
}

func backends() []backend {
	return []backend{
		{"memory", func(t *testing.T, opts Options) Store {
			s := NewMemory(opts)
			t.Cleanup(func() { s.Close() })
			return s
		}},
		{"bolt", func(t *testing.T, opts Options) Store {
			s, err := OpenBolt(filepath.Join(t.TempDir(), "cells.db"), opts)
			require.NoError(t, err)
			t.Cleanup(func() { s.Close() })
			return s
		}},
	}
}

// each runs a test against both stores.
func each(t *testing.T, fn func(t *testing.T, b backend)) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) { fn(t, b) })
	}
}

func addr(name string) Address { return Address{"s", "p", name} }

func set(t *testing.T, s Store, name, value string) {
	t.Helper()
	require.NoError(t, s.Update(t.Context(), func(tx Tx) error {
		_, err := tx.Set(addr(name), json.RawMessage(value))
		return err
	}))
}

func TestAddress(t *testing.T) {
	for _, tc := range []struct {
		in, err string
	}{
		{"space/pat/name", ""},
		{"space/pat/node.run", ""},
		{"space/pat", "want space/pattern/name"},
		{"a/b/c/d", "want space/pattern/name"},
		{"a//c", "empty pattern"},
		{"/b/c", "empty space"},
	} {
		a, err := Parse(tc.in)
		if tc.err != "" {
			assert.ErrorContains(t, err, tc.err, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.in, a.String())
	}
	assert.ErrorContains(t, Address{"s", "p", "a/b"}.Valid(), `name "a/b" contains '/'`)
}

// TestLogBytes: the log's bookkeeping under LogBytes (what a watcher sees
// of it is cellstest's LogBytes): the oldest entries go once the entries
// pass the cap, the size is kept, the newest entry stays whatever its
// size, and a store from before the size was kept is counted once.
func TestLogBytes(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		s := b.open(t, Options{LogBytes: 1 << 20})
		big := func(c byte) string { return `"` + string(bytes.Repeat([]byte{c}, 300<<10)) + `"` }
		for i := range 10 {
			set(t, s, "a", big(byte('a'+i)))
		}
		logStart := func() (start, size uint64) {
			require.NoError(t, s.View(t.Context(), func(x Tx) error {
				b, err := x.(*tx).get(bucketInfo, keyLogStart)
				require.NoError(t, err)
				start = readU64(b)
				b, err = x.(*tx).get(bucketInfo, keyLogBytes)
				require.NoError(t, err)
				size = readU64(b)
				return nil
			}))
			return start, size
		}
		start, size := logStart()
		assert.Equal(t, uint64(8), start, "3 entries of 300 KiB pass 1 MiB: versions 8-10 stay")
		assert.LessOrEqual(t, size, uint64(1<<20))
		assert.Greater(t, size, uint64(600<<10))

		// A value larger than the cap stays as the newest entry.
		set(t, s, "a", `"`+string(bytes.Repeat([]byte{'z'}, 2<<20))+`"`)
		start, _ = logStart()
		assert.Equal(t, uint64(11), start)

		// A store from before the count: it is counted at the next commit.
		require.NoError(t, s.Update(t.Context(), func(x Tx) error {
			return x.(*tx).del(bucketInfo, keyLogBytes)
		}))
		set(t, s, "b", `1`)
		start, size = logStart()
		assert.Equal(t, uint64(12), start, "the 2 MiB entry was counted, and so dropped")
		assert.Less(t, size, uint64(100))
	})
}

func TestBoltLayout(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		prep func(tx *bolt.Tx) error
		err  string
	}{
		{"newer layout", func(tx *bolt.Tx) error {
			b, _ := tx.CreateBucketIfNotExists([]byte(bucketInfo))
			return b.Put([]byte(keyLayout), []byte("2"))
		}, "layout version 2, newer than this cellbox understands (1)"},
		{"not a cellbox store", func(tx *bolt.Tx) error {
			b, _ := tx.CreateBucketIfNotExists([]byte(bucketCells))
			return b.Put([]byte("x"), []byte("y"))
		}, "not a cellbox store"},
	} {
		path := filepath.Join(dir, tc.name+".db")
		db, err := bolt.Open(path, 0o600, nil)
		require.NoError(t, err)
		require.NoError(t, db.Update(tc.prep))
		require.NoError(t, db.Close())
		_, err = OpenBolt(path, Options{})
		assert.ErrorContains(t, err, tc.err, tc.name)
		assert.ErrorContains(t, err, path, tc.name)
	}
}

// A store over a shared bbolt file keeps to its buckets, tolerates other
// state's, and leaves the file open when it closes; reopened, it has its
func TestOpenBoltDBShared(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "cellbox.db"), 0o600, nil)
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte("sessions"))
		if err != nil {
			return err
		}
		return b.Put([]byte("s-1"), []byte(`{"id":"s-1"}`))
	}))
	a := Address{Space: "s", Pattern: "p", Name: "x"}
	s, err := OpenBoltDB(db, Options{})
	require.NoError(t, err)
	require.NoError(t, s.Update(t.Context(), func(tx Tx) error { _, err := tx.Set(a, json.RawMessage(`1`)); return err }))
	require.NoError(t, s.Close())

	require.NoError(t, db.View(func(tx *bolt.Tx) error {
		assert.Equal(t, `{"id":"s-1"}`, string(tx.Bucket([]byte("sessions")).Get([]byte("s-1"))), "the other state is untouched")
		return nil
	}), "the file is still open")
	s, err = OpenBoltDB(db, Options{})
	require.NoError(t, err)
	defer s.Close()
	c, err := s.Get(t.Context(), a)
	require.NoError(t, err)
	assert.Equal(t, "1", string(c.Value))
}

// A watch that meets an unreadable change log entry ends with a last batch
// that says why, instead of just closing.
func TestWatchEndsWithReason(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "cellbox.db"), 0o600, nil)
	require.NoError(t, err)
	defer db.Close()
	s, err := OpenBoltDB(db, Options{})
	require.NoError(t, err)
	defer s.Close()
	a := Address{Space: "s", Pattern: "p", Name: "x"}
	for _, v := range []string{`1`, `2`, `3`} {
		require.NoError(t, s.Update(t.Context(), func(tx Tx) error { _, err := tx.Set(a, json.RawMessage(v)); return err }))
	}
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(bucketLog)).Put(u64(2), []byte{0xff, 0xff, 0xff})
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch, err := s.Watch(ctx, "", 0)
	require.NoError(t, err)
	var got []Batch
	for b := range ch {
		got = append(got, b)
	}
	require.Len(t, got, 2, "version 1, then the reason")
	assert.Equal(t, uint64(1), got[0].Version)
	assert.NoError(t, got[0].Err)
	assert.Equal(t, uint64(1), got[1].Version, "the last version delivered")
	assert.Empty(t, got[1].Changes)
	require.Error(t, got[1].Err)
	assert.Contains(t, got[1].Err.Error(), `watch "" after version 1: change log entry 2:`)
}

// TestBoltUpdateWithoutWrites: a read-write transaction that writes
// nothing leaves the file alone (no commit and its sync: a run with
// nothing to do makes several), and one that writes commits as before.
func TestBoltUpdateWithoutWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cells.db")
	s, err := OpenBolt(path, Options{})
	require.NoError(t, err)
	defer s.Close()
	a := Address{Space: "s", Pattern: "p", Name: "a"}
	require.NoError(t, s.Update(t.Context(), func(tx Tx) error { _, err := tx.Set(a, json.RawMessage(`1`)); return err }))
	before, err := os.ReadFile(path)
	require.NoError(t, err)

	require.NoError(t, s.Update(t.Context(), func(tx Tx) error {
		_, err := tx.Get(a)
		_, _ = tx.Meta("m").Get("k")
		return err
	}))
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, before, after, "nothing written, nothing committed")

	require.NoError(t, s.Update(t.Context(), func(tx Tx) error { return tx.Meta("m").Put("k", []byte("v")) }))
	require.NoError(t, s.View(t.Context(), func(tx Tx) error {
		v, ok := tx.Meta("m").Get("k")
		assert.True(t, ok)
		assert.Equal(t, "v", string(v))
		return nil
	}))
}

// Reopening a settled store and declaring its cells again, schemas
// included, writes nothing (a run with nothing to do pays no sync), while
// a changed schema is still stored.
func TestBoltReopenAndRedeclareWithoutWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cells.db")
	a := Address{Space: "s", Pattern: "p", Name: "a"}
	b := Address{Space: "s", Pattern: "p", Name: "b"}
	schema := json.RawMessage(`{"type":"number"}`)
	declare := func(s Store, sch json.RawMessage) {
		require.NoError(t, s.Update(t.Context(), func(tx Tx) error {
			if err := tx.Declare(a, Spec{Schema: sch}); err != nil {
				return err
			}
			return tx.Declare(b, Spec{})
		}))
	}
	s, err := OpenBolt(path, Options{})
	require.NoError(t, err)
	declare(s, schema)
	require.NoError(t, s.Close())
	before, err := os.ReadFile(path)
	require.NoError(t, err)

	s, err = OpenBolt(path, Options{})
	require.NoError(t, err)
	declare(s, schema)
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, before, after, "reopened and declared again: nothing written")

	declare(s, json.RawMessage(`{"type":"string"}`))
	require.NoError(t, s.Update(t.Context(), func(tx Tx) error {
		_, err := tx.Set(a, json.RawMessage(`1`))
		var se *SchemaError
		assert.ErrorAs(t, err, &se, "the changed schema holds")
		return nil
	}))
	require.NoError(t, s.Close())
}

// compactValue's integer shortcut accepts exactly the integers json.Valid
// does and leaves everything else (bad JSON too) to the full check.
func TestCompactValueShortcut(t *testing.T) {
	for _, in := range []string{"0", "-0", "7", "-12", "1234567890123", "01", "-", "--1", "1-", "+1", "1.5", "1e3", "-01", " 1", "1 ", "", "0x1"} {
		t.Run(in, func(t *testing.T) {
			got, err := compactValue(json.RawMessage(in))
			if !json.Valid([]byte(in)) {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			var buf bytes.Buffer
			require.NoError(t, json.Compact(&buf, []byte(in)))
			assert.Equal(t, buf.String(), string(got))
		})
	}
}

// TestBoltLocked: only one process may have a store's file open: a second
// OpenBolt waits up to 2 seconds, then fails; once the first closes, it
// opens.
func TestBoltLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cells.db")
	s, err := OpenBolt(path, Options{})
	require.NoError(t, err)
	start := time.Now()
	_, err = OpenBolt(path, Options{})
	assert.ErrorContains(t, err, "open cell store "+path)
	assert.Greater(t, time.Since(start), 1500*time.Millisecond, "it waited (about 2 s)")
	require.NoError(t, s.Close())
	s, err = OpenBolt(path, Options{})
	require.NoError(t, err)
	require.NoError(t, s.Close())
}

// TestBoltLayoutV1: a file in layout 1, as the code before the KV
// contract wrote it (the store's version in "cellbox"/"version", which
// boltKV now keeps as its revision), opens with its version, cells and
// log, and its version goes on from there in the same key.
func TestBoltLayoutV1(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cells.db")
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	at := time.Unix(1700000000, 0).UnixNano()
	rec := func(v string, version uint64) []byte {
		r := record{version: version, changed: at, value: []byte(v)}
		return r.encode()
	}
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		put := func(bucket, k string, v []byte) {
			b, err := tx.CreateBucketIfNotExists([]byte(bucket))
			require.NoError(t, err)
			require.NoError(t, b.Put([]byte(k), v))
		}
		put(bucketInfo, keyLayout, []byte("1"))
		put(bucketInfo, keyVersion, u64(2))
		put(bucketInfo, keyLogStart, u64(1))
		put(bucketCells, "s/p/a", rec(`"two"`, 2))
		put(bucketLog, string(u64(1)), encodeLog(at, []logChange{{kind: changeCell, key: "s/p/a", rec: rec(`"one"`, 1)}}))
		put(bucketLog, string(u64(2)), encodeLog(at, []logChange{{kind: changeCell, key: "s/p/a", rec: rec(`"two"`, 2)}}))
		return nil
	}))
	require.NoError(t, db.Close())

	s, err := OpenBolt(path, Options{})
	require.NoError(t, err)
	assert.Equal(t, uint64(2), s.Version())
	c, err := s.Get(t.Context(), addr("a"))
	require.NoError(t, err)
	assert.Equal(t, `"two"`, string(c.Value))
	assert.Equal(t, uint64(2), c.Version)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	w, err := s.Watch(ctx, "", 0)
	require.NoError(t, err)
	for _, want := range []string{`"one"`, `"two"`} {
		b := <-w
		require.NoError(t, b.Err)
		assert.Equal(t, want, string(b.Changes[0].Cell.Value))
	}
	set(t, s, "a", `"three"`)
	assert.Equal(t, uint64(3), (<-w).Version)
	require.NoError(t, s.Close())

	db, err = bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.View(func(tx *bolt.Tx) error {
		assert.Equal(t, uint64(3), readU64(tx.Bucket([]byte(bucketInfo)).Get([]byte(keyVersion))), "the version, where it was")
		return nil
	}))
}
