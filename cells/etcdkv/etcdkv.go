// Package etcdkv is a cells.KV over etcd: the cell store of several
// cellbox servers that share one etcd cluster (cells.Open over it).
//
// Layout, under a prefix (default "/cellbox/cells/"):
//
//	PREFIX b/BUCKET \x00 KEY   a bucket's key (keys sort as the KV wants:
//	                           bytewise, bucket by bucket)
//	PREFIX rev                 the KV's revision: the count of versioned
//	                           commits, decimal
//	PREFIX del/BUCKET          touched by every commit that deletes in
//	                           BUCKET (see Commit)
//	PREFIX commit              touched by every commit: its mod revision
//	                           is the prefix's last commit's
//
// Every server keeps the whole prefix in memory: Open reads it once (a
// paged read at one etcd revision) and watches the prefix from there; the
// cache keeps each bucket key's latest value and mod revision, sorted per
// bucket, and a tombstone (the delete's revision) for a key deleted since.
// Its revision C is the etcd revision the watch has delivered up to.
// Memory: the cells, their change log and the Store's other buckets, as
// etcd holds them, on every server.
//
// A transaction's snapshot S is C when it begins (no request to etcd),
// once C has reached this KV's last commit (its transactions read their
// own commits). A commit goes into the cache at once when the cache had
// the prefix's commit before it (the commit key's mod revision, read in
// the commit): nothing else happened between. Else Begin waits for the
// watch to deliver it, or past a second takes S from one read of the rev
// key as before the cache, its reads then going to etcd. It reads a key from the cache when the key's entry is
// not newer than S (a tombstone: missing; no entry: missing), and a Scan
// page likewise when no entry in it is newer than S; what changed since S
// is read from etcd at S (a serializable read at that revision). The
// cache says "missing" only at snapshots from its floor on: the revision
// it was loaded at, raised as tombstones are dropped (those at or before
// every open transaction's snapshot, as the watch delivers). A watch that
// finds its revision compacted (cut off that long) loads the prefix again
// in place of the cache; a transaction of an older snapshot then reads
// from etcd what the cache cannot answer, and a snapshot etcd compacted is
// a conflict.
//
// Writes are buffered and committed in one etcd transaction guarded by
// what the transaction read, so transactions of any number of servers run
// at once and the one that commits second after reading what the first
// changed fails with cells.ErrConflict (a snapshot the cache had not
// brought up to date costs a conflict, no more; the next Begin waits for
// the cache to have the commit met, found by the commit key):
//
//   - a key it got: its mod revision is still the one it read (0: still
//     missing);
//   - a range it scanned: no key in it has a mod revision past the
//     snapshot (nothing put there since), and the bucket's del key has
//     none either (nothing deleted there since: a deleted key leaves no
//     mod revision to compare);
//   - a versioned commit: the rev key's mod revision is the snapshot's, so
//     two versioned commits at once conflict and revisions stay dense;
//   - a fenced one (cells.WithFence): the lease key's create revision is
//     the fence's, or the commit fails with cells.ErrFenced.
//
// etcd's own revision moves on every write of the cluster and so is not
// the cells' version (cells.KV says why); the rev key is.
//
// Limits (etcd's, not the contract's): a commit is one etcd request, so
// its puts, deletes (and the commit key's put) and guards are each at
// most the server's --max-txn-ops (128 by default: docs/cluster.md asks
// for 4096) and its bytes at most --max-request-bytes (1.5 MiB by default). A commit past
// either fails with an error saying which flag to raise; nothing of it is
// written. Every server of a prefix puts the commit key: one of a version
// from before it could commit unseen between the commit key's last put
// and a commit put into the cache at once.
package etcdkv

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/internal/etcdconn"
)

// DefaultPrefix is where Open keeps the cells when given no prefix.
const DefaultPrefix = "/cellbox/cells/"

// scanPage is how many keys a Scan (or a load of the prefix) reads from
// etcd at a time, and looks at in the cache at a time.
const scanPage = 512

// KV is a cells.KV over an etcd client. It does not own the client:
// Close stops its watch, and the caller closes the client.
type KV struct {
	c         *clientv3.Client
	prefix    string
	revKey    string
	commitKey string
	cache     *cache
	// beforeApply, when set (by tests), runs before the watch puts events
	// into the cache: a test holds the cache back with it.
	beforeApply atomic.Pointer[func()]

	// writer lets one writable transaction of this client run at a time:
	// this server's own writers would only conflict with each other on the
	// rev key (and run again); serialized, they conflict only with other
	// servers'. A channel, so that Begin can give up when its ctx ends.
	writer chan struct{}

	mu     sync.Mutex
	rev    uint64
	moved  chan struct{} // closed when rev moves or the KV closes
	closed bool
	stop   context.CancelFunc
}

// Open returns the KV of the cells under prefix ("" for DefaultPrefix)
// of c's cluster, reading all of it and watching it from then on.
func Open(ctx context.Context, c *clientv3.Client, prefix string) (*KV, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	k := &KV{c: c, prefix: prefix, revKey: prefix + "rev", commitKey: prefix + "commit", cache: newCache(),
		moved: make(chan struct{}), writer: make(chan struct{}, 1)}
	l, err := k.load(ctx)
	if err != nil {
		return nil, err
	}
	k.cache.swap(l)
	k.rev = l.revVal
	wctx, stop := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
	k.stop = stop
	go k.watch(wctx)
	return k, nil
}

// watch follows the prefix from the cache's revision on: every event
// goes into the cache, and the rev key's into Revision, so that Wait hears
// of other servers' commits. A watch that breaks (its member died, the
// leader was lost) is made again from the cache's revision; etcd replays
// what it missed, or, when it compacted that, says so and the prefix is
// loaded again (reload).
//
// C moves with the events only, not with progress notifications: in
// etcd 3.4 before its fix, a requested one is not ordered with the
// stream's events (etcd issue 15220), and a C past an event not in the
// cache would serve a stale read as a snapshot's. Nothing needs C past
// the prefix's last event: every commit of the KV puts a key of the
// prefix.
func (k *KV) watch(ctx context.Context) {
	for ctx.Err() == nil && k.c.Ctx().Err() == nil {
		wctx, cancel := context.WithCancel(ctx)
		compacted := false
		for wr := range k.c.Watch(wctx, k.prefix, clientv3.WithPrefix(), clientv3.WithRev(k.cache.revision()+1), clientv3.WithCreatedNotify()) {
			if wr.Created {
				k.cache.setCut(false)
			}
			if wr.CompactRevision != 0 {
				compacted = true
				break
			}
			if wr.Err() != nil {
				break // cancelled by the server (no leader): watch again
			}
			if len(wr.Events) > 0 {
				if h := k.beforeApply.Load(); h != nil {
					(*h)()
				}
				if v, ok := k.cache.apply(k.prefix, wr.Events); ok {
					k.set(v)
				}
			}
		}
		cancel()
		k.cache.setCut(true)
		if ctx.Err() != nil {
			return
		}
		if compacted {
			if err := k.reload(ctx); err == nil {
				continue
			}
		}
		select { // the cluster is unreachable, or has no leader: try again soon
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// reload loads the prefix again, at a fresh revision, in place of the
// cache: the watch's revision was compacted.
func (k *KV) reload(ctx context.Context) error {
	l, err := k.load(ctx)
	if err != nil {
		return err
	}
	k.cache.swap(l)
	k.set(l.revVal)
	return nil
}

func (k *KV) parseRev(kvs []*mvccpb.KeyValue) (uint64, error) {
	if len(kvs) == 0 {
		return 0, nil
	}
	v, err := strconv.ParseUint(string(kvs[0].Value), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("etcd: %s holds %q, not a revision: it is not cellbox's (use another --etcd-prefix)", k.revKey, kvs[0].Value)
	}
	return v, nil
}

func (k *KV) set(v uint64) {
	k.mu.Lock()
	if v > k.rev {
		k.rev = v
		close(k.moved)
		k.moved = make(chan struct{})
	}
	k.mu.Unlock()
}

// Revision implements cells.KV.
func (k *KV) Revision() uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.rev
}

// Wait implements cells.KV.
func (k *KV) Wait(ctx context.Context, after uint64) (uint64, error) {
	for {
		k.mu.Lock()
		v, moved, closed := k.rev, k.moved, k.closed
		k.mu.Unlock()
		switch {
		case v > after:
			return v, nil
		case closed:
			return v, cells.ErrClosed
		}
		select {
		case <-moved:
		case <-ctx.Done():
			return v, ctx.Err()
		}
	}
}

// Close implements cells.KV: it stops the watch; the client stays open.
func (k *KV) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.closed {
		k.closed = true
		close(k.moved)
		k.stop()
		k.cache.close()
	}
	return nil
}

// Begin implements cells.KV: the snapshot is the cache's revision, once
// it has reached this KV's last commit (or the commit a conflict met).
func (k *KV) Begin(ctx context.Context, writable bool) (cells.KVTx, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	k.mu.Lock()
	closed := k.closed
	k.mu.Unlock()
	if closed {
		return nil, cells.ErrClosed
	}
	if writable {
		select {
		case k.writer <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	t := &tx{kv: k, writable: writable}
	if err := k.snapshot(ctx, t); err != nil {
		t.end()
		return nil, err
	}
	t.held = true
	k.set(t.rev)
	if writable {
		t.got = map[string]int64{}
		t.writes = map[string]map[string]*write{}
	}
	return t, nil
}

// waitLimit is how long Begin waits for the cache to reach the revision
// it needs (a watch cut off, being made again) before it takes its
// snapshot from etcd instead.
var waitLimit = time.Second

// snapshot sets t's snapshot: the cache's, or, when the cache is behind
// for waitLimit, one read of the rev key's (as a Begin without the cache
// did: its reads then go to etcd until the cache has caught up).
func (k *KV) snapshot(ctx context.Context, t *tx) error {
	var timeout <-chan time.Time
	for {
		snap, rev, revMod, moved, closed, ok := k.cache.begin()
		switch {
		case ok:
			t.snap, t.rev, t.revMod = snap, rev, revMod
			return nil
		case closed:
			return cells.ErrClosed
		}
		if timeout == nil {
			tm := time.NewTimer(waitLimit)
			defer tm.Stop()
			timeout = tm.C
		}
		select {
		case <-moved:
		case <-timeout:
			return k.snapshotOfEtcd(ctx, t)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (k *KV) snapshotOfEtcd(ctx context.Context, t *tx) error {
	resp, err := k.c.Get(ctx, k.revKey)
	if err != nil {
		return fmt.Errorf("etcd: begin a transaction: %w", err)
	}
	rev, err := k.parseRev(resp.Kvs)
	if err != nil {
		return err
	}
	t.snap, t.rev = resp.Header.Revision, rev
	if len(resp.Kvs) > 0 {
		t.revMod = resp.Kvs[0].ModRevision
	}
	k.cache.hold(t.snap)
	return nil
}

// tx is a transaction: a snapshot (an etcd revision), what it read (for
// the guards of its commit) and what it wrote (sent at Commit).
type tx struct {
	kv       *KV
	writable bool
	done     bool
	held     bool   // snap is noted open in the cache (until end)
	snap     int64  // the etcd revision it reads
	rev      uint64 // the KV revision as of snap
	revMod   int64  // the rev key's mod revision as of snap (0: none)

	got     map[string]int64 // etcd key -> its mod revision as read
	scanned []keyRange
	buckets []string                     // scanned or deleted in, for the del guards
	writes  map[string]map[string]*write // bucket -> key -> write
}

type keyRange struct{ from, to string } // etcd keys; to "" for no end

type write struct {
	val []byte
	del bool
}

func (t *tx) Revision() uint64 { return t.rev }

func (t *tx) Bucket(name string) (cells.KVBucket, error) {
	if name == "" || strings.IndexByte(name, 0) >= 0 {
		return nil, fmt.Errorf("etcdkv: bucket name %q: want a non-empty name without NUL", name)
	}
	return &bucket{t: t, name: name, base: t.kv.prefix + "b/" + name + "\x00"}, nil
}

func (t *tx) Rollback() { t.end() }

// end ends the transaction, letting the next writable one begin and the
// cache drop the tombstones its snapshot kept.
func (t *tx) end() {
	if !t.done && t.writable {
		<-t.kv.writer
	}
	if !t.done && t.held {
		t.kv.cache.release(t.snap)
	}
	t.done = true
}

// delKey is the key every commit that deletes in bucket touches.
func (t *tx) delKey(bucket string) string { return t.kv.prefix + "del/" + bucket }

func (t *tx) Commit(ctx context.Context, versioned bool) (uint64, error) {
	if t.done {
		return 0, errors.New("etcdkv: commit of an ended transaction")
	}
	if !t.writable {
		t.end()
		return 0, cells.ErrReadOnly
	}
	defer t.end()
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	for key, mod := range t.got {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", mod))
	}
	for _, r := range t.scanned {
		c := clientv3.Compare(clientv3.ModRevision(r.from), "<", t.snap+1)
		cmps = append(cmps, c.WithRange(r.to))
	}
	deleted := map[string]bool{}
	for b, keys := range t.writes {
		base := t.kv.prefix + "b/" + b + "\x00"
		for key, w := range keys {
			if w.del {
				ops = append(ops, clientv3.OpDelete(base+key))
				deleted[b] = true
			} else {
				ops = append(ops, clientv3.OpPut(base+key, string(w.val)))
			}
		}
	}
	for b := range deleted {
		ops = append(ops, clientv3.OpPut(t.delKey(b), ""))
	}
	for _, b := range t.buckets {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(t.delKey(b)), "<", t.snap+1))
	}
	next := t.rev
	if versioned {
		next++
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(t.kv.revKey), "=", t.revMod))
		ops = append(ops, clientv3.OpPut(t.kv.revKey, strconv.FormatUint(next, 10)))
	}
	if len(ops) == 0 {
		return t.rev, nil
	}
	// The commit key: read first (the prefix's last commit before this
	// one: see own), then put.
	ops = append([]clientv3.Op{clientv3.OpGet(t.kv.commitKey, clientv3.WithKeysOnly())}, ops...)
	ops = append(ops, clientv3.OpPut(t.kv.commitKey, ""))
	fence, fenced := cells.FenceOf(ctx)
	var orElse []clientv3.Op
	if fenced {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(fence.Key), "=", fence.Rev))
		orElse = append(orElse, clientv3.OpGet(fence.Key, clientv3.WithKeysOnly()))
	}
	orElse = append(orElse, clientv3.OpGet(t.kv.commitKey, clientv3.WithKeysOnly()))
	resp, err := t.kv.c.Txn(ctx).If(cmps...).Then(ops...).Else(orElse...).Commit()
	if err != nil {
		return 0, explain(err, len(ops), len(cmps))
	}
	if !resp.Succeeded {
		if fenced {
			if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 0 || kvs[0].CreateRevision != fence.Rev {
				return 0, fmt.Errorf("etcdkv: %s: %w", fence.Key, cells.ErrFenced)
			}
		}
		// The next Begin waits for the cache to have the commit this one
		// met (the last of the prefix, by the commit key), so that the
		// Store's next attempt does not read what this one read.
		last := t.snap + 1
		if kvs := resp.Responses[len(resp.Responses)-1].GetResponseRange().Kvs; len(kvs) > 0 {
			last = max(last, kvs[0].ModRevision)
		}
		t.kv.cache.wantRev(last)
		return 0, fmt.Errorf("etcdkv: %w", cells.ErrConflict)
	}
	// The KV's transactions read their own commits: this one goes into
	// the cache now if the cache has every commit before it, else the next
	// Begin waits for the watch to bring it.
	var prev int64
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		prev = kvs[0].ModRevision
	}
	t.kv.cache.own(prev, resp.Header.Revision, t.writes, versioned, next)
	t.kv.cache.wantRev(resp.Header.Revision)
	if versioned {
		t.kv.set(next)
	}
	return next, nil
}

// explain says what to do about etcd's refusals of a commit too big.
func explain(err error, ops, cmps int) error {
	return etcdconn.Explain(fmt.Sprintf("commit of %d writes and %d guards", ops, cmps), err)
}

// snapGet reads at the transaction's snapshot, a revision the cluster
// has committed (the watch delivered it, or Begin read it linearizably):
// the member the client talks to answers it from what it has applied,
// without a round of the quorum (a serializable read), unless it has not
// applied that revision yet; it is asked again linearizably then.
func (k *KV) snapGet(ctx context.Context, snap int64, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	opts = append(opts, clientv3.WithRev(snap))
	resp, err := k.c.Get(ctx, key, append(opts, clientv3.WithSerializable())...)
	if errors.Is(err, rpctypes.ErrFutureRev) {
		resp, err = k.c.Get(ctx, key, opts...)
	}
	return resp, err
}

// readErr says what a failed read means: a snapshot etcd has compacted
// away is a conflict (the Store begins again on a newer one).
func readErr(err error) error {
	if errors.Is(err, rpctypes.ErrCompacted) {
		return fmt.Errorf("etcdkv: the transaction's snapshot was compacted: %w", cells.ErrConflict)
	}
	return fmt.Errorf("etcdkv: read: %w", err)
}

type bucket struct {
	t    *tx
	name string
	base string // the etcd prefix of its keys
}

func (b *bucket) Get(ctx context.Context, key string) ([]byte, error) {
	if w := b.t.writes[b.name][key]; w != nil {
		if w.del {
			return nil, nil
		}
		return w.val, nil
	}
	val, mod, ok := b.t.kv.cache.get(b.name, key, b.t.snap)
	if !ok { // changed since the snapshot: etcd has it as it was
		resp, err := b.t.kv.snapGet(ctx, b.t.snap, b.base+key)
		if err != nil {
			return nil, readErr(err)
		}
		if len(resp.Kvs) > 0 {
			mod, val = resp.Kvs[0].ModRevision, resp.Kvs[0].Value
			if val == nil {
				val = []byte{}
			}
		}
	}
	if b.t.writable {
		if _, ok := b.t.got[b.base+key]; !ok {
			b.t.got[b.base+key] = mod
		}
	}
	return val, nil
}

func (b *bucket) Put(key string, value []byte) error {
	if !b.t.writable {
		return cells.ErrReadOnly
	}
	if key == "" {
		return errors.New("etcdkv: put of an empty key")
	}
	b.keys()[key] = &write{val: value}
	return nil
}

func (b *bucket) Delete(key string) error {
	if !b.t.writable {
		return cells.ErrReadOnly
	}
	b.keys()[key] = &write{del: true}
	return nil
}

func (b *bucket) keys() map[string]*write {
	m := b.t.writes[b.name]
	if m == nil {
		m = map[string]*write{}
		b.t.writes[b.name] = m
	}
	return m
}

// Scan reads the range a page at a time at the snapshot, from the cache
// while it can answer (nothing in the page changed since the snapshot),
// else from etcd, and merges the transaction's own writes into it, in key
// order.
func (b *bucket) Scan(ctx context.Context, from, to string, fn func(string, []byte) bool) error {
	end := b.base + to
	if to == "" {
		end = clientv3.GetPrefixRangeEnd(b.base)
	}
	if b.t.writable {
		b.t.scanned = append(b.t.scanned, keyRange{b.base + from, end})
		if !slices.Contains(b.t.buckets, b.name) {
			b.t.buckets = append(b.t.buckets, b.name)
		}
	}
	// Own writes in the range, sorted: the bucket's writes do not change
	// during the scan (fn writes only to other buckets).
	var mine []string
	for k := range b.t.writes[b.name] {
		if k >= from && (to == "" || k < to) {
			mine = append(mine, k)
		}
	}
	slices.Sort(mine)
	emitMine := func(upTo string, all bool) bool {
		for len(mine) > 0 && (all || mine[0] < upTo) {
			k := mine[0]
			mine = mine[1:]
			if w := b.t.writes[b.name][k]; !w.del {
				if !fn(k, w.val) {
					return false
				}
			}
		}
		return true
	}
	start := from // the bucket's key the next page starts at
	cached := true
	var page []pair
	for {
		var next string // where the page after starts ("" for none)
		if cached {
			var ok bool
			page, next, ok = b.t.kv.cache.page(b.name, start, to, b.t.snap, page[:0])
			if !ok { // changed since the snapshot: etcd has it as it was
				cached = false
				continue
			}
		} else {
			resp, err := b.t.kv.snapGet(ctx, b.t.snap, b.base+start, clientv3.WithRange(end),
				clientv3.WithLimit(scanPage), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
			if err != nil {
				return readErr(err)
			}
			page = page[:0]
			for _, kv := range resp.Kvs {
				v := kv.Value
				if v == nil {
					v = []byte{}
				}
				page = append(page, pair{string(kv.Key[len(b.base):]), v})
			}
			if resp.More && len(page) > 0 {
				next = page[len(page)-1].key + "\x00"
			}
		}
		for _, p := range page {
			if !emitMine(p.key, false) {
				return nil
			}
			if _, ok := b.t.writes[b.name][p.key]; ok {
				continue // written by this transaction: emitted (or not, if deleted) from mine
			}
			if !fn(p.key, p.val) {
				return nil
			}
		}
		if next == "" {
			break
		}
		start = next
	}
	emitMine("", true)
	return nil
}
