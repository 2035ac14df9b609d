package cells

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
)

// KV is the ordered key/value store a Store keeps everything in: named
// buckets of keys in byte order, read and written in transactions, and a
// revision that counts the commits that ask for one (the Store's commits
// that change a cell: the revision is the cells' version). Open makes a Store
// over any KV; OpenBolt's is a KV over a bbolt file and NewMemory's one in
// memory, whose clients are one Store in one process, while a KV over a
// remote store (etcd) may have many clients, each a Store of its own,
// committing to the same data at once. Package kvtest has such a remote
// KV, in memory, that cellstest runs a Store on.
//
// What a Store relies on, every KV gives:
//
//   - Atomic commits. A commit writes everything its transaction wrote, puts
//     and deletes in any number of buckets, at once or not at all: no
//     transaction, of this client or another, sees part of it, and a commit
//     that failed with ErrConflict, or was never made (Rollback, a crash
//     before Commit returned), wrote nothing. Once Commit returns nil the
//     commit lasts as long as the KV keeps its data (a file, a server; for
//     a memory KV, until it is closed).
//   - Snapshot reads. A transaction reads one state of the KV: every commit
//     made before Begin returned and none made after, in every bucket and
//     in its Revision, plus its own writes.
//   - Read-your-writes. Get and Scan in a writable transaction see its own
//     puts and deletes, Scan in key order among the rest.
//   - Ordered iteration. Scan visits the keys of a range of a bucket in
//     byte order; a prefix is the range [prefix, the least key above every
//     key that starts with it).
//   - Serializable writes, with conflicts said. Writable transactions commit
//     as if one ran after the other, in the order of their commits. A KV
//     either runs one writable transaction at a time (Begin waits while
//     another is open, so that none conflicts: OpenBolt, NewMemory), or
//     runs them at once and checks each at its Commit: if a commit since
//     its snapshot changed something it read (a key it got, present or
//     missing; a key in a range it scanned, added, changed or deleted; the
//     revision, if the commit takes one), its Commit writes nothing and
//     fails with an error wrapping ErrConflict. The Store then begins again
//     and runs Update's fn again (see Store.Update). A read-only
//     transaction never conflicts.
//   - One dense revision. Commit's versioned says a commit takes the next
//     revision: the first such commit of the data takes 1, each later one
//     the number after the last, through every client, across a reopen,
//     with no gaps and no number twice; a commit that is not versioned
//     takes none. It is the Store's version (of a cell, a Batch,
//     Store.Version): the Store versions exactly the commits that change a
//     cell, so it is not a count of commits. (An etcd cluster's revision
//     moves on every write, versioned or not, and on other data's, so it
//     cannot be this one as it is: a KV over etcd can keep the count in a
//     key of its own that every versioned commit puts, guarded by the mod
//     revision it read, so that two versioned commits at once conflict.)
//   - Notice of commits. Revision and Wait tell the Store that commits
//     happened, its own and, on a KV with other clients, theirs: Version
//     reads Revision, and watches wait with Wait.
//
// The change log that Watch replays is the Store's: each versioned commit
// writes its changes to the bucket "log" under its revision and trims the
// oldest there, in the same transaction (layout.go). A KV keeps no history
// for it: atomic commits put each entry in every snapshot that has its
// revision, and Wait wakes the watches.
type KV interface {
	// Begin starts a transaction that reads a snapshot of the KV as of
	// the latest commit; a writable one may write. A KV that runs one
	// writable transaction at a time makes a writable Begin wait while
	// another is open. Every transaction ends with Commit or Rollback.
	// Begin on a closed KV fails.
	Begin(ctx context.Context, writable bool) (KVTx, error)
	// Revision returns the latest revision this client knows of, without
	// blocking: at least that of every versioned commit made through it
	// whose Commit has returned and of every snapshot it has begun; on a
	// shared KV, other clients' commits show in it soon after (as Wait
	// sees them). It never goes back.
	Revision() uint64
	// Wait returns Revision once it is above after: at once if it is,
	// else when a versioned commit takes a revision above it, on this
	// client or (on a shared KV) another. It returns ctx's error when ctx
	// ends first, and one wrapping ErrClosed when the KV is closed.
	Wait(ctx context.Context, after uint64) (uint64, error)
	// Close ends this client's use of the KV: Begin fails and every Wait
	// returns from then on. The Store calls it once, when no transaction
	// of its is open. What Close frees is the KV's to say (the data stays
	// where a remote or file KV keeps it; OpenBoltDB's leaves its bbolt
	// file open).
	Close() error
}

// KVTx is a transaction of a KV. It is used by one goroutine at a time.
type KVTx interface {
	// Revision returns the revision of the transaction's snapshot: that of
	// the last versioned commit before it began (0 before the first).
	Revision() uint64
	// Bucket returns the bucket name (any non-empty string). Buckets are
	// apart: a key of one is never read or scanned in another. A bucket
	// that holds no key reads as empty; there is no creating or removing
	// one. The KVBucket is good until the transaction ends.
	Bucket(name string) (KVBucket, error)
	// Commit ends a writable transaction, writing what it wrote (see KV
	// for how). With versioned, the commit takes the next revision, which
	// is Revision()+1 (else it conflicts), and returns it; without, it
	// takes none and returns Revision(). An error wrapping ErrConflict
	// means nothing was written and the transaction may be run again. Any
	// other error may leave the outcome unknown (a remote KV that lost its
	// connection mid-commit): the Store does not run the transaction again
	// but returns the error.
	Commit(ctx context.Context, versioned bool) (uint64, error)
	// Rollback ends the transaction without writing. After Commit, whatever
	// it returned, Rollback does nothing.
	Rollback()
}

// KVBucket is a bucket of a transaction: keys (non-empty strings) in byte
// order, each with a value. A byte slice that Get or Scan returns is good
// until the transaction ends and must not be changed (a KV may hand out
// its own memory); a value given to Put must not be changed after (a KV
// may keep it without a copy).
type KVBucket interface {
	// Get returns key's value, or nil if the key is missing (an empty
	// value is empty, not nil). An error is a failure of the KV (a remote
	// one unreachable), not a missing key.
	Get(ctx context.Context, key string) ([]byte, error)
	// Put sets key's value (an empty value is a value, not a delete). In
	// a read-only transaction it fails with ErrReadOnly. It does not
	// block: a remote KV sends its writes at Commit.
	Put(key string, value []byte) error
	// Delete removes key; a missing key is not an error. In a read-only
	// transaction it fails with ErrReadOnly. It does not block.
	Delete(key string) error
	// Scan calls fn with each key in [from, to) — to "" for no end — and
	// its value, in byte order, until fn returns false. fn may read the
	// transaction and write to its other buckets (Bucket.ForEach's caller
	// does), not to this one. An error is a failure of the KV.
	Scan(ctx context.Context, from, to string, fn func(key string, value []byte) bool) error
}

// ErrConflict: a KV's commit met a commit made since its transaction's
// snapshot that changed what the transaction read; nothing was written.
// An Update that meets it runs fn again; one that meets it too often in a
// row returns an error wrapping it.
var ErrConflict = errors.New("the data changed since the transaction read it")

var errEmptyKey = errors.New("put of an empty key")

// prefixEnd returns the end of a Scan of the keys that start with p: the
// least key above all of them ("" for none: p is empty or all 0xff).
func prefixEnd(p string) string {
	b := []byte(p)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return string(b[:i+1])
		}
	}
	return ""
}

// revision is the revision of a KV whose clients are all in this
// process: Revision reads it, Wait waits on it.
type revision struct {
	v      atomic.Uint64
	mu     sync.Mutex
	moved  chan struct{} // closed when v moves or the KV closes
	closed bool
}

func newRevision(v uint64) *revision {
	r := &revision{moved: make(chan struct{})}
	r.v.Store(v)
	return r
}

func (r *revision) load() uint64 { return r.v.Load() }

// set moves the revision to v (a versioned commit's) and wakes the waiters.
func (r *revision) set(v uint64) {
	r.mu.Lock()
	if v > r.v.Load() {
		r.v.Store(v)
		close(r.moved)
		r.moved = make(chan struct{})
	}
	r.mu.Unlock()
}

func (r *revision) close() {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.moved)
	}
	r.mu.Unlock()
}

func (r *revision) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

func (r *revision) wait(ctx context.Context, after uint64) (uint64, error) {
	for {
		r.mu.Lock()
		v, moved, closed := r.v.Load(), r.moved, r.closed
		r.mu.Unlock()
		switch {
		case v > after:
			return v, nil
		case closed:
			return v, ErrClosed
		}
		select {
		case <-moved:
		case <-ctx.Done():
			return v, ctx.Err()
		}
	}
}

// emptyBucket is a missing bucket in a read-only transaction.
type emptyBucket struct{}

func (emptyBucket) Get(context.Context, string) ([]byte, error) { return nil, nil }
func (emptyBucket) Put(string, []byte) error                    { return ErrReadOnly }
func (emptyBucket) Delete(string) error                         { return ErrReadOnly }
func (emptyBucket) Scan(context.Context, string, string, func(string, []byte) bool) error {
	return nil
}

// hintedBucket is a bucket that can find a key again without looking it
// up, through what it noted in a kvHint the last time (see Ref): the
// memory KV's.
type hintedBucket interface {
	getHinted(k string, h *kvHint) []byte
}

// kvHint is where the memory KV found a key: its entry, valid while its
// bucket has removed nothing since (gen).
type kvHint struct {
	b   *memBucket
	e   *memEntry
	gen uint64
	rec recCache // the entry's record as last read or written through the hint
}
