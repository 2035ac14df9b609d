package cells

import (
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
	s, err := open(&boltKV{db: db, owned: true}, opts)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open cell store %s: %w", path, err)
	}
	return s, nil
}

// OpenBoltDB is OpenBolt over a bbolt file the caller has open and shares
// with other state (the sandbox service's sessions and boxes): the store
// keeps to its own buckets (see layout.go) and its Close leaves db open.
// opts.NoSync is the caller's to set on db.
func OpenBoltDB(db *bolt.DB, opts Options) (Store, error) {
	s, err := open(&boltKV{db: db}, opts)
	if err != nil {
		return nil, fmt.Errorf("open cell store %s: %w", db.Path(), err)
	}
	return s, nil
}

type boltKV struct {
	db    *bolt.DB
	owned bool // opened by OpenBolt, so closed with the store
}

func (b *boltKV) close() error {
	if !b.owned {
		return nil
	}
	return b.db.Close()
}

func (b *boltKV) begin(writable bool) (kvTx, error) {
	tx, err := b.db.Begin(writable)
	if err != nil {
		return nil, err
	}
	return &boltTx{tx: tx, buckets: map[string]kvBucket{}}, nil
}

type boltTx struct {
	tx      *bolt.Tx
	buckets map[string]kvBucket
}

func (t *boltTx) bucket(name string) (kvBucket, error) {
	if b, ok := t.buckets[name]; ok {
		return b, nil
	}
	var kb kvBucket
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

func (t *boltTx) commit() error { return t.tx.Commit() }
func (t *boltTx) rollback()     { _ = t.tx.Rollback() }

type boltBucket struct{ b *bolt.Bucket }

func (b boltBucket) get(k string) []byte          { return b.b.Get([]byte(k)) }
func (b boltBucket) put(k string, v []byte) error { return b.b.Put([]byte(k), v) }
func (b boltBucket) del(k []byte) error           { return b.b.Delete(k) }

func (b boltBucket) scan(from []byte, fn func(k, v []byte) bool) {
	c := b.b.Cursor()
	for k, v := c.Seek(from); k != nil; k, v = c.Next() {
		if !fn(k, v) {
			return
		}
	}
}

// NewMemory returns an in-memory store (for unit tests). It behaves as the
// bbolt store does (both pass cellstest), except that it keeps nothing past
// Close and a read waits while a write is in progress.
func NewMemory(opts Options) Store {
	s, err := open(newMemKV(), opts)
	if err != nil {
		panic("cells: in-memory store: " + err.Error()) // cannot happen: a new memory kv has no layout to refuse
	}
	return s
}
