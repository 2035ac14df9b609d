// Package cells stores cell values: JSON values at addresses, versioned by
// one store-wide sequence, written in transactions and watched from a
// version.
//
// A cell lives at an Address (space / pattern instance / name). Writing a
// value bumps its version to the version of the committing transaction:
// every transaction that changes at least one cell takes the next number of
// one store-wide sequence, and all cells it writes get that number. One
// transaction is one commit and one notification Batch.
//
// A cell may be a stream: it queues events instead of holding a value.
// Send appends an event; its handler reads Events and marks one handled with
// Ack. Ack is the receipt: it is stored in the transaction that acks, so
// whatever else that transaction writes commits together with the receipt.
// A handler whose whole effect is writes in that transaction therefore runs
// exactly once; a handler with effects outside the store (a command in a box)
// acks first, commits, then acts, so a crash in between loses the event
// rather than repeating it: each event is handled at most once.
//
// Watch replays every committed Batch after a version from the change log
// and then follows live, so a client that reconnects with the last version it
// saw misses nothing. The log is bounded (Options.LogLimit commits and
// Options.LogBytes bytes); a watch from a version older than the log's start
// first gets a Snapshot batch with the current state of every cell under its
// prefix.
//
// There is one implementation of Store, over a KV: an ordered key/value
// store in transactions, whose contract (kv.go) is what a store of cells
// needs of one — atomic commits, snapshot reads, serializable writes with
// conflicts said, a dense revision that is the cells' version. Open makes
// a Store over any KV; OpenBolt (go.etcd.io/bbolt, one file, the default)
// and NewMemory (in memory, for unit tests) over the package's own. The
// layout of the store in a KV is documented in layout.go. Package
// cellstest is the conformance suite of the Store contract below: every
// store runs it (package kvtest's remote KV too), and each promise the doc
// comments of Store, Tx, Bucket, Batch, Change and Options make has a
// subtest there.
package cells

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Address names a cell: Space / Pattern (instance) / Name. No part is empty
// or contains '/'. Node output cells are named after their node ("clean");
// node streams are "node.stream" ("repl.run").
type Address struct {
	Space   string
	Pattern string
	Name    string
}

// String returns "space/pattern/name".
func (a Address) String() string { return a.Space + "/" + a.Pattern + "/" + a.Name }

// Prefix returns "space/pattern/", the watch prefix of the address's pattern
// instance.
func (a Address) Prefix() string { return a.Space + "/" + a.Pattern + "/" }

// HasPrefix reports whether the address string addr is under prefix, a
// prefix of whole segments: "" is every address; "s" and "s/p" name a
// space and a pattern instance (not "s/pa"), and "s/", "s/p/" what is
// under them; "s/p/n" names the cell n and the streams of a node n
// ("s/p/n.run", not "s/p/nx"), "s/p/n." only its streams. Watch and List
// match their prefix so; a caller filtering addresses by a prefix calls
// this rather than strings.HasPrefix.
func HasPrefix(addr, prefix string) bool {
	rest, ok := strings.CutPrefix(addr, prefix)
	switch {
	case !ok:
		return false
	case rest == "" || prefix == "" || strings.HasSuffix(prefix, "/"):
		return true
	case strings.Count(prefix, "/") < 2: // ends in the space or the pattern
		return rest[0] == '/'
	default: // ends in the name
		return rest[0] == '.' || strings.HasSuffix(prefix, ".")
	}
}

// Valid reports whether every part is non-empty and free of '/'.
func (a Address) Valid() error {
	for _, p := range [...]struct{ what, v string }{{"space", a.Space}, {"pattern", a.Pattern}, {"name", a.Name}} {
		if p.v == "" {
			return fmt.Errorf("cell address %q: empty %s", a.String(), p.what)
		}
		if strings.ContainsRune(p.v, '/') {
			return fmt.Errorf("cell address %q: %s %q contains '/'", a.String(), p.what, p.v)
		}
	}
	return nil
}

// Parse parses "space/pattern/name".
func Parse(s string) (Address, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 {
		return Address{}, fmt.Errorf("cell address %q: want space/pattern/name", s)
	}
	a := Address{parts[0], parts[1], parts[2]}
	return a, a.Valid()
}

// Cell is the state of one cell.
type Cell struct {
	Addr Address
	// Value is the cell's JSON value (compact); "null" for a cell never
	// written, and for a stream.
	Value json.RawMessage
	// Error, when not empty, says the cell's producer failed (a node error,
	// a node backing off). Value then holds the last good value.
	Error string
	// Version is the version of the commit that last changed the cell.
	Version uint64
	// Changed is when that commit happened: the same time for every cell
	// the commit changed.
	Changed time.Time
	// Stream marks a stream cell: it queues events instead of a value.
	Stream bool
}

// Spec declares a cell's kind and constraints.
type Spec struct {
	// Schema is an optional JSON Schema; a Set that violates it is refused
	// with a *SchemaError. Nil means none. Declaring a schema does not
	// check the value the cell holds: it holds for the Sets after it.
	Schema json.RawMessage
	// Stream makes the cell a stream. A cell's kind cannot change once
	// declared (until the cell is deleted).
	Stream bool
}

// Event is one event queued on a stream cell.
type Event struct {
	// ID is unique in the store and increases with every Send, on any
	// stream; it is never reused (not after a Delete of the stream, nor
	// after the store is closed and opened again).
	ID uint64
	// Payload is the event's JSON value, compact.
	Payload json.RawMessage
	// Sent is when the commit that sent the event happened.
	Sent time.Time
}

// Change is one cell's change in a committed transaction.
type Change struct {
	// Cell is the cell's state after the commit (for a Send: the stream
	// cell, whose Version moved to the commit's; see Batch.Changes for a
	// cell deleted and written again in one commit).
	Cell Cell
	// Event is the event appended by a Send, nil otherwise. A commit with
	// several Sends has one Change per event.
	Event *Event
	// Deleted says the cell was removed. Cell then holds its address, the
	// value null, and the commit's Version and Changed.
	Deleted bool
}

// Batch is what one commit changed, as a watcher sees it.
type Batch struct {
	// Version is the commit's version: watch again from it to resume.
	Version uint64
	// Snapshot says Changes are the full state at Version of every cell
	// under the watch prefix, in address order — streams as their cells,
	// without their queued events (read those with Tx.Events) — sent when
	// the commits after the watch's version are no longer all in the
	// change log (see Store.Watch): a client replaces what it knew with
	// it. A Snapshot is sent even when no cell is under the prefix (then
	// with no Changes).
	Snapshot bool
	// Changes lists what the commit changed under the watch prefix, in the
	// order of the transaction's calls. The writes to a cell (Declare,
	// Set, SetRef, SetError) make one Change, placed at the first of them
	// and holding the cell's state after the last; a Delete ends that run
	// with a Deleted Change of its own, and writes to the cell after it
	// start a new Change. Each Send adds a Change of its own, with its
	// Event. Applying the Changes in order leaves what the commit left.
	Changes []Change
	// Err, on the last batch of a watch (no changes), says why the watch
	// ended early: the store's change log could not be read (a corrupt
	// entry, or the store closed while the watch read it). Version is the
	// last version delivered. A watch ended by its context, or by Close
	// while it was waiting for a commit, ends without one: its channel
	// just closes.
	Err error
}

// Store is a cell store. All methods are safe for concurrent use.
//
// The calls that may wait (Get, View, Update, Watch) take a context. It
// bounds what the store can stop: a remote KV's round trips, the pauses
// between the runs of a conflicting Update; when it has ended the call
// returns its error without running fn. A transaction's own calls (Tx,
// Bucket) go on under the context of its View or Update. OpenBolt's and
// NewMemory's stores look at it only when a call begins.
type Store interface {
	// Get returns one cell, or an error wrapping ErrNotFound (an invalid
	// address is an error that does not wrap it).
	Get(ctx context.Context, addr Address) (Cell, error)
	// Version returns the version of the last commit that changed a cell
	// (0 for an empty store), without waiting: the last this store knows
	// of (over a KV that other stores share, another's commit shows soon
	// after it; see KV.Revision).
	Version() uint64
	// View runs fn in a read-only transaction, which sees every commit
	// made before it began and none of a commit in progress, and returns
	// fn's error, or the store's if it failed while fn read (see Tx).
	// Writes in it fail with ErrReadOnly.
	View(ctx context.Context, fn func(Tx) error) error
	// Update runs fn in a read-write transaction, which reads its own
	// writes. If fn returns nil, everything it wrote commits at once: a
	// reader sees all of it or none, and if it changed a cell the commit
	// takes the next version and watchers get one Batch. A commit that
	// changes no cell (it only wrote Meta, acked events, changed the spec
	// of existing cells, or wrote values equal to the stored ones) takes
	// no version and sends no Batch. If fn returns an error, Update
	// returns it; if fn panics, the panic goes on to Update's caller;
	// either way nothing is written, and the store goes on.
	//
	// Updates are serializable: each takes effect as if it alone ran, one
	// after another, and what an Update that writes read is still what
	// the store holds when it commits. fn may run more than once: over a
	// KV that runs writable transactions at once (see KV), an Update whose
	// commit conflicts with another's writes nothing and runs fn again, in
	// a new transaction, up to 32 times (then it returns an error wrapping
	// ErrConflict); and the fns of several Updates may run at once. So fn
	// must change nothing outside its transaction that a run which does
	// not commit would leave wrong. Over OpenBolt's and NewMemory's
	// stores, whose KV runs one writable transaction at a time, one fn
	// runs at a time and each runs once. An error of the commit itself
	// (neither fn's nor a conflict) over a remote KV may leave it unknown
	// whether the commit happened (see KVTx.Commit).
	Update(ctx context.Context, fn func(Tx) error) error
	// Watch sends every Batch committed after version from, limited to the
	// changes whose address is under prefix, as HasPrefix matches it ("" for
	// all, "s/p/" for a pattern instance), one per commit in version order,
	// then follows live until ctx ends, when the channel is closed. Batches
	// without a matching change are skipped. From Version() it sends the
	// next commit first. If a commit after from is no longer in the change
	// log (from < Version()-LogLimit, or past LogBytes; see Options), or
	// from is newer than the store (another store's version), the first
	// Batch is a Snapshot of the current state instead, and the batches
	// after it follow from its Version. A slow reader never blocks writers
	// and loses no batch the change log still holds: the watch reads the
	// log at its own pace. A reader that falls behind the log's limits
	// gets a Snapshot where its next batch is gone, as a watch from an old
	// version does, and goes on from there. Watch on a closed store
	// returns ErrClosed.
	Watch(ctx context.Context, prefix string, from uint64) (<-chan Batch, error)
	// Close closes the store: every watch's channel closes (see
	// Batch.Err), and Get, View, Update and Watch fail with ErrClosed from
	// then on (View and Update without calling fn). It waits for the
	// calls in progress to return, then closes the KV. A second Close
	// returns nil.
	Close() error
}

// Tx is a store transaction. It must not be used after View or Update
// returns. Byte slices it returns are copies the caller may keep and
// change; byte slices given to it are copied before the call returns, so
// the caller may reuse them.
//
// Every method that takes an Address refuses an invalid one (Valid) with an
// error. A call refused for what it was given (an invalid address, value,
// payload or schema, a schema violation, the wrong kind of cell, no such
// cell, ErrHandled, ErrReadOnly) writes nothing and leaves the transaction
// usable: what else it wrote commits if fn returns nil. Any other error
// is the store failing (its KV could not be read or written): it fails the
// transaction, so that View and Update return it even if fn does not, and
// nothing commits; a failure in a call that cannot return one (Bucket.Get)
// does the same. In a View, every write fails with ErrReadOnly.
type Tx interface {
	// Version is the version this transaction's writes get (in a read-only
	// transaction: the store's current version).
	Version() uint64
	// Get returns one cell, or an error wrapping ErrNotFound.
	Get(addr Address) (Cell, error)
	// List returns the cells (value cells and streams) whose address is
	// under prefix, as HasPrefix matches it (whole segments: "s/p" is not
	// "s/pa"), in address order.
	List(prefix string) ([]Cell, error)
	// Declare creates the cell if it does not exist (value null; a change
	// of the commit) and sets its spec. On an existing cell it only sets
	// the spec — a schema replaced, or removed by a Spec without one —
	// which changes no cell: no version, no Batch, and the value is not
	// checked against the new schema. Declaring a cell as the other kind
	// (a stream as a value cell, or back) is an error, as is a schema that
	// is not JSON.
	Declare(addr Address, spec Spec) error
	// Spec returns a cell's spec: zero for a cell that was never declared
	// (made by Set or SetError) and for no cell.
	Spec(addr Address) (Spec, error)
	// Set writes a JSON value, creating the cell if needed, and clears its
	// Error. The value must be one JSON value (an empty one is an error:
	// write null for none) and is stored compact. A value byte-equal, once
	// compact, to the current one (and no Error to clear) changes nothing
	// and reports false; so does null on a declared cell never written. A
	// value that breaks the cell's schema is refused with a *SchemaError.
	// Set on a stream is an error.
	Set(addr Address, value json.RawMessage) (changed bool, err error)
	// SetRef is Set of the cell r refers to, for a writer that sets the
	// same cells transaction after transaction (see Ref). It behaves as
	// Set in every way, through deletes and re-creations of the cell.
	SetRef(r *Ref, value json.RawMessage) (changed bool, err error)
	// SetRefStored is SetRef that also returns, when it changed the cell,
	// the value as stored (compact). It is the caller's to keep: the store
	// never changes it. value itself is not kept (it may be a buffer the
	// caller reuses).
	SetRefStored(r *Ref, value json.RawMessage) (stored json.RawMessage, changed bool, err error)
	// SetError marks the cell failed with msg, keeping its value; "" clears
	// it. A missing cell is created (value null) by a msg that is not "".
	// It reports whether anything changed: the same msg again, or "" on a
	// cell without an error (or on no cell), changes nothing.
	SetError(addr Address, msg string) (changed bool, err error)
	// Delete removes a cell with its spec, its queued events and its ack
	// receipt; watchers get a Deleted change. Deleting no cell is not an
	// error and changes nothing.
	Delete(addr Address) error
	// Send appends an event to a declared stream: an error wrapping
	// ErrNotFound if there is no such cell, an error if it is a value
	// cell. The payload must be JSON; it is stored compact. The stream
	// cell's Version moves to the transaction's, and watchers get a Change
	// with the Event.
	Send(addr Address, payload json.RawMessage) (Event, error)
	// Events returns the stream's events not yet acked, oldest first (an
	// error wrapping ErrNotFound if there is no such cell, an error if it
	// is a value cell).
	Events(addr Address) ([]Event, error)
	// Ack records that the stream's events with IDs up to and including id
	// are handled and drops them; IDs are store-wide, so id need not be
	// one of this stream's. An id at or below the last one acked on this
	// stream returns an error wrapping ErrHandled. The receipt commits
	// with the transaction; by itself it changes no cell (no version, no
	// Batch).
	Ack(addr Address, id uint64) error
	// Meta returns a named key/value bucket for a client's own state (the
	// runtime keeps node state and its memo cache there), apart from the
	// cells and from the other buckets. Its writes commit or roll back
	// with the transaction, and cause no version and no notification.
	Meta(bucket string) Bucket
}

// Ref is a cell's address checked and keyed once, for a writer that sets
// the same cells in transaction after transaction (the runtime: each
// computed node's output, once per batch). Tx.SetRef skips the address
// check and the building of its key, and the memory store finds the
// cell's record again without a lookup in its index while the record stays
// (no cell was removed since). A Ref is not safe for concurrent use.
type Ref struct {
	addr Address
	key  string
	hint kvHint
}

// recCache is the last record a Ref read or wrote, encoded and decoded:
// the memory KV hands back the very bytes it was given, never changed,
// so the same bytes again (same address and length, which the cache's
// hold on them keeps from being reused) decode as the same record.
type recCache struct {
	enc []byte
	rec record
}

// hit reports whether raw are the cached bytes.
func (c *recCache) hit(raw []byte) bool {
	return len(raw) > 0 && len(raw) == len(c.enc) && &raw[0] == &c.enc[0]
}

// NewRef returns a Ref to the cell at a.
func NewRef(a Address) (*Ref, error) {
	if err := a.Valid(); err != nil {
		return nil, err
	}
	return &Ref{addr: a, key: a.String()}, nil
}

// Addr returns the address r refers to.
func (r *Ref) Addr() Address { return r.addr }

// Bucket is a key/value bucket inside a transaction.
type Bucket interface {
	// Get returns a copy of the value (empty, not nil, for an empty value),
	// or nil, false.
	Get(key string) ([]byte, bool)
	// Put stores a copy of value under key, replacing what was there (an
	// empty value is stored as empty, not deleted). An empty key is an
	// error.
	Put(key string, value []byte) error
	// Delete removes key; a missing key is not an error.
	Delete(key string) error
	// ForEach calls fn with each key starting with prefix and a copy of
	// its value, in key (byte) order, until fn returns an error, which
	// ForEach returns.
	ForEach(prefix string, fn func(key string, value []byte) error) error
}

// Options tune a store.
type Options struct {
	// LogLimit is how many commits the change log keeps (default 10000):
	// the last LogLimit, so a watch from a version v replays when
	// v >= Version()-LogLimit (and LogBytes kept them), and starts with a
	// Snapshot otherwise.
	LogLimit int
	// LogBytes caps the size of the change log's entries as the store
	// keeps them (each holds the records of the cells its commit changed,
	// values and events included; default 64 MiB): past it the oldest
	// entries go, however few commits the log holds, but the newest stays
	// whatever its size.
	LogBytes int
	// NoSync skips fsync on commit (bbolt only; for tests and benchmarks):
	// a crash of the machine may then lose the last commits, or the file.
	NoSync bool
}

var (
	// ErrNotFound: no such cell (Get), or no such stream (Send, Events,
	// Ack).
	ErrNotFound = errors.New("no such cell")
	// ErrHandled: a stream event was already handled.
	ErrHandled = errors.New("event already handled")
	// ErrClosed: the store is closed.
	ErrClosed = errors.New("store is closed")
	// ErrReadOnly: a write in a View transaction.
	ErrReadOnly = errors.New("write in a read-only transaction")
)

// SchemaError is a write refused by a cell's JSON Schema.
type SchemaError struct {
	Addr Address
	// Err lists each violation as "/json/path: reason".
	Err error
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("set %s: %v", e.Addr, e.Err)
}

func (e *SchemaError) Unwrap() error { return e.Err }
