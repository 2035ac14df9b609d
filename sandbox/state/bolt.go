package state

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"
)

// The bbolt layout, schema 2. The file may hold other state beside it
// (cellbox run and serve keep the cell store in the same file: see
// cells/layout.go); these three top-level buckets are this package's.
//
//	"meta"          "schema"   -> decimal schema version ("2"); a file with
//	                              a higher one is refused
//	                "instance" -> the instance id (12 hex digits)
//	                "revision" -> uint64 BE: the last commit's revision
//	"records"       KIND (a bucket) -> key -> revision (uint64 BE) · value
//	"reservations"  COUNTER (a bucket) -> holder -> 0x01 (a counter's
//	                bucket goes with its last holder)
//
// Schema 1, the sandbox service's state before this package, had "meta"
// ("schema" "1", "instance") and the records' values, without revisions,
// in top-level buckets: "sessions", "boxes", "snapshots" and
// "snapshot_files" (the manifests). OpenBolt moves them into "records"
// ("snapshot_files" becomes SnapshotManifests), giving each record a
// revision of its own in bucket and key order, removes the old buckets and
// writes schema 2, all in one transaction: a file is either of schema 1
// or of schema 2, and a cellbox of schema 1 refuses a migrated file
// ("upgrade cellbox") rather than find it empty.
const boltSchema = 2

var (
	bucketMeta         = []byte("meta")
	bucketRecords      = []byte("records")
	bucketReservations = []byte("reservations")
	keySchema          = []byte("schema")
	keyInstance        = []byte("instance")
	keyRevision        = []byte("revision")
)

// schema1Buckets are the top-level buckets of schema 1 and their kinds.
var schema1Buckets = []struct {
	bucket string
	kind   Kind
}{
	{"sessions", Sessions},
	{"boxes", Boxes},
	{"snapshots", Snapshots},
	{"snapshot_files", SnapshotManifests},
}

// OpenBolt returns the store kept in db, an open bbolt file it may share
// with other state (it uses only the buckets of its layout, above): on the
// first open it makes its buckets and the instance id; a file the sandbox
// service wrote before this package (schema 1) is migrated in place; a file
// of a newer schema is refused. The store's Close leaves db open: db is the
// caller's, to close after the store. Every call is one bbolt transaction,
// so the DB's options (NoSync, timeouts) are the store's; a call checks its
// context once, before its transaction begins.
func OpenBolt(ctx context.Context, db *bolt.DB) (Store, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := &boltStore{db: db}
	// A file already set up opens without a write (a commit costs two
	// fdatasyncs: most of a `cellbox run --once` with nothing to do).
	if err := db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil || tx.Bucket(bucketRecords) == nil || tx.Bucket(bucketReservations) == nil ||
			string(meta.Get(keySchema)) != strconv.Itoa(boltSchema) {
			return nil
		}
		if v := meta.Get(keyInstance); v != nil {
			s.instance = string(v)
		}
		return nil
	}); err == nil && s.instance != "" {
		return s, nil
	}
	err := db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if _, err := tx.CreateBucketIfNotExists(bucketRecords); err != nil {
			return err
		}
		if _, err := tx.CreateBucketIfNotExists(bucketReservations); err != nil {
			return err
		}
		switch v := meta.Get(keySchema); {
		case v == nil: // a new file
		case string(v) == "1":
			if err := migrate1(tx); err != nil {
				return fmt.Errorf("migrate the state from schema 1 to %d: %w", boltSchema, err)
			}
		default:
			if n, err := strconv.Atoi(string(v)); err != nil || n != boltSchema {
				return fmt.Errorf("state file has schema version %q; this cellbox understands up to %d (upgrade cellbox)", v, boltSchema)
			}
		}
		if err := meta.Put(keySchema, []byte(strconv.Itoa(boltSchema))); err != nil {
			return err
		}
		if v := meta.Get(keyInstance); v != nil {
			s.instance = string(v)
			return nil
		}
		s.instance = newInstance()
		return meta.Put(keyInstance, []byte(s.instance))
	})
	if err != nil {
		return nil, fmt.Errorf("open the state in %s: %w", db.Path(), err)
	}
	return s, nil
}

// migrate1 moves schema 1's buckets into "records" (see the layout).
func migrate1(tx *bolt.Tx) error {
	meta, records := tx.Bucket(bucketMeta), tx.Bucket(bucketRecords)
	rev := getRevision(meta)
	for _, old := range schema1Buckets {
		src := tx.Bucket([]byte(old.bucket))
		if src == nil {
			continue
		}
		dst, err := records.CreateBucketIfNotExists([]byte(old.kind))
		if err != nil {
			return err
		}
		if err := src.ForEach(func(k, v []byte) error {
			rev++
			return dst.Put(k, encode(rev, v))
		}); err != nil {
			return fmt.Errorf("bucket %s: %w", old.bucket, err)
		}
		if err := tx.DeleteBucket([]byte(old.bucket)); err != nil {
			return err
		}
	}
	return putRevision(meta, rev)
}

type boltStore struct {
	db       *bolt.DB
	instance string
	closed   atomic.Bool
}

func getRevision(meta *bolt.Bucket) uint64 {
	if v := meta.Get(keyRevision); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func putRevision(meta *bolt.Bucket, rev uint64) error {
	return meta.Put(keyRevision, binary.BigEndian.AppendUint64(nil, rev))
}

// encode is a record as stored: its revision, then its value.
func encode(rev uint64, value []byte) []byte {
	return append(binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(value)), rev), value...)
}

// decode returns a stored record, its value copied out of the
// transaction's memory.
func decode(kind Kind, k, v []byte) (Record, error) {
	if len(v) < 8 {
		return Record{}, fmt.Errorf("%s %q: a stored record of %d bytes, shorter than its revision (the state file is damaged)", kind, k, len(v))
	}
	return Record{Key: string(k), Value: clone(v[8:]), Revision: binary.BigEndian.Uint64(v)}, nil
}

// revisionOf returns the revision of a stored record (0: none).
func revisionOf(b *bolt.Bucket, key string) uint64 {
	if b == nil {
		return 0
	}
	if v := b.Get([]byte(key)); len(v) >= 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

// begin fails if ctx is done or the store closed.
func (s *boltStore) begin(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return ErrClosed
	}
	return nil
}

func (s *boltStore) Instance(ctx context.Context) (string, error) {
	if err := s.begin(ctx); err != nil {
		return "", err
	}
	return s.instance, nil
}

func (s *boltStore) Get(ctx context.Context, kind Kind, key string) (Record, error) {
	if err := kind.Check(); err != nil {
		return Record{}, err
	}
	if err := CheckKey("key", key); err != nil {
		return Record{}, err
	}
	if err := s.begin(ctx); err != nil {
		return Record{}, err
	}
	var r Record
	err := s.db.View(func(tx *bolt.Tx) error {
		var v []byte
		if b := tx.Bucket(bucketRecords).Bucket([]byte(kind)); b != nil {
			v = b.Get([]byte(key))
		}
		if v == nil {
			return fmt.Errorf("%s %q: %w", kind, key, ErrNotFound)
		}
		var err error
		r, err = decode(kind, []byte(key), v)
		return err
	})
	return r, err
}

func (s *boltStore) List(ctx context.Context, kind Kind, prefix string) ([]Record, error) {
	if err := kind.Check(); err != nil {
		return nil, err
	}
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	out := []Record{}
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRecords).Bucket([]byte(kind))
		if b == nil {
			return nil
		}
		c := b.Cursor()
		p := []byte(prefix)
		for k, v := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, v = c.Next() {
			r, err := decode(kind, k, v)
			if err != nil {
				return err
			}
			out = append(out, r)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (s *boltStore) Commit(ctx context.Context, ops ...Op) (uint64, error) {
	if err := CheckOps(ops); err != nil {
		return 0, err
	}
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	if len(ops) == 0 {
		return 0, nil // no transaction (and its sync) for nothing
	}
	var rev uint64
	err := s.db.Update(func(tx *bolt.Tx) error {
		records := tx.Bucket(bucketRecords)
		for _, op := range ops {
			if !op.Guard {
				continue
			}
			if have := revisionOf(records.Bucket([]byte(op.Kind)), op.Key); have != op.Revision {
				return conflict(op, have)
			}
		}
		meta := tx.Bucket(bucketMeta)
		rev = getRevision(meta) + 1
		for _, op := range ops {
			if op.Delete {
				if b := records.Bucket([]byte(op.Kind)); b != nil {
					if err := b.Delete([]byte(op.Key)); err != nil {
						return err
					}
				}
				continue
			}
			b, err := records.CreateBucketIfNotExists([]byte(op.Kind))
			if err != nil {
				return err
			}
			if err := b.Put([]byte(op.Key), encode(rev, op.Value)); err != nil {
				return err
			}
		}
		return putRevision(meta, rev)
	})
	if err != nil {
		if !errors.Is(err, ErrConflict) {
			err = fmt.Errorf("write state: %w", err)
		}
		return 0, err
	}
	return rev, nil
}

func (s *boltStore) Reserve(ctx context.Context, counter, holder string, limit int) error {
	if err := checkReservation(counter, holder); err != nil {
		return err
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	if s.holds(counter, holder) {
		return nil // no write transaction (and its sync) to change nothing
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.Bucket(bucketReservations).CreateBucketIfNotExists([]byte(counter))
		if err != nil {
			return err
		}
		if b.Get([]byte(holder)) != nil {
			return nil
		}
		if n := count(b); n >= limit {
			return limitError(counter, n, limit)
		}
		return b.Put([]byte(holder), []byte{1}) // not empty: bbolt may read an empty value as nil
	})
}

// holds reports whether holder holds counter.
func (s *boltStore) holds(counter, holder string) bool {
	held := false
	s.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketReservations).Bucket([]byte(counter)); b != nil {
			held = b.Get([]byte(holder)) != nil
		}
		return nil
	})
	return held
}

// count returns the number of keys of b.
func count(b *bolt.Bucket) int {
	n := 0
	c := b.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		n++
	}
	return n
}

func (s *boltStore) Release(ctx context.Context, counter, holder string) error {
	if err := checkReservation(counter, holder); err != nil {
		return err
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	if !s.holds(counter, holder) {
		return nil
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		res := tx.Bucket(bucketReservations)
		b := res.Bucket([]byte(counter))
		if b == nil {
			return nil
		}
		if err := b.Delete([]byte(holder)); err != nil {
			return err
		}
		if k, _ := b.Cursor().First(); k == nil {
			return res.DeleteBucket([]byte(counter))
		}
		return nil
	})
}

func (s *boltStore) Holders(ctx context.Context, counter string) ([]string, error) {
	if err := CheckKey("counter", counter); err != nil {
		return nil, err
	}
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	out := []string{}
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketReservations).Bucket([]byte(counter))
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, _ []byte) error {
			out = append(out, string(k))
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Close marks the store closed; the DB stays open (it is the caller's).
func (s *boltStore) Close() error {
	s.closed.Store(true)
	return nil
}
