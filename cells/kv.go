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

// hintedBucket is a bucket that can find a key again without looking it
// up, through what it noted in a kvHint the last time (see Ref).
type hintedBucket interface {
	getHinted(k string, h *kvHint) []byte
}

// kvHint is where the memory kv found a key: its entry, valid while its
// bucket has removed nothing since (gen).
type kvHint struct {
	b   *memBucket
	e   *memEntry
	gen uint64
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

// memUndo undoes one write: an entry put for the first time is removed,
// any other gets its old value back, in the map again if it was deleted.
type memUndo struct {
	b     *memBucket
	key   string
	e     *memEntry
	old   []byte
	added bool
}

func (t *memTx) bucket(name string) (kvBucket, error) {
	b := t.kv.buckets[name]
	if b == nil {
		if !t.writable {
			return emptyBucket{}, nil
		}
		b = &memBucket{m: map[string]*memEntry{}}
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
		switch {
		case u.added:
			u.b.remove(u.key)
		case u.b.m[u.key] != u.e: // deleted
			u.e.v = u.old
			u.b.add(u.key, u.e)
		default:
			u.e.v = u.old
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

// memTxBucket remembers the entry of its last get: a cell write reads
// the cell's record and then puts the new one under the same key, which
// then costs no second hash and probe of a map of every cell.
type memTxBucket struct {
	t       *memTx
	b       *memBucket
	lastKey string
	last    *memEntry
	lastGen uint64 // b.removals when last was looked up
}

func (tb *memTxBucket) get(k string) []byte {
	e := tb.b.m[k]
	if e == nil {
		return nil
	}
	if tb.t.writable {
		tb.lastKey, tb.last, tb.lastGen = k, e, tb.b.removals
	}
	return e.v
}

func (tb *memTxBucket) getHinted(k string, h *kvHint) []byte {
	if h.b != tb.b || h.gen != tb.b.removals || h.e == nil {
		h.b, h.e, h.gen = tb.b, tb.b.m[k], tb.b.removals
	}
	if h.e == nil {
		return nil
	}
	if tb.t.writable {
		tb.lastKey, tb.last, tb.lastGen = k, h.e, tb.b.removals
	}
	return h.e.v
}

func (tb *memTxBucket) put(key string, v []byte) error {
	if !tb.t.writable {
		return ErrReadOnly
	}
	e := tb.last
	if e == nil || tb.lastGen != tb.b.removals || tb.lastKey != key {
		e = tb.b.m[key]
	}
	if e == nil {
		tb.t.undo = append(tb.t.undo, memUndo{b: tb.b, key: key, added: true})
		tb.b.add(key, &memEntry{v: v})
		return nil
	}
	tb.t.undo = append(tb.t.undo, memUndo{b: tb.b, key: key, e: e, old: e.v})
	e.v = v
	return nil
}

func (tb *memTxBucket) del(k []byte) error {
	if !tb.t.writable {
		return ErrReadOnly
	}
	key := string(k)
	e := tb.b.m[key]
	if e == nil {
		return nil
	}
	tb.t.undo = append(tb.t.undo, memUndo{b: tb.b, key: key, e: e, old: e.v})
	tb.b.remove(key)
	return nil
}

func (tb *memTxBucket) scan(from []byte, fn func(k, v []byte) bool) { tb.b.scan(from, fn) }

// memBucket keeps keys[head:] sorted when !dirty. Appending in order
// (the change log) and deleting from the front (its compaction) stay O(1);
// anything else marks the slice dirty and the next scan rebuilds it.
// Values live in entries, so a put of an existing key changes its entry in
// place, without a map write.
type memBucket struct {
	sortMu   sync.Mutex // readers may rebuild keys concurrently
	m        map[string]*memEntry
	keys     []string
	head     int
	dirty    bool
	removals uint64 // counts removes: a remembered entry may be stale
}

type memEntry struct{ v []byte }

// add inserts an entry under a key that has none.
func (b *memBucket) add(k string, e *memEntry) {
	if n := len(b.keys); n > b.head && b.keys[n-1] >= k {
		b.dirty = true
	}
	b.keys = append(b.keys, k)
	b.m[k] = e
}

func (b *memBucket) remove(k string) {
	if _, ok := b.m[k]; !ok {
		return
	}
	delete(b.m, k)
	b.removals++
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
		if !fn([]byte(keys[i]), b.m[keys[i]].v) {
			return
		}
	}
}
