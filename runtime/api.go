// Package runtime runs pattern instances: graphs of nodes that read cells
// and each write one output cell, kept up to date as cells change.
//
// # Graph
//
// A Pattern instance (Space, Name) declares cells and nodes. A node reads
// input cells (cells of the pattern, outputs of other nodes, or any cell by
// full address "space/pattern/name") and owns exactly one output cell named
// after it (space/pattern/node). A node's streams are the stream cells
// space/pattern/node.stream. All loaded patterns form one graph; a cycle is
// an error naming it ("a -> b -> a").
//
// # Scheduling
//
// Every write (Set, Send, an async result, a service write) is one batch:
// one store transaction that applies the write, then runs the dirty nodes in
// height (topological) order, so each node runs at most once per batch and
// reads inputs that are all from before or all from after the change — never
// a mix (glitch-free). An output byte-equal to the previous one marks
// nothing dirty (early cutoff). All the batch's writes commit at once, so a
// watcher sees one notification. A node whose output keeps changing on its
// own (a service writing more than Options.MaxChanges times per
// Options.ChangeWindow) is backed off: its writes are held back, coalesced,
// for a growing delay, and its cell carries an error saying so.
//
// # Node shapes
//
// A node's Kind implements one of three interfaces:
//
//   - Compute: a pure, fast function of its inputs, run inside the batch.
//     Its output cell holds the value it returns.
//   - Async: work under a context (exec, llm). The runtime owns its output
//     cell, {"pending": bool, "result": any, "error": string|null}. A run
//     that fails with an error that has a PartialResult() any method keeps
//     that partial result beside the error (not memoized). The batch
//     that decides a run writes pending:true; the work starts only after that
//     commit. A newer input version cancels the run (abort) and starts a
//     fresh one; a result is written only if its run is still the current
//     one. While a run is pending, the cell keeps the previous run's result
//     and error (a failed run stays failed until the new run ends).
//     Results are memoized by the key the node gives for its inputs: a
//     revert or a restart reuses a result without running.
//   - Service: long-lived (sandbox). Opened when its pattern loads, told
//     about input changes, handed its stream events (each at most once), able
//     to write its output cell at any time through a Handle, closed when its
//     pattern stops.
//
// A node with an input in error does not run; its cell carries the error
// ("upstream raw failed: ...", naming where the failure started) until the
// input recovers.
//
// The runtime keeps a copy of the cells its graph reads: write those cells
// through Runtime.Set (not directly to the store) so their readers rerun.
//
// # Durability
//
// Node state (the key of the current or last run, pending) and the memo
// cache live in the store's meta buckets "runtime.nodes" and "runtime.memo"
// (capped by size, least recently used evicted: Options.MemoLimit);
// services may keep state in "runtime.services". Loading a pattern over a
// store that already holds it resumes it: cells keep their values (initial
// values apply only to cells that do not exist yet; but a cell the pattern
// no longer declares is removed, one whose kind changed starts from its new
// definition, and an input value its schema now refuses is replaced by the
// initial value, with a Reset status), compute nodes are
// re-evaluated (early cutoff keeps that quiet), an async node reruns only if
// it was pending or its inputs' key changed (and not even then on a memo
// hit), services reopen and get the events still queued on their streams.
package runtime

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/cellbox/cellbox/cells"
)

// Pattern is one pattern instance: the graph the runtime runs.
type Pattern struct {
	Space string // e.g. "default"
	Name  string // the instance name, e.g. "csv-pipeline"
	Cells []Cell
	Nodes []Node
}

// Cell declares an input cell of a pattern.
type Cell struct {
	Name string
	// Initial is written when the cell does not exist yet (nil: null). A
	// cell that exists keeps its value: state survives restarts, unless
	// the value breaks Schema (changed since), when Initial replaces it.
	Initial json.RawMessage
	// Schema is an optional JSON Schema for the cell's values.
	Schema json.RawMessage
	// Stream makes the cell a stream (events, no value).
	Stream bool
}

// Node declares a node. Its output cell is named after it.
type Node struct {
	Name string
	// Inputs are what the node reads: names of cells or nodes of the same
	// pattern, or full addresses "space/pattern/name". Inputs passed to the
	// node are keyed by these strings.
	Inputs []string
	// Kind is the implementation: a Compute, an Async or a Service.
	Kind any
	// Builtin names the kind for views and errors ("computed", "exec").
	Builtin string
	// Streams names the node's streams; each is the stream cell
	// "<node>.<stream>", whose events go to the node (a Service).
	Streams []string
	// Schema is an optional JSON Schema for the node's output value.
	Schema json.RawMessage
}

// Inputs maps each input name to its current value, decoded from JSON: nil,
// bool, int (a number without fraction that fits), float64, string, []any,
// map[string]any. Values are shared: never modify them.
type Inputs map[string]any

// Compute is a node kind run synchronously inside a batch. It must be pure
// (same inputs, same output) and fast, and must not keep in after it
// returns (the map is reused). The output is stored as JSON: a
// json.RawMessage as is, anything else through json.Marshal.
type Compute interface {
	Compute(in Inputs) (any, error)
}

// BindArgs is an optional interface of a Compute: BindArgs returns the
// computation over the node's input values in a slice, in the order of
// names (the node's inputs as loaded, duplicates dropped), or nil to be
// run through Compute. The runtime calls it once per loaded node and the
// function on every compute: a propagation runs thousands of computes in a
// row, and filling a map for each costs more than most of them. The same
// rules as Compute's hold (pure, fast, args not kept).
type BindArgs interface {
	BindArgs(names []string) func(args []any) (any, error)
}

// Async is a node kind whose work runs outside the batch, under a context.
type Async interface {
	// Key identifies the work for in. Two inputs with the same key produce
	// the same result: a key equal to the current run's (or the last
	// finished run's) means nothing to do. "" lets the runtime derive the
	// key from all input values. memo allows reusing results from the memo
	// cache (false for work with side effects). An error fails the node
	// without running it. Key runs inside the batch: keep it fast.
	Key(in Inputs) (key string, memo bool, err error)
	// Run does the work. ctx is cancelled when a newer input supersedes the
	// run, when the pattern stops and when the runtime closes; the result of
	// a cancelled run is discarded. A returned error is stored in the output
	// cell's "error" field; errors are not memoized.
	// Run may publish partial results while it runs with
	// Progress(ctx, v), and remember finished steps of a long run with
	// RememberStep/RecallStep so a run started again resumes.
	Run(ctx context.Context, in Inputs) (any, error)
}

// Service is a long-lived node kind. Update and Event may be called
// concurrently with each other (not with themselves); none of its methods is
// called inside a batch.
type Service interface {
	// Open starts the service when its pattern loads (or the runtime
	// restarts). h stays valid until Close returns. in are the current
	// inputs.
	Open(ctx context.Context, h Handle, in Inputs) error
	// Update tells the service its inputs changed. Updates coalesce: the
	// service sees the latest inputs, not every intermediate set.
	Update(ctx context.Context, in Inputs) error
	// Event handles one event from one of its streams (the stream's name,
	// e.g. "run"). The event is acked before Event is called, so it is
	// never delivered twice, even across a crash. An error is reported
	// as a failed status.
	Event(ctx context.Context, stream string, ev cells.Event) error
	// Close stops the service. reason says whether its pattern stopped (free
	// everything) or the runtime is shutting down (state may be kept to be
	// picked up by the next Open).
	Close(ctx context.Context, reason CloseReason) error
}

// EventAcceptor is an optional Service method: it computes the service's
// new output for an event inside the transaction that acks it, so the
// receipt and these writes commit together (e.g. pending:true and a
// "running" history entry) before Event runs. Return nil to write nothing.
type EventAcceptor interface {
	Accept(stream string, ev cells.Event, output json.RawMessage) (any, error)
}

// EventChecker is an optional Service method: Send calls it before it
// queues an event, so a malformed event is refused to the sender (an error
// wrapping ErrEventRefused) instead of being dropped later. It must be fast
// and pure.
type EventChecker interface {
	CheckEvent(stream string, payload json.RawMessage) error
}

// CloseReason says why a service is closed.
type CloseReason int

const (
	// Shutdown: the runtime is closing; the pattern will resume on restart.
	Shutdown CloseReason = iota
	// Stopped: the pattern was stopped; release everything.
	Stopped
)

func (r CloseReason) String() string {
	if r == Stopped {
		return "stopped"
	}
	return "shutdown"
}

// Handle is a service's access to its output cell and its durable state.
// Its methods may be called from any goroutine at any time while the service
// is open; each write is a batch and propagates to dependents.
type Handle interface {
	// Addr is the output cell's address.
	Addr() cells.Address
	// Get returns the output cell's current value.
	Get() (json.RawMessage, error)
	// Set replaces the output value (json.RawMessage as is, else JSON).
	Set(ctx context.Context, value any) error
	// Modify reads the current output and writes what fn returns, in one
	// transaction (e.g. appending to a history). fn may run more than once
	// and must not block. Returning nil writes nothing.
	Modify(ctx context.Context, fn func(cur json.RawMessage) (any, error)) error
	// State returns the service's durable private state (nil if none).
	State() (json.RawMessage, error)
	// SaveState stores it (JSON).
	SaveState(v any) error
	// Logger logs with the node's address attached.
	Logger() *slog.Logger
}

// Options tune a Runtime. Zero values take the defaults.
type Options struct {
	Logger *slog.Logger
	// MaxChanges is how many times a node may change its own output (a
	// service writing through its Handle) within ChangeWindow before it is
	// backed off (default 100 per second).
	MaxChanges   int
	ChangeWindow time.Duration
	// MinBackoff and MaxBackoff bound the hold-back delay, which doubles
	// while the node keeps changing (defaults 1s and 1m).
	MinBackoff, MaxBackoff time.Duration
	// MemoLimit caps the memo cache's total size in bytes (results and
	// keys); past it the least recently used results are evicted, and a
	// result larger than it is not cached. 0 is DefaultMemoLimit.
	MemoLimit int64
	// OnGone, if set, is told of each node a load finds its pattern no
	// longer has (removed, or now a node of another builtin or a cell),
	// by its output cell and builtin, after the load's commit: what the
	// node kept outside the store (a sandbox node's box) can go too. It is
	// called with the runtime locked: it must not block or call back.
	OnGone func(node cells.Address, builtin string)
	// Fence returns the context a batch of instance space/pattern commits
	// under: with the instance's lease as a cells.Fence (cells.WithFence),
	// so that a server that lost the lease writes nothing more of it (its
	// commits fail with cells.ErrFenced). nil: no fence (one process).
	Fence func(ctx context.Context, space, pattern string) context.Context
}

// StatusKind is what happened to a node.
type StatusKind string

// Status kinds.
const (
	Started   StatusKind = "started"   // an async run started
	Finished  StatusKind = "finished"  // a run (or compute) finished
	Failed    StatusKind = "failed"    // a run, compute, event or open failed
	Aborted   StatusKind = "aborted"   // a run was cancelled by newer inputs or a stop
	Cached    StatusKind = "cached"    // an async result came from the memo cache
	BackedOff StatusKind = "backedoff" // a node's writes are held back
	Opened    StatusKind = "opened"    // a service opened
	Closed    StatusKind = "closed"    // a service closed
	// Reset: a stored cell did not fit the pattern as loaded (its kind
	// changed, or its value breaks the cell's schema now), so it starts
	// from the pattern's definition. Node is the cell, Err says why.
	Reset StatusKind = "reset"
)

// Status is one node status event, for live views.
type Status struct {
	Node cells.Address // the node's output cell (Reset: the cell reset)
	Kind StatusKind
	At   time.Time
	// Duration of the run, compute or event handling (Finished, Failed,
	// Aborted).
	Duration time.Duration
	// Err is the error, for Failed and BackedOff.
	Err string
	// Stream is the stream whose event was handled, if any.
	Stream string
}

// NodeState is a node's current state.
type NodeState string

// Node states.
const (
	Idle    NodeState = "idle"    // up to date
	Running NodeState = "running" // an async run or service event in flight
	Error   NodeState = "error"   // the last run or compute failed
	Backoff NodeState = "backoff" // writes held back
	Open    NodeState = "open"    // a service, open and idle
)

// NodeInfo describes a loaded node.
type NodeInfo struct {
	Addr    cells.Address
	Builtin string
	Shape   string // "compute", "async" or "service"
	Inputs  []cells.Address
	Height  int
	State   NodeState
	Err     string
	// Runs counts computes or async runs since Load (not cache hits);
	// CacheHits counts memo hits.
	Runs, CacheHits int
	// Last is the duration of the last run.
	Last time.Duration
}
