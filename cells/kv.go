package cells

import (
	"slices"
	"sync"
)

// kv is the ordered key/value layer both stores share: named buckets of
// byte keys in order, in transactions. A writable transaction is exclusive.
type kv interface {
	begin(writable bool) (kvTx, error)
	close() error
}

type kvTx interface {
	// bucket returns the named bucket, creating it in a writable
	// transaction; in a read-only one a missing bucket reads as empty.
	bucket(name string) (kvBucket, error)
	commit() error
	rollback()
}

// kvBucket values returned by get and scan are valid only during the
// transaction and must not be modified. put keeps v: do not reuse it. get
// and put take a string key: the memory store keys its maps by string, and
// the cells bucket, read and written once per changed cell, has its key as
// one (a []byte would cost a copy per call).
type kvBucket interface {
	get(k string) []byte
	put(k string, v []byte) error
	del(k []byte) error
	// scan calls fn for each key >= from in order until fn returns false.
	scan(from []byte, fn func(k, v []byte) bool)
}

// emptyBucket is a missing bucket in a read-only transaction.
type emptyBucket struct{}

func (emptyBucket) get(string) []byte                   { return nil }
func (emptyBucket) put(string, []byte) error            { return ErrReadOnly }
func (emptyBucket) del([]byte) error                    { return ErrReadOnly }
func (emptyBucket) scan([]byte, func(k, v []byte) bool) {}

// memKV is the in-memory kv: a map per bucket plus a sorted key slice for
// scans, with an undo log for rollback.
type memKV struct {
	mu      sync.RWMutex
	buckets map[string]*memBucket
	// spare is the undo log's array, kept (emptied) for the next writable
	// transaction: a batch writing thousands of cells would otherwise grow
	// a new one, by doubling, on every commit. Guarded by mu (writers).
	spare []memUndo
}

func newMemKV() *memKV { return &memKV{buckets: map[string]*memBucket{}} }

func (m *memKV) close() error { return nil }

func (m *memKV) begin(writable bool) (kvTx, error) {
	if writable {
		m.mu.Lock()
	} else {
		m.mu.RLock()
	}
	t := &memTx{kv: m, writable: writable}
	if writable {
		t.undo, m.spare = m.spare, nil
	}
	return t, nil
}

type memTx struct {
	kv       *memKV
	writable bool
	done     bool
	undo     []memUndo
}

type memUndo struct {
	b       *memBucket
	key     string
	old     []byte
	existed bool
}

func (t *memTx) bucket(name string) (kvBucket, error) {
	b := t.kv.buckets[name]
	if b == nil {
		if !t.writable {
			return emptyBucket{}, nil
		}
		b = &memBucket{m: map[string][]byte{}}
		t.kv.buckets[name] = b
	}
	return &memTxBucket{t: t, b: b}, nil
}

func (t *memTx) commit() error {
	t.end()
	return nil
}

func (t *memTx) rollback() {
	if t.done {
		return
	}
	for i := len(t.undo) - 1; i >= 0; i-- {
		u := t.undo[i]
		if u.existed {
			u.b.set(u.key, u.old)
		} else {
			u.b.remove(u.key)
		}
	}
	t.end()
}

func (t *memTx) end() {
	if t.done {
		return
	}
	t.done = true
	if t.writable {
		clear(t.undo) // let old values be collected
		t.kv.spare, t.undo = t.undo[:0], nil
		t.kv.mu.Unlock()
	} else {
		t.kv.mu.RUnlock()
	}
}

type memTxBucket struct {
	t *memTx
	b *memBucket
}

func (tb *memTxBucket) get(k string) []byte { return tb.b.m[k] }

func (tb *memTxBucket) put(key string, v []byte) error {
	if !tb.t.writable {
		return ErrReadOnly
	}
	old, existed := tb.b.m[key]
	tb.t.undo = append(tb.t.undo, memUndo{tb.b, key, old, existed})
	tb.b.store(key, v, existed)
	return nil
}

func (tb *memTxBucket) del(k []byte) error {
	if !tb.t.writable {
		return ErrReadOnly
	}
	key := string(k)
	old, existed := tb.b.m[key]
	if !existed {
		return nil
	}
	tb.t.undo = append(tb.t.undo, memUndo{tb.b, key, old, true})
	tb.b.remove(key)
	return nil
}

func (tb *memTxBucket) scan(from []byte, fn func(k, v []byte) bool) { tb.b.scan(from, fn) }

// memBucket keeps keys[head:] sorted when !dirty. Appending in order
// (the change log) and deleting from the front (its compaction) stay O(1);
// anything else marks the slice dirty and the next scan rebuilds it.
type memBucket struct {
	sortMu sync.Mutex // readers may rebuild keys concurrently
	m      map[string][]byte
	keys   []string
	head   int
	dirty  bool
}

func (b *memBucket) set(k string, v []byte) {
	_, existed := b.m[k]
	b.store(k, v, existed)
}

// store is set for a caller that has looked k up already.
func (b *memBucket) store(k string, v []byte, existed bool) {
	if !existed {
		if n := len(b.keys); n > b.head && b.keys[n-1] >= k {
			b.dirty = true
		}
		b.keys = append(b.keys, k)
	}
	b.m[k] = v
}

func (b *memBucket) remove(k string) {
	if _, ok := b.m[k]; !ok {
		return
	}
	delete(b.m, k)
	if !b.dirty && b.head < len(b.keys) && b.keys[b.head] == k {
		b.keys[b.head] = ""
		b.head++
		if b.head > 1024 && b.head > len(b.keys)/2 {
			b.keys = append([]string(nil), b.keys[b.head:]...)
			b.head = 0
		}
		return
	}
	b.dirty = true
}

func (b *memBucket) scan(from []byte, fn func(k, v []byte) bool) {
	b.sortMu.Lock()
	if b.dirty {
		keys := make([]string, 0, len(b.m))
		for k := range b.m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b.keys, b.head, b.dirty = keys, 0, false
	}
	keys := b.keys[b.head:]
	b.sortMu.Unlock()
	i, _ := slices.BinarySearch(keys, string(from))
	for ; i < len(keys); i++ {
		if !fn([]byte(keys[i]), b.m[keys[i]]) {
			return
		}
	}
}
