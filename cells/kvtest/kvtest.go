// Package kvtest has a cells.KV that behaves as a remote one would, kept
// in memory, for tests: a Server holds the data, as an etcd cluster would,
// and each Client is a connection to it, a cells.KV that one Store owns.
// Several Stores over one Server share the data, and a Store opened again
// over it finds what the last one left.
//
// Nothing of bbolt's shape is in it. Every value is copied in (Put) and
// out (Get, Scan), and what a transaction handed out is overwritten when
// it ends, so a Store that keeps a KV's slice past its transaction reads
// garbage. Transactions run at once: each reads a snapshot (the data keeps
// the versions that open transactions may read), buffers its writes, and
// is checked at Commit, optimistically: if a commit since its snapshot
// changed a key it got (present or missing) or a key in a range it
// scanned, or took a revision when this one takes one too, the Commit
// writes nothing and fails with cells.ErrConflict. The revision is a
// counter of the versioned commits, apart from the Server's count of all
// commits, as a KV over etcd would keep it.
package kvtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/cellbox/cellbox/cells"
)

// Server is the data that Clients share.
type Server struct {
	mu      sync.Mutex
	seq     uint64 // commits of any kind (a cluster's revision)
	rev     uint64 // versioned commits: the cells.KV revision
	moved   chan struct{}
	buckets map[string]*bucket
	open    map[uint64]int // the snapshots (seq) of open transactions
	// old holds the keys that may have versions to prune: more than one,
	// or a delete.
	old     map[bucketKey]struct{}
	stats   Stats
	failErr error // FailReads
}

// Stats counts what a Server saw.
type Stats struct {
	// Commits that wrote, and Conflicts: commits refused with
	// cells.ErrConflict.
	Commits, Conflicts int
}

type bucketKey struct{ bucket, key string }

type bucket struct {
	keys []string // sorted: every key with a version kept
	vers map[string][]version
}

// version is a key's value as of a commit (seq); a nil val is a delete.
type version struct {
	seq uint64
	val []byte
}

// NewServer returns an empty Server.
func NewServer() *Server {
	return &Server{moved: make(chan struct{}), buckets: map[string]*bucket{}, open: map[uint64]int{}, old: map[bucketKey]struct{}{}}
}

// Stats returns what the Server has counted so far.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// FailReads makes every Get and Scan of every Client fail with err, as
// an unreachable server would, until FailReads(nil).
func (s *Server) FailReads(err error) {
	s.mu.Lock()
	s.failErr = err
	s.mu.Unlock()
}

// Client returns a new connection to the Server: a cells.KV.
func (s *Server) Client() *Client {
	return &Client{srv: s, closed: make(chan struct{})}
}

// Client is a connection to a Server. It implements cells.KV.
type Client struct {
	srv    *Server
	closed chan struct{}
	once   sync.Once
}

var _ cells.KV = (*Client)(nil)

var errClosed = fmt.Errorf("kvtest: the connection is closed: %w", cells.ErrClosed)

func (c *Client) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case <-c.closed:
		return errClosed
	default:
		return nil
	}
}

// Begin starts a transaction on a snapshot of the Server's data as of
// its last commit.
func (c *Client) Begin(ctx context.Context, writable bool) (cells.KVTx, error) {
	if err := c.check(ctx); err != nil {
		return nil, err
	}
	s := c.srv
	s.mu.Lock()
	defer s.mu.Unlock()
	s.open[s.seq]++
	return &tx{c: c, writable: writable, seq: s.seq, rev: s.rev, writes: map[string]map[string]write{}}, nil
}

// Revision returns the Server's revision.
func (c *Client) Revision() uint64 {
	c.srv.mu.Lock()
	defer c.srv.mu.Unlock()
	return c.srv.rev
}

// Wait waits for the Server's revision to pass after.
func (c *Client) Wait(ctx context.Context, after uint64) (uint64, error) {
	for {
		c.srv.mu.Lock()
		rev, moved := c.srv.rev, c.srv.moved
		c.srv.mu.Unlock()
		if rev > after {
			return rev, nil
		}
		select {
		case <-moved:
		case <-ctx.Done():
			return rev, ctx.Err()
		case <-c.closed:
			return rev, errClosed
		}
	}
}

// Close closes the connection; the Server keeps the data.
func (c *Client) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

type tx struct {
	c        *Client
	writable bool
	seq, rev uint64 // the snapshot's
	done     bool
	writes   map[string]map[string]write // bucket -> key -> buffered write
	reads    []read
	lent     [][]byte // slices handed out, overwritten when the transaction ends
}

type write struct {
	val []byte // nil: a delete
}

// read is what a transaction read, for its Commit's check: one key, or
// the keys in [from, to) ("" to: no end).
type read struct {
	bucket   string
	from, to string
	key      bool
}

func (t *tx) Revision() uint64 { return t.rev }

func (t *tx) Bucket(name string) (cells.KVBucket, error) {
	if name == "" {
		return nil, errors.New("kvtest: a bucket with no name")
	}
	return &txBucket{t: t, name: name}, nil
}

func (t *tx) live(ctx context.Context) error {
	if t.done {
		return errors.New("kvtest: the transaction has ended")
	}
	return t.c.check(ctx)
}

func (t *tx) Commit(ctx context.Context, versioned bool) (uint64, error) {
	if err := t.live(ctx); err != nil {
		return 0, err
	}
	if !t.writable {
		return 0, errors.New("kvtest: commit of a read-only transaction")
	}
	s := t.c.srv
	s.mu.Lock()
	defer s.mu.Unlock()
	defer t.end()
	if why := s.conflict(t, versioned); why != "" {
		s.stats.Conflicts++
		return 0, fmt.Errorf("kvtest: commit on the snapshot of commit %d: %s: %w", t.seq, why, cells.ErrConflict)
	}
	s.seq++
	s.stats.Commits++
	for name, ws := range t.writes {
		b := s.buckets[name]
		if b == nil {
			b = &bucket{vers: map[string][]version{}}
			s.buckets[name] = b
		}
		for k, w := range ws {
			if _, ok := b.vers[k]; !ok {
				i, _ := slices.BinarySearch(b.keys, k)
				b.keys = slices.Insert(b.keys, i, k)
			}
			b.vers[k] = append(b.vers[k], version{seq: s.seq, val: w.val})
			if len(b.vers[k]) > 1 || w.val == nil {
				s.old[bucketKey{name, k}] = struct{}{}
			}
		}
	}
	rev := t.rev
	if versioned {
		s.rev++
		rev = s.rev
		close(s.moved)
		s.moved = make(chan struct{})
	}
	return rev, nil
}

// conflict says what of t's reads a commit since its snapshot changed
// ("" for nothing). Called with s.mu held.
func (s *Server) conflict(t *tx, versioned bool) string {
	if versioned && s.rev != t.rev {
		return fmt.Sprintf("revision %d was taken", t.rev+1)
	}
	for _, r := range t.reads {
		b := s.buckets[r.bucket]
		if b == nil {
			continue
		}
		if r.key {
			if last(b.vers[r.from]) > t.seq {
				return fmt.Sprintf("%s %q changed", r.bucket, r.from)
			}
			continue
		}
		i, _ := slices.BinarySearch(b.keys, r.from)
		for ; i < len(b.keys) && (r.to == "" || b.keys[i] < r.to); i++ {
			if last(b.vers[b.keys[i]]) > t.seq {
				return fmt.Sprintf("%s %q, in a range scanned, changed", r.bucket, b.keys[i])
			}
		}
	}
	return ""
}

// last returns the seq of a key's last version (0: none).
func last(vs []version) uint64 {
	if len(vs) == 0 {
		return 0
	}
	return vs[len(vs)-1].seq
}

func (t *tx) Rollback() {
	if t.done {
		return
	}
	s := t.c.srv
	s.mu.Lock()
	defer s.mu.Unlock()
	t.end()
}

// end ends the transaction: its snapshot is no longer read, the versions
// only it could read go, and the slices it handed out are overwritten.
// Called with s.mu held.
func (t *tx) end() {
	if t.done {
		return
	}
	t.done = true
	s := t.c.srv
	if s.open[t.seq]--; s.open[t.seq] == 0 {
		delete(s.open, t.seq)
	}
	s.prune()
	for _, b := range t.lent {
		for i := range b {
			b[i] = 0xEE
		}
	}
	t.lent = nil
}

// prune drops the versions no open or later transaction can read: of each
// key, those before its last version at or below the oldest open
// snapshot; and a key whose only version left is such a delete.
func (s *Server) prune() {
	oldest := s.seq
	for seq := range s.open {
		oldest = min(oldest, seq)
	}
	for bk := range s.old {
		b := s.buckets[bk.bucket]
		vs := b.vers[bk.key]
		i := sort.Search(len(vs), func(i int) bool { return vs[i].seq > oldest }) - 1
		if i > 0 {
			vs = slices.Delete(vs, 0, i)
			b.vers[bk.key] = vs
		}
		switch {
		case len(vs) == 1 && vs[0].val == nil && vs[0].seq <= oldest:
			delete(b.vers, bk.key)
			j, _ := slices.BinarySearch(b.keys, bk.key)
			b.keys = slices.Delete(b.keys, j, j+1)
		case len(vs) > 1 || vs[0].val == nil:
			continue // still old
		}
		delete(s.old, bk)
	}
}

// at returns a key's value in the snapshot seq (nil: none). Called with
// s.mu held.
func (b *bucket) at(key string, seq uint64) []byte {
	vs := b.vers[key]
	i := sort.Search(len(vs), func(i int) bool { return vs[i].seq > seq }) - 1
	if i < 0 {
		return nil
	}
	return vs[i].val
}

type txBucket struct {
	t    *tx
	name string
}

// lend returns a copy of v that the transaction overwrites when it ends.
func (b *txBucket) lend(v []byte) []byte {
	if v == nil {
		return nil
	}
	c := append([]byte{}, v...)
	b.t.lent = append(b.t.lent, c)
	return c
}

func (b *txBucket) failed() error {
	s := b.t.c.srv
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failErr
}

func (b *txBucket) Get(ctx context.Context, key string) ([]byte, error) {
	if err := b.t.live(ctx); err != nil {
		return nil, err
	}
	if err := b.failed(); err != nil {
		return nil, err
	}
	b.t.reads = append(b.t.reads, read{bucket: b.name, from: key, key: true})
	if w, ok := b.t.writes[b.name][key]; ok {
		return b.lend(w.val), nil
	}
	s := b.t.c.srv
	s.mu.Lock()
	var v []byte
	if sb := s.buckets[b.name]; sb != nil {
		v = sb.at(key, b.t.seq)
	}
	v = b.lend(v) // copied before the lock goes: a commit may prune it
	s.mu.Unlock()
	return v, nil
}

func (b *txBucket) Put(key string, value []byte) error {
	if err := b.writable(key); err != nil {
		return err
	}
	b.buffer(key, write{val: append([]byte{}, value...)})
	return nil
}

func (b *txBucket) Delete(key string) error {
	if err := b.writable(key); err != nil {
		return err
	}
	b.buffer(key, write{})
	return nil
}

func (b *txBucket) writable(key string) error {
	switch {
	case b.t.done:
		return errors.New("kvtest: the transaction has ended")
	case !b.t.writable:
		return cells.ErrReadOnly
	case key == "":
		return errors.New("kvtest: an empty key")
	}
	return nil
}

func (b *txBucket) buffer(key string, w write) {
	ws := b.t.writes[b.name]
	if ws == nil {
		ws = map[string]write{}
		b.t.writes[b.name] = ws
	}
	ws[key] = w
}

type kv struct {
	key string
	val []byte // nil: deleted (a buffered delete)
}

func (b *txBucket) Scan(ctx context.Context, from, to string, fn func(key string, value []byte) bool) error {
	if err := b.t.live(ctx); err != nil {
		return err
	}
	if err := b.failed(); err != nil {
		return err
	}
	in := func(k string) bool { return k >= from && (to == "" || k < to) }
	b.t.reads = append(b.t.reads, read{bucket: b.name, from: from, to: to})
	// The snapshot's keys in the range, then the transaction's own writes
	// over them.
	var stored []kv
	s := b.t.c.srv
	s.mu.Lock()
	if sb := s.buckets[b.name]; sb != nil {
		i, _ := slices.BinarySearch(sb.keys, from)
		for ; i < len(sb.keys) && in(sb.keys[i]); i++ {
			if v := sb.at(sb.keys[i], b.t.seq); v != nil {
				stored = append(stored, kv{sb.keys[i], b.lend(v)})
			}
		}
	}
	s.mu.Unlock()
	var own []kv
	for k, w := range b.t.writes[b.name] {
		if in(k) {
			own = append(own, kv{k, w.val})
		}
	}
	slices.SortFunc(own, func(x, y kv) int {
		if x.key < y.key {
			return -1
		}
		return 1
	})
	for len(stored) > 0 || len(own) > 0 {
		var next kv
		switch {
		case len(own) == 0 || len(stored) > 0 && stored[0].key < own[0].key:
			next, stored = stored[0], stored[1:]
		default:
			if len(stored) > 0 && stored[0].key == own[0].key {
				stored = stored[1:]
			}
			next, own = own[0], own[1:]
			if next.val == nil {
				continue
			}
			next.val = b.lend(next.val)
		}
		if !fn(next.key, next.val) {
			return nil
		}
	}
	return nil
}
