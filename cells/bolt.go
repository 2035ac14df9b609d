package cells

import (
	"bytes"
	"context"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// OpenBolt opens (creating if needed) the bbolt store at path. It refuses a
// file written with a newer layout version than this build knows, and a
// bbolt file that is not a cellbox store. Only one process may have the file
// open: a second OpenBolt waits up to 2 seconds, then fails.
func OpenBolt(path string, opts Options) (Store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second, NoSync: opts.NoSync})
	if err != nil {
		return nil, fmt.Errorf("open cell store %s: %w", path, err)
	}
	k, err := newBoltKV(db, true)
	if err == nil {
		var s Store
		if s, err = open(context.Background(), k, opts); err == nil {
			return s, nil
		}
	}
	db.Close()
	return nil, fmt.Errorf("open cell store %s: %w", path, err)
}

// OpenBoltDB is OpenBolt over a bbolt file the caller has open and shares
// with other state (the sandbox service's sessions and boxes): the store
// keeps to its own buckets (see layout.go) and its Close leaves db open.
// opts.NoSync is the caller's to set on db.
func OpenBoltDB(db *bolt.DB, opts Options) (Store, error) {
	k, err := newBoltKV(db, false)
	if err == nil {
		var s Store
		if s, err = open(context.Background(), k, opts); err == nil {
			return s, nil
		}
	}
	return nil, fmt.Errorf("open cell store %s: %w", db.Path(), err)
}

// boltKV is the KV over a bbolt file: a bucket is a top-level bbolt
// bucket, made when a writable transaction first asks for it. bbolt runs one writable
// transaction at a time (Begin waits for it), so it never conflicts. Its
// revision is the "version" key of the "cellbox" bucket (layout.go), put
// by every versioned commit; only this process has the file open, so its
// commits are the only ones.
type boltKV struct {
	db    *bolt.DB
	owned bool // opened by OpenBolt, so closed with the store
	rev   *revision
}

func newBoltKV(db *bolt.DB, owned bool) (*boltKV, error) {
	var rev uint64
	err := db.View(func(tx *bolt.Tx) error {
		rev = boltRevision(tx)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &boltKV{db: db, owned: owned, rev: newRevision(rev)}, nil
}

// boltRevision reads the revision in a bbolt transaction.
func boltRevision(tx *bolt.Tx) uint64 {
	if b := tx.Bucket([]byte(bucketInfo)); b != nil {
		return readU64(b.Get([]byte(keyVersion)))
	}
	return 0
}

func (b *boltKV) Close() error {
	b.rev.close()
	if !b.owned {
		return nil
	}
	return b.db.Close()
}

func (b *boltKV) Revision() uint64 { return b.rev.load() }

func (b *boltKV) Wait(ctx context.Context, after uint64) (uint64, error) {
	return b.rev.wait(ctx, after)
}

func (b *boltKV) Begin(ctx context.Context, writable bool) (KVTx, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if b.rev.isClosed() {
		return nil, ErrClosed
	}
	tx, err := b.db.Begin(writable)
	if err != nil {
		return nil, err
	}
	return &boltTx{kv: b, tx: tx, rev: boltRevision(tx), buckets: map[string]KVBucket{}}, nil
}

type boltTx struct {
	kv      *boltKV
	tx      *bolt.Tx
	rev     uint64
	buckets map[string]KVBucket
}

func (t *boltTx) Revision() uint64 { return t.rev }

func (t *boltTx) Bucket(name string) (KVBucket, error) {
	if b, ok := t.buckets[name]; ok {
		return b, nil
	}
	var kb KVBucket
	if b := t.tx.Bucket([]byte(name)); b != nil {
		kb = boltBucket{b}
	} else if !t.tx.Writable() {
		kb = emptyBucket{}
	} else {
		b, err := t.tx.CreateBucket([]byte(name))
		if err != nil {
			return nil, fmt.Errorf("create bucket %q: %w", name, err)
		}
		kb = boltBucket{b}
	}
	t.buckets[name] = kb
	return kb, nil
}

func (t *boltTx) Commit(_ context.Context, versioned bool) (uint64, error) {
	rev := t.rev
	if versioned {
		rev++
		info, err := t.Bucket(bucketInfo)
		if err != nil {
			return 0, err
		}
		if err := info.Put(keyVersion, u64(rev)); err != nil {
			return 0, err
		}
	}
	if err := t.tx.Commit(); err != nil {
		return 0, err
	}
	t.kv.rev.set(rev)
	return rev, nil
}

func (t *boltTx) Rollback() { _ = t.tx.Rollback() }

type boltBucket struct{ b *bolt.Bucket }

func (b boltBucket) Get(_ context.Context, k string) ([]byte, error) { return b.b.Get([]byte(k)), nil }
func (b boltBucket) Put(k string, v []byte) error                    { return b.b.Put([]byte(k), v) }
func (b boltBucket) Delete(k string) error                           { return b.b.Delete([]byte(k)) }

func (b boltBucket) Scan(_ context.Context, from, to string, fn func(k string, v []byte) bool) error {
	end := []byte(to)
	c := b.b.Cursor()
	for k, v := c.Seek([]byte(from)); k != nil && (to == "" || bytes.Compare(k, end) < 0); k, v = c.Next() {
		if !fn(string(k), v) {
			return nil
		}
	}
	return nil
}

// NewMemory returns an in-memory store (for unit tests). It behaves as the
// bbolt store does (both pass cellstest), except that it keeps nothing past
// Close and a read waits while a write is in progress.
func NewMemory(opts Options) Store {
	s, err := open(context.Background(), newMemKV(), opts)
	if err != nil {
		panic("cells: in-memory store: " + err.Error()) // cannot happen: a new memory kv has no layout to refuse
	}
	return s
}
