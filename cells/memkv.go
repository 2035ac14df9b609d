package cells

import (
	"context"
	"errors"
	"slices"
	"sync"
)

// memKV is the in-memory KV (NewMemory): a map per bucket plus a sorted
// key slice for scans, with an undo log for rollback. One writable
// transaction runs at a time, and no read-only one while it does, so it
// never conflicts. Its values are not copied: it keeps what Put is given
// and Get returns its own.
type memKV struct {
	mu      sync.RWMutex
	rev     *revision // changed with mu held for writing
	buckets map[string]*memBucket
	// spare is the undo log's array, kept (emptied) for the next writable
	// transaction: a batch writing thousands of cells would otherwise grow
	// a new one, by doubling, on every commit. Guarded by mu (writers).
	spare []memUndo
}

func newMemKV() *memKV { return &memKV{rev: newRevision(0), buckets: map[string]*memBucket{}} }

func (m *memKV) Close() error {
	m.rev.close()
	return nil
}

func (m *memKV) Revision() uint64 { return m.rev.load() }

func (m *memKV) Wait(ctx context.Context, after uint64) (uint64, error) {
	return m.rev.wait(ctx, after)
}

func (m *memKV) Begin(ctx context.Context, writable bool) (KVTx, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if m.rev.isClosed() {
		return nil, ErrClosed
	}
	if writable {
		m.mu.Lock()
	} else {
		m.mu.RLock()
	}
	t := &memTx{kv: m, writable: writable, rev: m.rev.load()}
	if writable {
		t.undo, m.spare = m.spare, nil
	}
	return t, nil
}

type memTx struct {
	kv       *memKV
	writable bool
	done     bool
	rev      uint64
	undo     []memUndo
}

func (t *memTx) Revision() uint64 { return t.rev }

// memUndo undoes one write: an entry put for the first time is removed,
// any other gets its old value back, in the map again if it was deleted.
type memUndo struct {
	b     *memBucket
	key   string
	e     *memEntry
	old   []byte
	added bool
}

func (t *memTx) Bucket(name string) (KVBucket, error) {
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

func (t *memTx) Commit(_ context.Context, versioned bool) (uint64, error) {
	if t.done || !t.writable {
		return 0, errors.New("commit of a transaction that is not open for writing")
	}
	if versioned {
		t.rev++
		t.kv.rev.set(t.rev)
	}
	t.end()
	return t.rev, nil
}

func (t *memTx) Rollback() {
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

func (tb *memTxBucket) Get(_ context.Context, k string) ([]byte, error) {
	e := tb.b.m[k]
	if e == nil {
		return nil, nil
	}
	if tb.t.writable {
		tb.lastKey, tb.last, tb.lastGen = k, e, tb.b.removals
	}
	return e.v, nil
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

func (tb *memTxBucket) Put(key string, v []byte) error {
	if !tb.t.writable {
		return ErrReadOnly
	}
	if key == "" {
		return errEmptyKey
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

func (tb *memTxBucket) Delete(key string) error {
	if !tb.t.writable {
		return ErrReadOnly
	}
	e := tb.b.m[key]
	if e == nil {
		return nil
	}
	tb.t.undo = append(tb.t.undo, memUndo{b: tb.b, key: key, e: e, old: e.v})
	tb.b.remove(key)
	return nil
}

func (tb *memTxBucket) Scan(_ context.Context, from, to string, fn func(k string, v []byte) bool) error {
	tb.b.scan(from, to, fn)
	return nil
}

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

func (b *memBucket) scan(from, to string, fn func(k string, v []byte) bool) {
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
	i, _ := slices.BinarySearch(keys, from)
	for ; i < len(keys) && (to == "" || keys[i] < to); i++ {
		if !fn(keys[i], b.m[keys[i]].v) {
			return
		}
	}
}
