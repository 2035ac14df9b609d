package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/internal/jsonschema"
)

// node is a loaded node. Its fields are guarded by Runtime.mu. Those a
// batch reads and writes for every node it runs come first, so that a
// propagation through thousands of nodes touches one or two cache lines
// of each, not the whole struct.
type node struct {
	queued    uint64 // id of the batch that last queued it
	changedIn uint64 // id of the batch that last noted its fields (batch.changing)
	// in are the slots of inputs, in their order (set by link); up to
	// two in inBuf, within the node's first cache line rather than in an
	// array of their own.
	in       []*slot
	inBuf    [2]*slot
	out      *slot                    // its output cell
	args     func([]any) (any, error) // compute bound to its inputs' order (BindArgs), or nil
	height   int
	shape    shape
	detached bool // its pattern stopped or the runtime closed
	// waiting: an input (or its inputs, transitively) is an async node
	// with no first result yet, or a service with no output yet; see
	// batch.inputs.
	waiting bool
	runs    int
	err     string
	// failedUp: an input (or its inputs, transitively) is an async node
	// whose last run failed; the reason, or "". See batch.inputs.
	failedUp string
	compute  Compute

	inputs  []input
	addr    cells.Address
	decl    Node
	pat     *pattern
	async   Async
	service Service
	hits    int
	last    time.Duration

	// async
	key     string // key of the current or last run
	pending bool
	run     string // the pending run's name (nodeState.Run), if it does not memoize
	cur     uint64 // id of the run in flight, 0 if none
	cancel  func()

	// service
	svc *service

	// backoff of self-initiated output changes
	changes      []time.Time
	backoffUntil time.Time
	backoffEnd   time.Time
	backoffDelay time.Duration
	held         json.RawMessage
}

func (n *node) kindName() string {
	if n.decl.Builtin != "" {
		return n.decl.Builtin
	}
	return n.shape.String()
}

func (n *node) state() NodeState {
	switch {
	case time.Now().Before(n.backoffUntil):
		return Backoff
	case n.cur != 0 || (n.svc != nil && n.svc.draining):
		return Running
	case n.err != "":
		return Error
	case n.svc != nil && n.svc.open:
		return Open
	}
	return Idle
}

// batch is one store transaction of the scheduler: the triggering writes,
// then every node they make dirty, in height order.
type batch struct {
	r       *Runtime
	tx      cells.Tx
	id      uint64
	queue   *levels // the runtime's
	touched []*slot // slots with a value in this batch
	after   []func()
	status  []Status
	timed   bool   // measure computes (someone is subscribed)
	scratch Inputs // reused for computes
	args    []any  // reused for bound computes (node.args)
	enc     []byte // reused for the JSON of computes' scalar outputs
	// undo restores what processing changed of the nodes, for an attempt
	// run again (see batch): the fields a batch sets on a node, as they
	// were before this attempt first set them.
	undo []nodeFields
}

// nodeFields are the fields of a node that a batch sets while it runs
// (the rest it sets after the commit, in then).
type nodeFields struct {
	n             *node
	waiting       bool
	failedUp, err string
	runs          int
}

// batch runs fn and the propagation it causes in one transaction, then,
// once committed, updates the runtime's copy of the cells and runs the
// post-commit actions. at is a cell of the instance the batch is for: its
// commit carries the instance's fence (Options.Fence). Callers hold r.mu.
func (r *Runtime) batch(at cells.Address, fn func(*batch) error) error {
	r.batchID++
	b := &batch{r: r, id: r.batchID, timed: r.nsubs.Load() > 0, queue: &r.queue, touched: r.touched, undo: r.undo}
	attempts := 0
	ctx := context.Background()
	if r.opts.Fence != nil {
		ctx = r.opts.Fence(ctx, at.Space, at.Pattern)
	}
	err := r.store.Update(ctx, func(tx cells.Tx) error {
		// A store shared with other servers runs fn again when its commit
		// met another's (cells.Store.Update): the attempt starts from what
		// the last commit left, as if the one before had never run.
		if attempts++; attempts > 1 {
			b.restart()
		}
		b.tx = tx
		if err := fn(b); err != nil {
			return err
		}
		for b.queue.n > 0 {
			b.process(b.queue.pop())
		}
		return nil
	})
	b.queue.reset()
	defer func() { // keep the arrays for the next batch, without their slots and nodes
		clear(b.touched)
		r.touched = b.touched[:0]
		clear(b.undo)
		r.undo = b.undo[:0]
	}()
	if err != nil {
		return err
	}
	for _, s := range b.touched {
		s.val, s.known = s.next, true
	}
	for _, f := range b.after {
		f()
	}
	for _, s := range b.status {
		r.emit(s)
	}
	return nil
}

// restart forgets an attempt that was not committed: its staged values
// (a new batch id stages none), queue, post-commit actions and statuses,
// and what it changed of the nodes.
func (b *batch) restart() {
	for i := len(b.undo) - 1; i >= 0; i-- {
		u := b.undo[i]
		u.n.waiting, u.n.failedUp, u.n.err, u.n.runs = u.waiting, u.failedUp, u.err, u.runs
	}
	b.undo = b.undo[:0]
	b.r.batchID++
	b.id = b.r.batchID
	clear(b.touched)
	b.touched = b.touched[:0]
	b.after, b.status = b.after[:0], b.status[:0]
	b.queue.reset()
}

// changing notes a node's fields before the batch first changes them.
func (b *batch) changing(n *node) {
	if n.changedIn != b.id {
		n.changedIn = b.id
		b.undo = append(b.undo, nodeFields{n: n, waiting: n.waiting, failedUp: n.failedUp, err: n.err, runs: n.runs})
	}
}

func (b *batch) then(f func()) { b.after = append(b.after, f) }

// get returns a cell's value as of this batch.
// It points into the slot: read it before the slot is staged again.
func (b *batch) get(s *slot) *value {
	if s.nextID == b.id {
		return &s.next
	}
	if s.known {
		return &s.val
	}
	v := value{raw: nullValue}
	if c, err := b.tx.Get(s.addr); err == nil {
		v.raw, v.err = c.Value, c.Error
	} else if errors.Is(err, cells.ErrNotFound) {
		v.missing = true
	}
	b.stage(s, v)
	return &s.next
}

// stage gives a slot its value in this batch; the commit makes it current.
func (b *batch) stage(s *slot, v value) {
	if s.nextID != b.id {
		s.nextID = b.id
		b.touched = append(b.touched, s)
	}
	s.next = v
}

// set writes a value (compacting it unless compact is known) and marks the
// cell's readers dirty if it changed.
func (b *batch) set(s *slot, raw json.RawMessage) (bool, error) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return false, fmt.Errorf("set %s: value is not JSON: %w", s.addr, err)
	}
	return b.setCompact(s, buf.Bytes())
}

func (b *batch) setCompact(s *slot, raw json.RawMessage) (bool, error) {
	return b.setValue(s, value{raw: raw})
}

// setValue writes v.raw (compact JSON); v may carry its decoded form
// already (see decodedAs), which spares its readers a decode. v.raw is
// not kept: the slot keeps the store's copy.
func (b *batch) setValue(s *slot, v value) (bool, error) {
	raw := v.raw
	cur := b.get(s)
	if !cur.missing && cur.err == "" && bytes.Equal(cur.raw, raw) {
		return false, nil // early cutoff
	}
	if s.ref == nil {
		ref, err := cells.NewRef(s.addr)
		if err != nil {
			return false, err
		}
		s.ref = ref
	}
	stored, changed, err := b.tx.SetRefStored(s.ref, raw)
	if err != nil || !changed {
		return changed, err
	}
	v.raw = stored // raw may be the batch's scratch (compute)
	b.stage(s, v)
	b.mark(s)
	return true, nil
}

// setError marks a cell failed (keeping its value) or, with "", clears it.
func (b *batch) setError(s *slot, msg string) {
	cur := b.get(s)
	if cur.err == msg {
		return
	}
	changed, err := b.tx.SetError(s.addr, msg)
	if err != nil {
		b.r.log.Error("write node error", "cell", s.addr.String(), "error", err)
		return
	}
	if changed {
		b.stage(s, value{raw: cur.raw, err: msg, decoded: cur.decoded, val: cur.val})
		b.mark(s)
	}
}

// mark queues the readers of s.
func (b *batch) mark(s *slot) {
	for _, d := range s.readers {
		b.enqueue(d)
	}
}

func (b *batch) enqueue(n *node) {
	if !n.detached && n.queued != b.id {
		n.queued = b.id
		b.queue.push(n)
	}
}

// inputs returns a node's inputs, or the error of the first failed one.
// A compute gets the batch's scratch map; others keep theirs. A bound
// compute (node.args) gets none: its values are in b.args, in the order of
// its inputs.
//
// waiting is true when an input is an async node that has no first result
// yet (never run, or its first run still pending), a service whose output
// is still null (not opened yet: a sandbox node before its box is asked
// for), or is itself waiting.
// A waiting compute still runs (it may show job.pending) but a failure is
// not an error: reading result.files of a null result is just early. A
// waiting async node does not run at all: it would run on inputs that are
// not there yet. Either is marked again when its inputs stop waiting.
//
// failedUp names an async input whose last run failed (its envelope has an
// error), directly or through other nodes. A compute still sees the
// envelope (it may show compile.error); an async node does not run on the
// partial result of a failure: it fails with "upstream X failed: ...".
func (b *batch) inputs(n *node) (in Inputs, inErr string, waiting bool, failedUp string) {
	switch {
	case n.args != nil:
		b.args = slices.Grow(b.args[:0], len(n.inputs))[:len(n.inputs)]
	case n.shape == shapeCompute:
		if b.scratch == nil {
			b.scratch = make(Inputs, len(n.inputs))
		}
		in = b.scratch
		clear(in)
	default:
		in = make(Inputs, len(n.inputs))
	}
	for k, s := range n.in {
		v := b.get(s)
		if v.err != "" {
			return nil, upstream(n.inputs[k], v.err), false, ""
		}
		x := v.get()
		if n.args != nil {
			b.args[k] = x
		} else {
			in[n.inputs[k].name] = x
		}
		p := s.producer
		if p == nil {
			continue
		}
		if p.waiting || p.shape == shapeAsync && noResultYet(x) || p.shape == shapeService && x == nil {
			waiting = true
		}
		if failedUp == "" {
			if msg, ok := runError(p, x); ok {
				failedUp = upstream(n.inputs[k], msg)
			} else if p.failedUp != "" {
				failedUp = p.failedUp
			}
		}
	}
	return in, "", waiting, failedUp
}

// runError returns the error of an async node's last run, from its output
// envelope.
func runError(p *node, v any) (string, bool) {
	if p.shape != shapeAsync {
		return "", false
	}
	env, _ := v.(map[string]any)
	msg, ok := env["error"].(string)
	return msg, ok
}

// noResultYet reports whether an async node's output cell holds no result
// to show: it was never written, or its first run is in flight.
func noResultYet(v any) bool {
	if v == nil {
		return true
	}
	env, ok := v.(map[string]any)
	return ok && env["pending"] == true && env["result"] == nil && env["error"] == nil
}

// upstream names the failure a node inherits from an input, keeping the
// origin when the input itself inherited it.
func upstream(i input, err string) string {
	if strings.HasPrefix(err, "upstream ") {
		return err
	}
	return fmt.Sprintf("upstream %s failed: %s", i.name, err)
}

func (b *batch) process(n *node) {
	in, inErr, waiting, failedUp := b.inputs(n)
	b.changing(n)
	if n.waiting && !waiting || n.failedUp != failedUp {
		b.mark(n.out) // readers waiting or failing through n may go on, changed output or not
	}
	n.waiting, n.failedUp = waiting, failedUp
	switch n.shape {
	case shapeCompute:
		b.compute(n, in, inErr, waiting)
	case shapeAsync:
		if inErr == "" && failedUp != "" {
			inErr = failedUp
		}
		b.decideAsync(n, in, inErr, waiting)
	case shapeService:
		if inErr == "" {
			b.then(func() { b.r.updateService(n, in) })
		}
	}
}

func (b *batch) compute(n *node, in Inputs, inErr string, waiting bool) {
	var start time.Time
	if b.timed {
		start = time.Now()
	}
	var err error
	if inErr != "" {
		err = errors.New(inErr)
	} else {
		var out any
		if n.args != nil {
			out, err = safeArgs(n.args, b.args)
			clear(b.args) // no values kept past the compute
		} else {
			out, err = safeCompute(n.compute, in)
		}
		if err == nil {
			// A scalar is written into the batch's buffer: the store
			// copies it into the cell's record, and the slot keeps that.
			raw, ok := appendScalar(b.enc[:0], out)
			if ok {
				b.enc = raw
			} else {
				raw, err = encode(out)
			}
			if err == nil {
				_, err = b.setValue(n.out, decodedAs(raw, out))
			}
		}
		n.runs++
	}
	if err != nil && waiting {
		return // an input's first result is still coming; it marks n again
	}
	if err != nil {
		n.err = err.Error()
		b.setError(n.out, n.err)
	} else {
		n.err = ""
	}
	if b.timed {
		n.last = time.Since(start)
		s := Status{Node: n.addr, Kind: Finished, Duration: n.last}
		if err != nil {
			s.Kind, s.Err = Failed, n.err
		}
		b.status = append(b.status, s)
	}
}

// load declares a pattern's cells and queues all its nodes. The store's
// cells of the instance are first made to fit the pattern (reconcile); an
// input cell kept from before whose value its schema now refuses starts
// again from its initial value.
func (b *batch) load(pat *pattern, p Pattern) error {
	addr := func(name string) cells.Address { return cells.Address{Space: p.Space, Pattern: p.Name, Name: name} }
	if err := b.reconcile(pat, p); err != nil {
		return err
	}
	for _, c := range p.Cells {
		a := addr(c.Name)
		stored, err := b.tx.Get(a)
		existed := err == nil
		if existed && !c.Stream && len(c.Schema) > 0 && string(stored.Value) != "null" {
			// A value the cell's schema now refuses (the schema changed
			// since it was written) would fail every reader and could not
			// be written back: the cell starts again from its initial
			// value. A value that still fits is kept.
			if verr := jsonschema.Validate(c.Schema, stored.Value); errors.Is(verr, jsonschema.ErrMismatch) {
				if err := b.reset(a, fmt.Sprintf("its stored value %s does not satisfy the cell's schema (%s): replaced by the initial value",
					clipValue(stored.Value), violations(verr))); err != nil {
					return fmt.Errorf("cell %s: %w", c.Name, err)
				}
				existed = false
			}
		}
		if err := b.tx.Declare(a, cells.Spec{Schema: c.Schema, Stream: c.Stream}); err != nil {
			return fmt.Errorf("cell %s: %w", c.Name, err)
		}
		if !existed && !c.Stream && c.Initial != nil {
			if _, err := b.set(b.r.slotFor(a), c.Initial); err != nil {
				return fmt.Errorf("cell %s: initial value: %w", c.Name, err)
			}
		}
	}
	nodes := b.tx.Meta(bucketNodes)
	for _, n := range pat.nodes {
		if err := b.tx.Declare(n.addr, cells.Spec{Schema: n.decl.Schema}); err != nil {
			return fmt.Errorf("node %s: output cell: %w", n.decl.Name, err)
		}
		for _, s := range n.decl.Streams {
			if err := b.tx.Declare(streamAddr(n, s), cells.Spec{Stream: true}); err != nil {
				return fmt.Errorf("node %s: stream %s: %w", n.decl.Name, s, err)
			}
		}
		if n.shape == shapeAsync {
			if raw, ok := nodes.Get(n.addr.String()); ok {
				var st nodeState
				if err := json.Unmarshal(raw, &st); err == nil {
					n.key, n.pending, n.run = st.Key, st.Pending, st.Run
				}
			}
			// A failure an earlier process stored stands until the node
			// runs again: Nodes reports it, as it did before the restart.
			var env envelope
			if json.Unmarshal(b.get(n.out).raw, &env) == nil && env.Error != nil && !n.pending {
				n.err = *env.Error
			}
		}
		b.enqueue(n)
	}
	return nil
}

// encode marshals a node's output: a json.RawMessage is validated and
// compacted, anything else is encoded as json.Marshal would, without
// escaping HTML characters.
func encode(v any) (json.RawMessage, error) {
	if raw, ok := v.(json.RawMessage); ok {
		var buf bytes.Buffer
		if err := json.Compact(&buf, raw); err != nil {
			return nil, fmt.Errorf("output is not JSON: %w", err)
		}
		return buf.Bytes(), nil
	}
	if raw, ok := encodeScalar(v); ok {
		return raw, nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // keep "<", ">" and "&" readable
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("output cannot be stored as JSON: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// encodeScalar encodes the outputs most computes return (numbers, bools,
// null) without an encoder: byte for byte what encode's json.Encoder
// writes, at a fraction of its cost on the propagation path. It reports
// false for anything else (strings, collections, floats that JSON writes
// with an exponent or cannot write), which take the encoder.
func encodeScalar(v any) (json.RawMessage, bool) {
	switch v.(type) {
	case nil:
		return json.RawMessage("null"), true
	case bool:
		if v.(bool) {
			return json.RawMessage("true"), true
		}
		return json.RawMessage("false"), true
	}
	return appendScalar(make([]byte, 0, 16), v)
}

// appendScalar appends what encodeScalar returns to dst.
func appendScalar(dst []byte, v any) (json.RawMessage, bool) {
	switch x := v.(type) {
	case nil:
		return append(dst, "null"...), true
	case bool:
		if x {
			return append(dst, "true"...), true
		}
		return append(dst, "false"...), true
	case int:
		return strconv.AppendInt(dst, int64(x), 10), true
	case int64:
		return strconv.AppendInt(dst, x, 10), true
	case float64:
		if exactInt(x) { // as 'f' writes it, without the shortest-digits search
			return strconv.AppendInt(dst, int64(x), 10), true
		}
		// encoding/json writes 'f' format in [1e-6, 1e21) and 0.
		if a := math.Abs(x); a == 0 || a >= 1e-6 && a < 1e21 {
			return strconv.AppendFloat(dst, x, 'f', -1, 64), true
		}
	}
	return nil, false
}

// decodedAs returns the value of a compute's output: raw, and out as its
// decoded form when decode(raw) would give out back (ints, bools, null),
// so a chain of computes does not parse what it has just written.
//
// A float decodes as itself when it has a fraction (its shortest digits
// parse back to it), and as an int when it is a whole number that an int
// holds exactly ((l + r) / 2 of ints gives a float).
func decodedAs(raw json.RawMessage, out any) value {
	switch x := out.(type) {
	case nil, int, bool:
		return value{raw: raw, decoded: true, val: out}
	case float64:
		if exactInt(x) {
			return value{raw: raw, decoded: true, val: int(x)}
		}
		if x != math.Trunc(x) && !math.IsNaN(x) {
			return value{raw: raw, decoded: true, val: x}
		}
	}
	return value{raw: raw}
}

// exactInt reports whether x is a whole number below 2^53 in magnitude
// (so an int64 holds it exactly), not -0 (which JSON writes as "-0").
func exactInt(x float64) bool {
	return x == math.Trunc(x) && math.Abs(x) < 1<<53 && !(x == 0 && math.Signbit(x))
}

func safeCompute(c Compute, in Inputs) (out any, err error) {
	defer recoverTo(&err)
	return c.Compute(in)
}

func safeArgs(f func([]any) (any, error), args []any) (out any, err error) {
	defer recoverTo(&err)
	return f(args)
}

func recoverTo(err *error) {
	if p := recover(); p != nil {
		*err = fmt.Errorf("panic: %v", p)
	}
}

// levels is the batch's queue of nodes to run, by height: a bucket per
// height, run lowest first, in the order queued within one. A node queues
// only nodes above it (its readers), so a batch drains level after level
// with O(1) pushes and pops, where a heap cost O(log n) comparisons of
// scattered nodes each. The buckets are the runtime's, reused by every
// batch (batches hold r.mu, one at a time).
//
// A node pushed on an empty queue waits in one, outside the buckets, until
// it is popped or another comes: a chain (each node queues the next, then
// the queue is empty again) never touches a bucket, which cost two cache
// misses per node (the bucket and its array) in a chain of thousands.
type levels struct {
	by  []level
	cur int   // no queued node is below this height
	n   int   // nodes queued
	one *node // the one node queued, when it is in no bucket
}

type level struct {
	nodes []*node
	head  int // nodes[:head] have run
}

func (q *levels) push(n *node) {
	if q.n == 0 {
		q.one, q.n = n, 1
		return
	}
	if one := q.one; one != nil { // a second node: the first to its bucket
		q.one, q.n = nil, 0
		q.bucket(one)
	}
	q.bucket(n)
}

// bucket queues n in the bucket of its height.
func (q *levels) bucket(n *node) {
	h := n.height
	if h >= len(q.by) {
		q.by = append(q.by, make([]level, h+1-len(q.by))...)
	}
	q.by[h].nodes = append(q.by[h].nodes, n)
	if q.n == 0 || h < q.cur {
		q.cur = h
	}
	q.n++
}

// pop returns the next node to run; the queue must not be empty.
func (q *levels) pop() *node {
	if n := q.one; n != nil {
		q.one, q.n = nil, 0
		return n
	}
	for {
		l := &q.by[q.cur]
		if l.head < len(l.nodes) {
			n := l.nodes[l.head]
			l.head++
			q.n--
			if l.head == len(l.nodes) {
				l.drain()
			}
			return n
		}
		q.cur++
	}
}

// drain empties a level, keeping its array for the next batch but not
// the nodes in it (a stopped pattern's nodes can then be collected).
func (l *level) drain() {
	clear(l.nodes)
	l.nodes, l.head = l.nodes[:0], 0
}

// reset empties the queue a failed batch left behind.
func (q *levels) reset() {
	if q.n == 0 {
		return
	}
	for i := range q.by {
		q.by[i].drain()
	}
	q.n, q.cur, q.one = 0, 0, nil
}
