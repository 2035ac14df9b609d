package runtime

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cellbox/cellbox/cells"
)

// Meta buckets of the runtime's durable state.
const (
	bucketNodes    = "runtime.nodes"
	bucketMemo     = "runtime.memo"
	bucketServices = "runtime.services"
	// bucketPatterns records, per instance ("space/name"), the kind of
	// each cell its pattern declared when it last loaded (see reconcile).
	bucketPatterns = "runtime.patterns"
)

// ErrClosed is returned by a closed runtime.
var ErrClosed = errors.New("runtime is closed")

// ErrEventRefused is returned (wrapped) by Send for an event the stream's
// node refuses (see EventChecker).
var ErrEventRefused = errors.New("event refused")

// ErrNotLoaded is returned (wrapped) by Send for a stream of a pattern the
// runtime has not loaded: nothing would check or take the event, and it
// ran, unchecked, whenever the pattern was loaded again.
var ErrNotLoaded = errors.New("pattern not loaded")

// Runtime runs loaded patterns over a store. Safe for concurrent use.
type Runtime struct {
	store cells.Store
	opts  Options
	log   *slog.Logger

	// mu guards everything below; a batch holds it from start to commit.
	mu       sync.Mutex
	closed   bool
	patterns map[string]*pattern
	nodes    map[cells.Address]*node // by output cell
	slots    map[cells.Address]*slot // cells the graph reads or writes
	streams  map[cells.Address]streamRef
	batchID  uint64
	queue    levels       // of the batch in progress
	touched  []*slot      // spare array of batch.touched
	undo     []nodeFields // spare array of batch.undo
	runID    uint64
	busy     int
	idle     chan struct{} // closed when busy drops to 0

	wg sync.WaitGroup // async runs and service goroutines

	subMu sync.Mutex
	subs  map[chan Status]struct{}
	nsubs atomic.Int32
}

type streamRef struct {
	node *node
	name string
}

// slot is a cell the graph reads or writes: its readers, its producer and
// the runtime's copy of its value.
//
// The fields a batch reads for every cell it touches come first.
type slot struct {
	nextID   uint64
	known    bool // val was read or written
	producer *node
	readers  []*node
	ref      *cells.Ref // for writes; nil until the first
	next     value      // the value in batch nextID
	val      value      // committed, if known
	addr     cells.Address
}

// slotFor returns the graph's slot of a cell, or a new unregistered one.
// Callers hold r.mu.
func (r *Runtime) slotFor(a cells.Address) *slot {
	if s, ok := r.slots[a]; ok {
		return s
	}
	return &slot{addr: a}
}

// value is the runtime's copy of a committed cell.
type value struct {
	raw     json.RawMessage
	err     string
	val     any
	decoded bool
	missing bool // the cell does not exist yet
}

func (v *value) get() any {
	if !v.decoded {
		v.decoded = true
		v.val = decode(v.raw)
	}
	return v.val
}

// decode decodes a JSON value for Inputs: integers that fit become int,
// other numbers float64.
func decode(raw json.RawMessage) any {
	switch {
	case len(raw) == 0:
		return nil
	case raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9':
		return number(string(raw))
	case string(raw) == "true":
		return true
	case string(raw) == "false":
		return false
	case string(raw) == "null":
		return nil
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil
	}
	return numbers(v)
}

func number(s string) any {
	if i, err := strconv.Atoi(s); err == nil {
		return i
	}
	f, _ := strconv.ParseFloat(s, 64)
	return f
}

// numbers replaces json.Numbers in place.
func numbers(v any) any {
	switch x := v.(type) {
	case json.Number:
		return number(string(x))
	case map[string]any:
		for k, e := range x {
			x[k] = numbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = numbers(e)
		}
	}
	return v
}

var nullValue = json.RawMessage("null")

// New returns a runtime over store. The store stays the caller's to close
// (after Close).
func New(store cells.Store, opts Options) *Runtime {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MaxChanges <= 0 {
		opts.MaxChanges = 100
	}
	if opts.ChangeWindow <= 0 {
		opts.ChangeWindow = time.Second
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = time.Second
	}
	if opts.MemoLimit <= 0 {
		opts.MemoLimit = DefaultMemoLimit
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = max(time.Minute, opts.MinBackoff)
	}
	return &Runtime{
		store:    store,
		opts:     opts,
		log:      opts.Logger,
		patterns: map[string]*pattern{},
		nodes:    map[cells.Address]*node{},
		slots:    map[cells.Address]*slot{},
		streams:  map[cells.Address]streamRef{},
		subs:     map[chan Status]struct{}{},
	}
}

// Load adds a pattern instance to the graph and resumes it: declares its
// cells (writing initial values of new ones), checks inputs and cycles, then
// runs one batch that brings every node up to date (reruns pending or stale
// async nodes, opens services, delivers queued stream events). Loading an
// instance that is already loaded is an error.
func (r *Runtime) Load(ctx context.Context, p Pattern) error {
	pat, err := compile(p)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	if _, ok := r.patterns[pat.key()]; ok {
		return fmt.Errorf("pattern %s is already loaded: stop it first", pat.key())
	}
	if err := r.link(pat); err != nil {
		return err
	}
	err = r.batch(cells.Address{Space: p.Space, Pattern: p.Name}, func(b *batch) error { return b.load(pat, p) })
	if err != nil {
		r.unlink(pat)
		return fmt.Errorf("load pattern %s: %w", pat.key(), err)
	}
	r.patterns[pat.key()] = pat
	for _, n := range pat.nodes {
		if n.shape == shapeService {
			r.openService(n)
		}
	}
	return nil
}

// Stop stops a loaded pattern instance: cancels its async runs (their state
// stays pending, to resume on a later Load) and closes its services with
// reason Stopped. Its cells stay in the store.
func (r *Runtime) Stop(ctx context.Context, space, name string) error {
	return r.remove(ctx, space, name, Stopped)
}

// Unload takes a loaded pattern instance out of the graph as Close takes
// every one: its async runs are cancelled (their state stays pending) and
// its services closed with reason Shutdown, keeping what they hold, so
// that a Load of the instance, of the same or an edited version, resumes
// it where it stood (a pattern reloaded while it runs).
func (r *Runtime) Unload(ctx context.Context, space, name string) error {
	return r.remove(ctx, space, name, Shutdown)
}

func (r *Runtime) remove(ctx context.Context, space, name string, reason CloseReason) error {
	r.mu.Lock()
	pat, ok := r.patterns[space+"/"+name]
	if !ok {
		r.mu.Unlock()
		return fmt.Errorf("%s pattern %s/%s: not loaded", map[CloseReason]string{Stopped: "stop", Shutdown: "unload"}[reason], space, name)
	}
	delete(r.patterns, pat.key())
	r.unlink(pat)
	svcs := r.detach(pat.nodes)
	r.mu.Unlock()
	return r.closeServices(ctx, svcs, reason)
}

// detach cancels the nodes' async runs and marks their services closing.
// Callers hold r.mu.
func (r *Runtime) detach(nodes []*node) []*node {
	var svcs []*node
	for _, n := range nodes {
		n.detached = true
		if n.cancel != nil {
			n.cancel()
		}
		if n.svc != nil {
			svcs = append(svcs, n)
		}
	}
	return svcs
}

// Set writes a cell and propagates the change. Setting a node's output is
// refused.
func (r *Runtime) Set(ctx context.Context, addr cells.Address, v json.RawMessage) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	if n, ok := r.nodes[addr]; ok {
		return fmt.Errorf("set %s: it is the output of node %s (%s); set its inputs instead", addr, n.decl.Name, n.kindName())
	}
	return r.batch(addr, func(b *batch) error {
		_, err := b.set(r.slotFor(addr), v)
		return err
	})
}

// Send appends an event to a stream cell; the owning service handles it.
func (r *Runtime) Send(ctx context.Context, addr cells.Address, payload json.RawMessage) (cells.Event, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return cells.Event{}, ErrClosed
	}
	if _, ok := r.patterns[addr.Space+"/"+addr.Pattern]; !ok {
		return cells.Event{}, fmt.Errorf("send to %s: %w: pattern %s/%s is stopped, or was never loaded here; load it first", addr, ErrNotLoaded, addr.Space, addr.Pattern)
	}
	if ref, ok := r.streams[addr]; ok {
		if c, ok := ref.node.service.(EventChecker); ok {
			if err := c.CheckEvent(ref.name, payload); err != nil {
				return cells.Event{}, fmt.Errorf("%w by %s: %w", ErrEventRefused, ref.node.addr, err)
			}
		}
	}
	var ev cells.Event
	err := r.batch(addr, func(b *batch) error {
		var err error
		ev, err = b.tx.Send(addr, payload)
		return err
	})
	if err != nil {
		return ev, err
	}
	if ref, ok := r.streams[addr]; ok {
		r.kickEvents(ref.node)
	}
	return ev, nil
}

// Wait returns when nothing is in flight: no batch, no async run, no service
// open, update or event being handled (or when ctx ends, with its error).
func (r *Runtime) Wait(ctx context.Context) error {
	for {
		r.mu.Lock()
		if r.busy == 0 {
			r.mu.Unlock()
			return nil
		}
		idle := r.idle
		r.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
			return fmt.Errorf("wait for the runtime to settle: %w", ctx.Err())
		}
	}
}

// begin and end count work in flight (callers hold r.mu).
func (r *Runtime) begin() {
	if r.busy == 0 {
		r.idle = make(chan struct{})
	}
	r.busy++
}

func (r *Runtime) end() {
	r.busy--
	if r.busy == 0 {
		close(r.idle)
	}
}

// Subscribe streams node status events until ctx ends. A subscriber that
// falls behind by more than buffer events loses events (Nodes gives the
// current state).
func (r *Runtime) Subscribe(ctx context.Context, buffer int) <-chan Status {
	ch := make(chan Status, max(buffer, 1))
	r.subMu.Lock()
	r.subs[ch] = struct{}{}
	r.nsubs.Add(1)
	r.subMu.Unlock()
	go func() {
		<-ctx.Done()
		r.subMu.Lock()
		delete(r.subs, ch)
		r.nsubs.Add(-1)
		close(ch)
		r.subMu.Unlock()
	}()
	return ch
}

func (r *Runtime) emit(s Status) {
	if s.At.IsZero() {
		s.At = time.Now()
	}
	if s.Kind == Reset {
		r.log.Warn("cell reset as the pattern loaded", "cell", s.Node.String(), "why", s.Err)
	} else if s.Kind == Failed || s.Kind == BackedOff {
		r.log.Warn("node "+string(s.Kind), "node", s.Node.String(), "error", s.Err, "stream", s.Stream)
	} else {
		r.log.Debug("node "+string(s.Kind), "node", s.Node.String(), "duration", s.Duration)
	}
	if r.nsubs.Load() == 0 {
		return
	}
	r.subMu.Lock()
	for ch := range r.subs {
		select {
		case ch <- s:
		default:
		}
	}
	r.subMu.Unlock()
}

// Nodes returns the state of every loaded node, in address order.
func (r *Runtime) Nodes() []NodeInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]NodeInfo, 0, len(r.nodes))
	for _, n := range r.nodes {
		info := NodeInfo{
			Addr: n.addr, Builtin: n.decl.Builtin, Shape: n.shape.String(), Height: n.height,
			State: n.state(), Err: n.err, Runs: n.runs, CacheHits: n.hits, Last: n.last,
		}
		for _, in := range n.inputs {
			info.Inputs = append(info.Inputs, in.addr)
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b NodeInfo) int { return cmp.Compare(a.Addr.String(), b.Addr.String()) })
	return out
}

// Close shuts the runtime down: cancels async runs without writing their
// results (they stay pending and resume on the next Load over the same
// store) and closes services with reason Shutdown. It returns when every
// run and service has returned, or when ctx ends.
func (r *Runtime) Close(ctx context.Context) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	var svcs []*node
	for _, pat := range r.patterns {
		svcs = append(svcs, r.detach(pat.nodes)...)
	}
	r.mu.Unlock()
	err := r.closeServices(ctx, svcs, Shutdown)
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return errors.Join(err, fmt.Errorf("close runtime: runs still going: %w", ctx.Err()))
	}
	return err
}

// ErrNotRetryable is returned (wrapped) by Retry for a node it cannot
// retry: not an async node, running, or its last run did not fail.
var ErrNotRetryable = errors.New("nothing to retry")

// ErrNoNode is returned (wrapped) by Retry for an address that is no
// loaded node's output.
var ErrNoNode = errors.New("no such node")

// Retry runs a failed async node again on its current inputs, bypassing
// the memo: a failure whose cause lies outside the inputs (an image built
// later, a flaky network) is otherwise final, since the node reruns only
// when its inputs change. It returns once the run is decided (the node's
// cell says pending: true); the run's outcome arrives like any run's.
func (r *Runtime) Retry(ctx context.Context, addr cells.Address) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	n, ok := r.nodes[addr]
	if !ok {
		return fmt.Errorf("retry %s: %w: it is not the output of a loaded node", addr, ErrNoNode)
	}
	if n.shape != shapeAsync {
		return fmt.Errorf("retry %s: %w: node %s is a %s node, which reruns when its inputs change; retry applies to exec and other async nodes",
			addr, ErrNotRetryable, n.decl.Name, n.kindName())
	}
	if n.cur != 0 {
		return fmt.Errorf("retry %s: %w: node %s is running", addr, ErrNotRetryable, n.decl.Name)
	}
	err := r.batch(n.addr, func(b *batch) error {
		// The stored cell says whether the last run failed (n.err, which
		// Load restores from it, says the same).
		var env envelope
		_ = json.Unmarshal(b.get(n.out).raw, &env)
		if env.Error == nil {
			return fmt.Errorf("retry %s: %w: the last run of node %s did not fail", addr, ErrNotRetryable, n.decl.Name)
		}
		if _, inErr, _, failedUp := b.inputs(n); inErr != "" || failedUp != "" {
			return fmt.Errorf("retry %s: %w: node %s failed because an input did (%s); retry or fix that one",
				addr, ErrNotRetryable, n.decl.Name, cmp.Or(inErr, failedUp))
		}
		// A failed run is never memoized, so forgetting its key makes the
		// decision run it again.
		n.key = ""
		b.enqueue(n)
		return nil
	})
	if err != nil {
		return err
	}
	if n.cur == 0 && n.err != "" {
		return fmt.Errorf("retry %s: it failed again before running: %s", addr, n.err)
	}
	return nil
}
