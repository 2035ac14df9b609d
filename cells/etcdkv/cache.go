package etcdkv

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// cache is the KV's copy of every bucket key under its prefix, as of an
// etcd revision (rev), kept current by the watch of the prefix (see the
// package comment: which reads it serves and why that is a snapshot).
//
// Keys are kept sorted per bucket in a slice, not in a btree: the module
// has no btree among its requirements (adding one is a change of go.mod
// for one use), and a bucket's slice is cheap where the Store writes: the
// change log appends its new entries at the end and trims from the front,
// and a new cell moves the keys of its own bucket only.
type cache struct {
	mu sync.RWMutex
	// rev is the etcd revision the cache is complete through: every
	// event of the prefix up to it is in, none after.
	rev int64
	// floor: the cache knows every delete after it (a tombstone each),
	// none at or before it (the load was at floor; tombstones up to floor
	// were pruned). A key it has no entry for is missing at a snapshot at
	// or after floor; at an older one it may have been there.
	floor   int64
	buckets map[string]*cbucket
	revVal  uint64 // the rev key's value and mod revision as of rev
	revMod  int64
	dead    []tombstone   // the tombstones, in revision order
	open    map[int64]int // the snapshots of the open transactions: how many at each
	need    int64         // Begin waits until rev reaches it (the KV's own commits, a conflict's)
	moved   chan struct{} // closed when rev moves, or the KV closes
	closed  bool
	// cut: the watch is broken (its member lost the leader, the cluster is
	// out of reach) and not made again yet. Begin does not take the
	// cache's revision while it is set: a server cut off from etcd would
	// go on answering reads from a copy nothing updates.
	cut   bool
	loads int // times the prefix was loaded (Open's, and each reload)
}

// cbucket is a bucket's keys: each key's latest value and mod revision,
// and tombstones (val nil) for the keys deleted since the floor.
type cbucket struct {
	m    map[string]entry
	keys []string // the keys of m, sorted
}

type entry struct {
	val []byte // nil: deleted at mod (a tombstone)
	mod int64
}

type tombstone struct {
	b   *cbucket
	key string
	rev int64
}

type pair struct {
	key string
	val []byte
}

func newCache() *cache {
	return &cache{buckets: map[string]*cbucket{}, open: map[int64]int{}, moved: make(chan struct{})}
}

// set puts key's entry (a value, or a tombstone when val is nil).
func (c *cache) set(bucket, key string, val []byte, mod int64) {
	b := c.buckets[bucket]
	if b == nil {
		b = &cbucket{m: map[string]entry{}}
		c.buckets[bucket] = b
	}
	if _, ok := b.m[key]; !ok {
		if n := len(b.keys); n == 0 || b.keys[n-1] < key {
			b.keys = append(b.keys, key)
		} else {
			i := sort.SearchStrings(b.keys, key)
			b.keys = slices.Insert(b.keys, i, key)
		}
	}
	b.m[key] = entry{val: val, mod: mod}
	if val == nil {
		c.dead = append(c.dead, tombstone{b, key, mod})
	}
}

// remove drops key's entry.
func (b *cbucket) remove(key string) {
	delete(b.m, key)
	i := sort.SearchStrings(b.keys, key)
	if i < len(b.keys) && b.keys[i] == key {
		if i == 0 {
			b.keys = b.keys[1:] // the log's trim: no move
		} else {
			b.keys = slices.Delete(b.keys, i, i+1)
		}
	}
}

// apply adds a watch response's events (whole etcd revisions, in order)
// and moves rev past them. It returns the rev key's value if they put it.
// Events the cache has (its rev is theirs or past: own put them in
// first) are skipped: the watch may bring an older own commit's after a
// newer one went in.
func (c *cache) apply(prefix string, evs []*clientv3.Event) (revVal uint64, revPut bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	had := c.rev
	for _, ev := range evs {
		kv := ev.Kv
		if kv.ModRevision <= had {
			continue
		}
		c.rev = max(c.rev, kv.ModRevision)
		key := string(kv.Key)
		if !strings.HasPrefix(key, prefix) {
			continue
		}
		rest := key[len(prefix):]
		switch {
		case rest == "rev":
			if ev.Type != clientv3.EventTypePut {
				continue
			}
			if v, err := strconv.ParseUint(string(kv.Value), 10, 64); err == nil {
				c.revVal, c.revMod = v, kv.ModRevision
				revVal, revPut = v, true
			}
		case strings.HasPrefix(rest, "b/"):
			bucket, k, ok := strings.Cut(rest[2:], "\x00")
			if !ok {
				continue
			}
			if ev.Type == clientv3.EventTypeDelete {
				c.set(bucket, k, nil, kv.ModRevision)
			} else {
				v := kv.Value
				if v == nil {
					v = []byte{}
				}
				c.set(bucket, k, v, kv.ModRevision)
			}
		}
	}
	c.prune()
	c.wake()
	return revVal, revPut
}

// prune drops the tombstones no open transaction needs: those at or
// before the oldest open snapshot (or rev, with none open), raising the
// floor to the last one dropped.
func (c *cache) prune() {
	bound := c.rev
	for s := range c.open {
		bound = min(bound, s)
	}
	n := 0
	for n < len(c.dead) && c.dead[n].rev <= bound {
		d := c.dead[n]
		if e, ok := d.b.m[d.key]; ok && e.val == nil && e.mod == d.rev {
			d.b.remove(d.key)
		}
		c.floor = max(c.floor, d.rev)
		n++
	}
	if n > 0 {
		clear(c.dead[:n])
		c.dead = c.dead[n:]
	}
}

// get answers a read of key at snapshot snap from the cache: ok false
// when it cannot (the key changed since snap, or snap is outside what the
// cache knows), and the caller reads etcd at snap. A missing key has mod 0.
func (c *cache) get(bucket, key string, snap int64) (val []byte, mod int64, ok bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if snap > c.rev {
		return nil, 0, false
	}
	var e entry
	var found bool
	if b := c.buckets[bucket]; b != nil {
		e, found = b.m[key]
	}
	switch {
	case !found:
		return nil, 0, snap >= c.floor
	case e.mod > snap:
		return nil, 0, false // changed since snap
	case e.val == nil:
		return nil, 0, true // deleted at or before snap
	}
	return e.val, e.mod, true
}

// own puts the KV's own commit, at rev, into the cache when the cache
// has the prefix's commit before it (prev, the commit key's mod revision
// as the commit read it, 0 for none) and not yet rev: then no event lies
// between, and the commit's writes are all of rev's events (the watch
// delivers them again, the same). It reports whether the cache has rev.
func (c *cache) own(prev, rev int64, writes map[string]map[string]*write, versioned bool, revVal uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rev >= rev {
		return true
	}
	if prev == 0 || c.rev < prev || c.closed {
		return false
	}
	for bucket, keys := range writes {
		for key, w := range keys {
			switch {
			case w.del:
				c.set(bucket, key, nil, rev)
			case w.val == nil:
				c.set(bucket, key, []byte{}, rev)
			default:
				c.set(bucket, key, w.val, rev)
			}
		}
	}
	if versioned {
		c.revVal, c.revMod = revVal, rev
	}
	c.rev = rev
	c.prune()
	c.wake()
	return true
}

// page answers a page of a Scan at snap from the cache: the live keys of
// [from, to) (to "" for no end) as of snap, in order, among the first
// scanPage entries there (tombstones count), and the key the next page
// starts at ("" for none: the range ends). ok false when it cannot (an
// entry of the page is newer than snap, or snap is outside what the cache
// knows).
func (c *cache) page(bucket, from, to string, snap int64, out []pair) (_ []pair, next string, ok bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if snap > c.rev || snap < c.floor {
		return out, "", false
	}
	b := c.buckets[bucket]
	if b == nil {
		return out, "", true
	}
	i := sort.SearchStrings(b.keys, from)
	for n := 0; i < len(b.keys); i, n = i+1, n+1 {
		k := b.keys[i]
		if to != "" && k >= to {
			break
		}
		if n == scanPage {
			return out, k, true
		}
		e := b.m[k]
		if e.mod > snap {
			return out, "", false
		}
		if e.val != nil {
			out = append(out, pair{k, e.val})
		}
	}
	return out, "", true
}

// begin takes the snapshot of a transaction: rev, once it has reached
// need. It returns ok false (and nothing taken) when it has not.
func (c *cache) begin() (snap int64, revVal uint64, revMod int64, moved <-chan struct{}, closed, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, 0, 0, nil, true, false
	}
	if c.rev < c.need || c.cut {
		return 0, 0, 0, c.moved, false, false
	}
	c.open[c.rev]++
	return c.rev, c.revVal, c.revMod, nil, false, true
}

// hold notes a snapshot taken from etcd (not the cache) as open.
func (c *cache) hold(snap int64) {
	c.mu.Lock()
	c.open[snap]++
	c.mu.Unlock()
}

// release notes a transaction at snap ended.
func (c *cache) release(snap int64) {
	c.mu.Lock()
	if c.open[snap]--; c.open[snap] <= 0 {
		delete(c.open, snap)
	}
	c.mu.Unlock()
}

// wantRev makes the next Begin wait until the cache has reached rev.
func (c *cache) wantRev(rev int64) {
	c.mu.Lock()
	c.need = max(c.need, rev)
	c.mu.Unlock()
}

func (c *cache) revision() int64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.rev
}

// setCut notes the watch broken (true) or made again (false).
func (c *cache) setCut(cut bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cut != cut {
		c.cut = cut
		c.wake()
	}
}

// wake tells the Begins waiting that rev moved.
func (c *cache) wake() {
	if !c.closed {
		close(c.moved)
		c.moved = make(chan struct{})
	}
}

func (c *cache) close() {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.moved)
	}
	c.mu.Unlock()
}

// loaded is the prefix as one read at an etcd revision found it.
type loaded struct {
	rev     int64
	buckets map[string]*cbucket
	revVal  uint64
	revMod  int64
}

// swap replaces the cache's keys with a load's (after a watch found its
// revision compacted). Transactions at older snapshots read what changed
// since theirs from etcd, and keys it has no entry for too (the floor).
// The revision is the load's even if the cache was past it (own put a
// commit made during the load in the keys the load replaces): the watch
// goes on from there, and snapshots past it read etcd meanwhile.
func (c *cache) swap(l *loaded) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rev = l.rev
	c.floor = l.rev
	c.buckets = l.buckets
	c.revVal, c.revMod = l.revVal, l.revMod
	clear(c.dead)
	c.dead = nil
	c.loads++
	c.wake()
}

// load reads every key of the prefix at one etcd revision, a page at a
// time: the first page's (a linearizable read), the others at it.
func (k *KV) load(ctx context.Context) (*loaded, error) {
	l := &loaded{buckets: map[string]*cbucket{}}
	c := &cache{buckets: l.buckets}
	start, end := k.prefix, clientv3.GetPrefixRangeEnd(k.prefix)
	opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(scanPage), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend)}
	for {
		var resp *clientv3.GetResponse
		var err error
		if l.rev == 0 {
			resp, err = k.c.Get(ctx, start, opts...)
		} else {
			resp, err = k.snapGet(ctx, l.rev, start, opts...)
		}
		if err != nil {
			return nil, fmt.Errorf("etcd: read the cells: %w", err)
		}
		if l.rev == 0 {
			l.rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			rest := string(kv.Key[len(k.prefix):])
			switch {
			case rest == "rev":
				v, err := k.parseRev([]*mvccpb.KeyValue{kv})
				if err != nil {
					return nil, err
				}
				l.revVal, l.revMod = v, kv.ModRevision
			case strings.HasPrefix(rest, "b/"):
				if bucket, key, ok := strings.Cut(rest[2:], "\x00"); ok {
					v := kv.Value
					if v == nil {
						v = []byte{}
					}
					c.set(bucket, key, v, kv.ModRevision)
				}
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return l, nil
		}
		start = string(kv0Next(resp.Kvs[len(resp.Kvs)-1].Key))
	}
}

// kv0Next is the least key after key.
func kv0Next(key []byte) []byte { return append(slices.Clone(key), 0) }
