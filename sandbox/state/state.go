package state

import (
	"context"
	"errors"
)

// Store is the sandbox service's state: records by kind, with revisions,
// written in atomic, optionally guarded commits; reservations that count
// caps; the id of the data. The package comment states the contract in
// full; package statetest checks it.
type Store interface {
	// Instance returns the id of the store's data: made at random when the
	// data was first created, the same ever after (for every server of a
	// shared store, and after a reopen). It is never empty.
	Instance(ctx context.Context) (string, error)

	// Get returns the record key of kind, or an error wrapping ErrNotFound
	// if there is none.
	Get(ctx context.Context, kind Kind, key string) (Record, error)

	// List returns the records of kind whose keys start with prefix ("":
	// all of them), sorted by key (bytewise), as of one moment: a commit
	// is in it entirely or not at all. No record is an empty slice, not an
	// error.
	List(ctx context.Context, kind Kind, prefix string) ([]Record, error)

	// Commit applies ops atomically and returns the commit's revision: the
	// revision of every record it put, and at least the revision of every
	// record in the store after it. Every guard (Op.If) is checked against
	// the state at the commit; if any fails, nothing is written and the
	// error wraps ErrConflict (the caller reads again and retries: see the
	// package comment). Ops that name one record twice, or a bad kind or
	// key, are refused with ErrInvalid. A commit of no ops writes nothing
	// and returns 0. A commit whose ctx carries fences (WithFences) writes
	// only while each fence holds, in a store several processes share; if
	// one does not, nothing is written and the error wraps ErrFenced. A
	// store of one process ignores fences: it is the only writer there is.
	Commit(ctx context.Context, ops ...Op) (uint64, error)

	// Reserve makes holder a holder of counter if fewer than limit hold it
	// and returns nil; if holder holds it already, it returns nil and
	// changes nothing (whatever limit is: a lowered limit keeps the holders
	// it had); otherwise (limit or more hold it; limit < 1) it returns an
	// error wrapping ErrLimit. Reservations of one counter made at once,
	// from any number of goroutines or servers, never make more than limit
	// holders.
	Reserve(ctx context.Context, counter, holder string, limit int) error

	// Release removes holder from counter's holders; releasing what is not
	// held does nothing and returns nil.
	Release(ctx context.Context, counter, holder string) error

	// Holders returns counter's holders, sorted; none is an empty slice.
	Holders(ctx context.Context, counter string) ([]string, error)

	// Close ends the store's use: later calls fail with ErrClosed; a second
	// Close returns nil. What Close frees is the implementation's to say
	// (OpenBolt's store leaves its DB open).
	Close() error
}

// Kind is a namespace of records: 1 to 64 bytes of a-z, 0-9 and '_'.
type Kind string

// The kinds of the sandbox service.
const (
	// Sessions: session id -> the session (its token's hash, its boxes).
	Sessions Kind = "sessions"
	// Boxes: box id -> the box (owner, spec, last use, previews).
	Boxes Kind = "boxes"
	// Snapshots: snapshot id -> its metadata (session, box, sizes).
	Snapshots Kind = "snapshots"
	// SnapshotManifests: snapshot id -> its manifest (the files and the
	// hashes of their blobs), written in the commit of its snapshot.
	SnapshotManifests Kind = "snapshot_manifests"
	// SnapshotHolds: SESSION/id -> until when a capture of the session
	// keeps its blobs from being collected (sandbox/snapshots, servers
	// sharing a store).
	SnapshotHolds Kind = "snapshot_holds"
	// SnapshotGC: session -> until when a server collects the session's
	// unreferenced blobs (sandbox/snapshots, servers sharing a store).
	SnapshotGC Kind = "snapshot_gc"
	// Previews: preview id -> its box and port. Reserved: the service
	// keeps previews in their box's record for now.
	Previews Kind = "previews"
	// MCPSessions: MCP session id -> its sandbox session. Reserved: MCP
	// sessions live in the memory of the server that serves them for now.
	MCPSessions Kind = "mcp_sessions"
)

// Record is a stored record.
type Record struct {
	Key   string
	Value []byte // never nil
	// Revision is the revision of the commit that put the record (> 0).
	Revision uint64
}

// Op is one write of a commit: a put of Value at Key of Kind, or (Delete)
// its removal; with Guard, only if the record's revision is Revision then
// (0: there is no record). Build one with Put or Delete, guarded with If.
type Op struct {
	Kind   Kind
	Key    string
	Value  []byte // a put's value; nil is the empty value
	Delete bool
	// Guard makes the op (and so its commit) conditional on the record's
	// revision being Revision.
	Guard    bool
	Revision uint64
}

// Put is the unguarded put of value at key of kind.
func Put(kind Kind, key string, value []byte) Op {
	return Op{Kind: kind, Key: key, Value: value}
}

// Delete is the unguarded delete of key of kind.
func Delete(kind Kind, key string) Op {
	return Op{Kind: kind, Key: key, Delete: true}
}

// If returns op guarded by rev: its commit fails with ErrConflict, writing
// nothing, unless the record's revision is rev at the commit (0: unless
// there is no record).
func (op Op) If(rev uint64) Op {
	op.Guard, op.Revision = true, rev
	return op
}

// Fence makes a commit conditional on a lease: the commits made under a
// context carrying it (WithFences) go through only while Key (the lease's
// own key, in the store the state shares with its leases) still has the
// create revision Rev, that is, while the lease its writer took is still
// the one there. A server that lost the lease (paused past it: a stopped
// process, a frozen machine) then writes nothing: ErrFenced.
type Fence struct {
	Key string
	Rev int64
}

type fencesKey struct{}

// WithFences returns ctx carrying fences (with those ctx carries already)
// for the commits made under it.
func WithFences(ctx context.Context, fences ...Fence) context.Context {
	if len(fences) == 0 {
		return ctx
	}
	all := append(FencesOf(ctx), fences...)
	return context.WithValue(ctx, fencesKey{}, all[:len(all):len(all)])
}

// FencesOf returns the fences ctx carries: a shared store's Commit checks
// them.
func FencesOf(ctx context.Context) []Fence {
	f, _ := ctx.Value(fencesKey{}).([]Fence)
	return f
}

// MaxKey is the longest key, counter and holder, in bytes.
const MaxKey = 1024

var (
	// ErrNotFound: no such record (Get).
	ErrNotFound = errors.New("no such record")
	// ErrConflict: a guard of a commit failed; nothing was written.
	ErrConflict = errors.New("the record changed since it was read")
	// ErrLimit: a counter has as many holders as its limit (Reserve).
	ErrLimit = errors.New("the counter is at its limit")
	// ErrInvalid: a call the contract does not define (a bad kind, key,
	// counter or holder; one record twice in a commit).
	ErrInvalid = errors.New("invalid state operation")
	// ErrFenced: a fence of a commit no longer holds (its lease is
	// another's now, or ran out); nothing was written, and trying again
	// would not help.
	ErrFenced = errors.New("the lease this write was made under is no longer held")
	// ErrClosed: the store is closed.
	ErrClosed = errors.New("state store is closed")
)
