package etcdkv_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/cells/etcdkv"
	"github.com/cellbox/cellbox/internal/etcdconn"
	"github.com/cellbox/cellbox/internal/etcdtest"
)

// commit runs one writable transaction of kv on bucket "b": puts (a nil
// value deletes), versioned; again on a conflict, as the Store does (the
// KV's snapshot may not have another's last commit yet).
func commit(t *testing.T, kv cells.KV, puts map[string][]byte) uint64 {
	t.Helper()
	for range 10 {
		tx, err := kv.Begin(t.Context(), true)
		require.NoError(t, err)
		b, err := tx.Bucket("b")
		require.NoError(t, err)
		for k, v := range puts {
			if v == nil {
				require.NoError(t, b.Delete(k))
			} else {
				require.NoError(t, b.Put(k, v))
			}
		}
		rev, err := tx.Commit(t.Context(), true)
		if errors.Is(err, cells.ErrConflict) {
			continue
		}
		require.NoError(t, err)
		return rev
	}
	t.Fatal("10 conflicts in a row")
	return 0
}

// read returns what a transaction reads of keys and a scan of bucket "b":
// "k=v" each, "k-" for a missing key.
func read(t *testing.T, tx cells.KVTx, keys ...string) (got []string, scan []string) {
	t.Helper()
	b, err := tx.Bucket("b")
	require.NoError(t, err)
	for _, k := range keys {
		v, err := b.Get(t.Context(), k)
		require.NoError(t, err)
		if v == nil {
			got = append(got, k+"-")
		} else {
			got = append(got, k+"="+string(v))
		}
	}
	require.NoError(t, b.Scan(t.Context(), "", "", func(k string, v []byte) bool {
		scan = append(scan, k+"="+string(v))
		return true
	}))
	return got, scan
}

// waitRev waits until kv's revision reaches rev.
func waitRev(t *testing.T, kv cells.KV, rev uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err := kv.Wait(ctx, rev-1)
	require.NoError(t, err)
}

// countKV counts the reads (Get) and commits (Txn) a client sends.
type countKV struct {
	clientv3.KV
	gets, txns atomic.Int64
}

func (c *countKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	c.gets.Add(1)
	return c.KV.Get(ctx, key, opts...)
}

func (c *countKV) Txn(ctx context.Context) clientv3.Txn {
	c.txns.Add(1)
	return c.KV.Txn(ctx)
}

func counted(t *testing.T, cl *etcdtest.Cluster) (*clientv3.Client, *countKV) {
	c := cl.Dial(t)
	n := &countKV{KV: c.KV}
	c.KV = n
	return c, n
}

// TestSnapshotThroughCache: a transaction begun before another server's
// commit (a put, a delete, a new key in the range it scans) reads the
// keys as they were at its snapshot, though the cache has moved on; one
// begun after reads the commit.
func TestSnapshotThroughCache(t *testing.T) {
	cl := etcdtest.Start(t, 1)
	prefix := etcdtest.Prefix()
	a := openKV(t, cl.Dial(t), prefix)
	b := openKV(t, cl.Dial(t), prefix)

	rev := commit(t, a, map[string][]byte{"x": []byte("1"), "y": []byte("1"), "z": []byte("1")})
	old, err := a.Begin(t.Context(), false)
	require.NoError(t, err)
	defer old.Rollback()
	oldW, err := a.Begin(t.Context(), false)
	require.NoError(t, err)
	defer oldW.Rollback()
	// Read half of it now, half after: a scan of the old snapshot must not
	// depend on having been started before the cache moved.
	got, scan := read(t, old, "x")
	assert.Equal(t, []string{"x=1"}, got)
	assert.Equal(t, []string{"x=1", "y=1", "z=1"}, scan)

	rev = commit(t, b, map[string][]byte{"x": []byte("2"), "y": nil, "w": []byte("2")})
	waitRev(t, a, rev)

	got, scan = read(t, old, "x", "y", "w", "z")
	assert.Equal(t, []string{"x=1", "y=1", "w-", "z=1"}, got, "the old snapshot's keys")
	assert.Equal(t, []string{"x=1", "y=1", "z=1"}, scan, "the old snapshot's scan, over a newer delete and put")
	got, scan = read(t, oldW, "y", "w")
	assert.Equal(t, []string{"y=1", "w-"}, got, "the old snapshot's keys, first read after the commit")
	assert.Equal(t, []string{"x=1", "y=1", "z=1"}, scan)

	now, err := a.Begin(t.Context(), false)
	require.NoError(t, err)
	defer now.Rollback()
	assert.Equal(t, rev, now.Revision())
	got, scan = read(t, now, "x", "y", "w", "z")
	assert.Equal(t, []string{"x=2", "y-", "w=2", "z=1"}, got, "a new snapshot's keys")
	assert.Equal(t, []string{"w=2", "x=2", "z=1"}, scan, "a new snapshot's scan")
}

// TestReadYourWrites: a transaction begun as soon as the KV's own commit
// returned reads it (through a KV or a Store), though the watch may not
// have delivered it yet.
func TestReadYourWrites(t *testing.T) {
	cl := etcdtest.Start(t, 3) // the watch and the commits on different members
	prefix := etcdtest.Prefix()
	kv := openKV(t, cl.Dial(t), prefix)
	for i := range 30 {
		v := fmt.Sprint(i)
		rev := commit(t, kv, map[string][]byte{"x": []byte(v)})
		tx, err := kv.Begin(t.Context(), false)
		require.NoError(t, err)
		assert.Equal(t, rev, tx.Revision())
		got, _ := read(t, tx, "x")
		tx.Rollback()
		require.Equal(t, []string{"x=" + v}, got, "commit %d", i)
	}
	s := open(t, cl.Dial(t), etcdtest.Prefix(), cells.Options{})
	defer s.Close()
	writeThenRead(t, s, s, func() {})
}

// writeThenRead sets a cell through w thirty times, each time reading it
// back through r after heard() returns.
func writeThenRead(t *testing.T, w, r cells.Store, heard func()) {
	t.Helper()
	x := cells.Address{Space: "s", Pattern: "p", Name: "x"}
	for i := range 30 {
		require.NoError(t, w.Update(t.Context(), func(tx cells.Tx) error {
			_, err := tx.Set(x, json.RawMessage(fmt.Sprint(i)))
			return err
		}))
		heard()
		c, err := r.Get(t.Context(), x)
		require.NoError(t, err)
		require.Equal(t, fmt.Sprint(i), string(c.Value), "update %d", i)
	}
}

// TestOtherStoreSees: once a second Store (another server, another client)
// heard of a version (Wait), its reads have that version's cells.
func TestOtherStoreSees(t *testing.T) {
	cl := etcdtest.Start(t, 3)
	prefix := etcdtest.Prefix()
	a := open(t, cl.Dial(t), prefix, cells.Options{})
	defer a.Close()
	bkv, err := etcdkv.Open(t.Context(), cl.Dial(t), prefix)
	require.NoError(t, err)
	b, err := cells.Open(t.Context(), bkv, cells.Options{})
	require.NoError(t, err)
	defer b.Close()
	writeThenRead(t, a, b, func() { waitRev(t, bkv, a.Version()) })
}

// TestReadsFromCache counts the etcd requests of a KV: none for the reads
// of a transaction (Get, Scan) after Open, one Txn for a commit; reads of
// what changed since the snapshot go to etcd, and only those.
func TestReadsFromCache(t *testing.T) {
	cl := etcdtest.Start(t, 1)
	prefix := etcdtest.Prefix()
	c, n := counted(t, cl)
	kv := openKV(t, c, prefix)
	other := openKV(t, cl.Dial(t), prefix)
	gets := n.gets.Load()

	commit(t, kv, map[string][]byte{"x": []byte("1"), "y": []byte("1")})
	assert.Equal(t, int64(1), n.txns.Load(), "a commit is one Txn")
	tx, err := kv.Begin(t.Context(), true)
	require.NoError(t, err)
	got, scan := read(t, tx, "x", "y", "q")
	assert.Equal(t, []string{"x=1", "y=1", "q-"}, got)
	assert.Equal(t, []string{"x=1", "y=1"}, scan)
	assert.Equal(t, gets, n.gets.Load(), "Begin, Get and Scan read no etcd")

	// Another server deletes y while tx is open: y has changed since tx's
	// snapshot and is read from etcd; the key missing all along is still
	// the cache's (the tombstone of y is kept while tx is open).
	rev := commit(t, other, map[string][]byte{"y": nil})
	waitRev(t, kv, rev)
	b, err := tx.Bucket("b")
	require.NoError(t, err)
	v, err := b.Get(t.Context(), "q2")
	require.NoError(t, err)
	assert.Nil(t, v)
	assert.Equal(t, gets, n.gets.Load(), "a key missing at the snapshot and since, from the cache")
	v, err = b.Get(t.Context(), "y")
	require.NoError(t, err)
	assert.Equal(t, "1", string(v))
	assert.Equal(t, gets+1, n.gets.Load(), "a key deleted since the snapshot, from etcd")
	require.NoError(t, b.Put("x", []byte("2")))
	_, err = tx.Commit(t.Context(), true)
	require.ErrorIs(t, err, cells.ErrConflict, "tx read y, deleted since")

	// The next transaction (as the Store's next attempt) sees the commit
	// it met, from the cache.
	gets = n.gets.Load()
	tx, err = kv.Begin(t.Context(), false)
	require.NoError(t, err)
	got, _ = read(t, tx, "y", "x")
	tx.Rollback()
	assert.Equal(t, []string{"y-", "x=1"}, got)
	assert.Equal(t, gets, n.gets.Load())
}

// TestCompactedWatchReloads: a KV whose watch was cut off while the
// cluster wrote and compacted past its cache's revision loads the prefix
// again once it reconnects, and reads right: a new transaction the new
// state, one begun before the cut what it read then, or a conflict for
// what etcd no longer has.
func TestCompactedWatchReloads(t *testing.T) {
	cl := etcdtest.Start(t, 1)
	prefix := etcdtest.Prefix()
	p := newProxy(t, cl.Member(0).Endpoint())
	pc, err := etcdconn.Dial(t.Context(), []string{p.endpoint()})
	require.NoError(t, err)
	defer pc.Close()
	kv := openKV(t, pc, prefix)
	c := cl.Dial(t)
	other := openKV(t, c, prefix)

	rev := commit(t, kv, map[string][]byte{"x": []byte("1"), "y": []byte("1"), "z": []byte("1")})
	old, err := kv.Begin(t.Context(), false)
	require.NoError(t, err)
	defer old.Rollback()
	require.Equal(t, 1, kv.Loads())

	p.cut()
	for i := range 5 {
		rev = commit(t, other, map[string][]byte{"x": []byte(fmt.Sprint(i + 2)), "y": nil, "w": []byte("2")})
	}
	resp, err := c.Get(t.Context(), "anything")
	require.NoError(t, err)
	_, err = c.Compact(t.Context(), resp.Header.Revision)
	require.NoError(t, err)
	p.restore()

	waitRev(t, kv, rev)
	assert.Equal(t, 2, kv.Loads(), "the prefix was loaded again")
	tx, err := kv.Begin(t.Context(), false)
	require.NoError(t, err)
	got, scan := read(t, tx, "x", "y", "w", "z")
	tx.Rollback()
	assert.Equal(t, []string{"x=6", "y-", "w=2", "z=1"}, got)
	assert.Equal(t, []string{"w=2", "x=6", "z=1"}, scan)

	// The transaction from before: z has not changed (the cache has it);
	// y was deleted since its snapshot, which etcd compacted: a conflict
	// (the Store runs it again), not a missing key.
	ob, err := old.Bucket("b")
	require.NoError(t, err)
	v, err := ob.Get(t.Context(), "z")
	require.NoError(t, err)
	assert.Equal(t, "1", string(v))
	_, err = ob.Get(t.Context(), "y")
	assert.ErrorIs(t, err, cells.ErrConflict)
	// A range whose only key (y) was deleted since: the cache has nothing
	// of it any more.
	err = ob.Scan(t.Context(), "y", "z", func(string, []byte) bool { return true })
	assert.ErrorIs(t, err, cells.ErrConflict)

	// And it follows on from there.
	rev = commit(t, other, map[string][]byte{"x": []byte("7")})
	waitRev(t, kv, rev)
	tx, err = kv.Begin(t.Context(), false)
	require.NoError(t, err)
	got, _ = read(t, tx, "x")
	tx.Rollback()
	assert.Equal(t, []string{"x=7"}, got)
}

// proxy forwards TCP connections to an etcd member until cut: then it
// closes them, and refuses new ones until restored.
type proxy struct {
	t     *testing.T
	ln    net.Listener
	to    string
	mu    sync.Mutex
	conns []net.Conn
	down  bool
}

func newProxy(t *testing.T, endpoint string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{t: t, ln: ln, to: strings.TrimPrefix(endpoint, "http://")}
	t.Cleanup(func() { ln.Close(); p.cut() })
	go p.serve()
	return p
}

func (p *proxy) endpoint() string { return "http://" + p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			in.Close()
			continue
		}
		out, err := net.Dial("tcp", p.to)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		go func() { io.Copy(out, in); out.Close() }()
		go func() { io.Copy(in, out); in.Close() }()
	}
}

func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *proxy) restore() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}

// TestBeginWaitsForCache holds a KV's cache back (the watch delivers late)
// and sees that it is never read stale where it matters: Wait does not
// say another's version is there before the cache has it; after a
// conflict, Begin waits for the cache to have the commit met (else the
// Store's next attempt would read the same and conflict again); its own
// commit is in the cache at once if the cache had all before it, else
// Begin waits for it, and past a second reads etcd.
func TestBeginWaitsForCache(t *testing.T) {
	cl := etcdtest.Start(t, 1)
	prefix := etcdtest.Prefix()
	a := openKV(t, cl.Dial(t), prefix)
	b := openKV(t, cl.Dial(t), prefix)
	waitRev(t, a, commit(t, b, map[string][]byte{"x": []byte("1")}))
	begin := func() <-chan cells.KVTx {
		ch := make(chan cells.KVTx, 1)
		go func() {
			tx, err := a.Begin(context.Background(), false)
			assert.NoError(t, err)
			ch <- tx
		}()
		return ch
	}
	x := func(tx cells.KVTx) string {
		got, _ := read(t, tx, "x")
		tx.Rollback()
		return got[0]
	}

	// Wait hears of b's commit only with the cache.
	release, _ := a.HoldCache()
	rev := commit(t, b, map[string][]byte{"x": []byte("2")})
	waited := make(chan uint64, 1)
	go func() {
		v, _ := a.Wait(context.Background(), rev-1)
		waited <- v
	}()
	select {
	case <-waited:
		t.Fatal("Wait returned the version before the cache had it")
	case <-time.After(300 * time.Millisecond):
	}
	release()
	assert.Equal(t, rev, <-waited)
	tx, err := a.Begin(t.Context(), false)
	require.NoError(t, err)
	assert.Equal(t, "x=2", x(tx))

	// A conflict: the next Begin waits for the commit met.
	w, err := a.Begin(t.Context(), true)
	require.NoError(t, err)
	bw, err := w.Bucket("b")
	require.NoError(t, err)
	v, err := bw.Get(t.Context(), "x")
	require.NoError(t, err)
	assert.Equal(t, "2", string(v))
	release, _ = a.HoldCache()
	commit(t, b, map[string][]byte{"x": []byte("3")})
	require.NoError(t, bw.Put("x", []byte("no")))
	_, err = w.Commit(t.Context(), true)
	require.ErrorIs(t, err, cells.ErrConflict)
	began := begin()
	select {
	case tx := <-began:
		t.Fatalf("Begin after a conflict did not wait for the cache: read %s", x(tx))
	case <-time.After(300 * time.Millisecond):
	}
	release()
	assert.Equal(t, "x=3", x(<-began))

	// Its own commit, the cache having every commit before it: in the
	// cache at once, though the watch has not brought it.
	release, _ = a.HoldCache()
	defer release()
	commit(t, a, map[string][]byte{"x": []byte("4"), "y": []byte("4")})
	t0 := time.Now()
	tx = <-begin()
	assert.Less(t, time.Since(t0), 500*time.Millisecond, "Begin did not wait for the watch")
	assert.Equal(t, "x=4", x(tx))

	// Its own commit after another's the cache has not: the next Begin
	// waits for the watch, for a second at most, then reads etcd.
	commit(t, b, map[string][]byte{"y": []byte("5")})
	commit(t, a, map[string][]byte{"x": []byte("6")})
	t0 = time.Now()
	tx = <-begin()
	assert.GreaterOrEqual(t, time.Since(t0), 900*time.Millisecond, "Begin waited for the cache")
	got, _ := read(t, tx, "x", "y")
	tx.Rollback()
	assert.Equal(t, []string{"x=6", "y=5"}, got, "then read etcd")
}

// TestScanPages: a Scan of more keys than a page, through the cache, with
// a page of tombstones only (kept for an older open snapshot) and bounds;
// the older snapshot's scan of the same reads them all.
func TestScanPages(t *testing.T) {
	cl := etcdtest.Start(t, 1)
	prefix := etcdtest.Prefix()
	a := openKV(t, cl.Dial(t), prefix)
	const n = 1300
	puts, dels := map[string][]byte{}, map[string][]byte{}
	for i := range n {
		k := fmt.Sprintf("k%04d", i)
		puts[k] = []byte(fmt.Sprint(i))
		if i < 700 {
			dels[k] = nil
		}
	}
	commit(t, a, puts)
	old, err := a.Begin(t.Context(), false)
	require.NoError(t, err)
	defer old.Rollback()
	commit(t, a, dels)
	now, err := a.Begin(t.Context(), false)
	require.NoError(t, err)
	defer now.Rollback()
	scan := func(tx cells.KVTx, from, to string) (keys []string) {
		b, err := tx.Bucket("b")
		require.NoError(t, err)
		require.NoError(t, b.Scan(t.Context(), from, to, func(k string, v []byte) bool {
			keys = append(keys, k)
			return true
		}))
		return keys
	}
	want := func(from, to int) (keys []string) {
		for i := from; i < to; i++ {
			keys = append(keys, fmt.Sprintf("k%04d", i))
		}
		return keys
	}
	assert.Equal(t, want(700, n), scan(now, "", ""))
	assert.Equal(t, want(700, 1250), scan(now, "k0100", "k1250"))
	assert.Equal(t, want(0, n), scan(old, "", ""))
	assert.Equal(t, want(100, 1250), scan(old, "k0100", "k1250"))
}

// TestLateEventsOfOwnCommits: the KV's own commits go into the cache at
// once; the watch's events of them, arriving after, change nothing (an
// older commit's events must not undo a newer one's keys).
func TestLateEventsOfOwnCommits(t *testing.T) {
	cl := etcdtest.Start(t, 1)
	prefix := etcdtest.Prefix()
	a := openKV(t, cl.Dial(t), prefix)
	b := openKV(t, cl.Dial(t), prefix)
	waitRev(t, a, commit(t, b, map[string][]byte{"x": []byte("0")})) // the watch is there
	release, step := a.HoldCache()
	defer release()
	commit(t, a, map[string][]byte{"x": []byte("1")})
	commit(t, a, map[string][]byte{"x": []byte("2")})
	step() // the watch brings the first of the two, and holds the second
	time.Sleep(100 * time.Millisecond)
	tx, err := a.Begin(t.Context(), false)
	require.NoError(t, err)
	got, _ := read(t, tx, "x")
	tx.Rollback()
	assert.Equal(t, []string{"x=2"}, got)
}
