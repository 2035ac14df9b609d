package runtime

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cellbox/cellbox/cells"
)

// nodeState is an async node's durable state (bucket runtime.nodes).
type nodeState struct {
	Key     string `json:"key"`
	Pending bool   `json:"pending"`
	// Run names a pending run of a node that does not memoize (cache:
	// false): its steps are kept under it, so that the same run, started
	// again after a restart, recalls them (RecallStep), and a later run
	// of the same inputs does not.
	Run string `json:"run,omitempty"`
}

// envelope is an async node's output cell.
type envelope struct {
	Pending bool            `json:"pending"`
	Result  json.RawMessage `json:"result"`
	Error   *string         `json:"error"`
}

// decideAsync brings an async node up to date in the batch: nothing to do,
// a memo hit written now, or a run decided now (pending:true) and started
// after the commit.
func (b *batch) decideAsync(n *node, in Inputs, inErr string, waiting bool) {
	if inErr != "" {
		b.failAsync(n, inErr)
		return
	}
	if waiting {
		return // an input's first result is still coming; it marks n again
	}
	key, memo, err := safeKey(n.async, in)
	if err != nil {
		b.failAsync(n, err.Error())
		return
	}
	if key == "" {
		key = b.inputsHash(n)
	}
	if key == n.key && (!n.pending || n.cur != 0) {
		return // finished for these inputs, or running for them
	}
	if memo {
		res, ok, err := b.r.memo(b.tx).get(key)
		if err != nil {
			b.r.log.Warn("read the memo cache; running instead", "node", n.addr.String(), "error", err)
		}
		if ok {
			b.writeAsync(n, envelope{Result: res}, key, false, "")
			b.status = append(b.status, Status{Node: n.addr, Kind: Cached})
			b.then(func() {
				n.abort()
				n.key, n.pending, n.err = key, false, ""
				n.hits++
			})
			return
		}
	}
	// While the new run is pending, the cell keeps the last run's result
	// with that run's error: a failed run's partial result must not pass
	// for a success (error null) until the new run ends.
	var prev envelope
	_ = json.Unmarshal(b.get(n.out).raw, &prev)
	// A run that does not memoize keeps its steps under a name of its
	// own: the one it had when it is the same pending run started again
	// (a restart), a new one for a new run.
	run := ""
	if !memo {
		run = n.run
		if key != n.key || !n.pending || run == "" {
			run = newRunName()
		}
	}
	b.writeAsync(n, envelope{Pending: true, Result: prev.Result, Error: prev.Error}, key, true, run)
	b.then(func() {
		n.abort()
		n.key, n.pending, n.run = key, true, run
		b.r.startRun(n, key, memo, in)
	})
}

// newRunName names a run that does not memoize (nodeState.Run).
func newRunName() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// failAsync fails n without running it (an input failed, or Key did). A
// node that already stands failed this way with the same message is left
// as it is: an input that changes again (a sandbox node going from
// starting to running) must not report the same failure once per change.
func (b *batch) failAsync(n *node, msg string) {
	if n.key == "" && !n.pending && n.cur == 0 && n.err == msg {
		return
	}
	b.writeAsync(n, envelope{Error: &msg}, "", false, "")
	b.status = append(b.status, Status{Node: n.addr, Kind: Failed, Err: msg})
	b.then(func() {
		n.abort()
		n.key, n.pending, n.err = "", false, msg
	})
}

// writeAsync writes an async node's output and durable state (run: the
// pending run's name, nodeState.Run).
func (b *batch) writeAsync(n *node, env envelope, key string, pending bool, run string) {
	raw, err := encode(env)
	if err == nil {
		_, err = b.setCompact(n.out, raw)
	}
	if err != nil {
		b.setError(n.out, err.Error())
	}
	st, _ := json.Marshal(nodeState{Key: key, Pending: pending, Run: run})
	if err := b.tx.Meta(bucketNodes).Put(n.addr.String(), st); err != nil {
		b.r.log.Error("save node state", "node", n.addr.String(), "error", err)
	}
}

// inputsHash is the key of a node that gives none: a hash of its inputs.
func (b *batch) inputsHash(n *node) string {
	h := sha256.New()
	for _, i := range n.inputs {
		h.Write([]byte(i.name))
		h.Write([]byte{0})
		h.Write(b.get(i.slot).raw)
		h.Write([]byte{0})
	}
	return "inputs:" + hex.EncodeToString(h.Sum(nil))
}

// abort cancels the node's run in flight, if any; its result is dropped.
func (n *node) abort() {
	if n.cancel != nil {
		n.cancel()
	}
	n.cur, n.cancel = 0, nil
}

// startRun starts a decided run. Callers hold r.mu.
func (r *Runtime) startRun(n *node, key string, memo bool, in Inputs) {
	r.runID++
	id := r.runID
	ctx, cancel := context.WithCancel(context.Background())
	ctx = context.WithValue(ctx, progressKey{}, func(v any) error { return r.progress(n, id, key, v) })
	if memo {
		ctx = context.WithValue(ctx, stepsKey{}, steps{r: r})
	} else if n.run != "" {
		ctx = context.WithValue(ctx, stepsKey{}, steps{r: r, run: n.run + ":"})
	}
	n.cur, n.cancel = id, cancel
	r.begin()
	r.wg.Add(1)
	r.emit(Status{Node: n.addr, Kind: Started})
	go func() {
		defer r.wg.Done()
		start := time.Now()
		res, err := safeRun(ctx, n.async, in)
		r.finishRun(n, id, key, memo, res, err, time.Since(start))
		cancel()
	}()
}

type progressKey struct{}

// Progress publishes a partial result of the async run whose context ctx
// is (an llm answer growing as it streams): the node's cell becomes
// {pending: true, result: v}. It is dropped when the run is no longer the
// node's current one (aborted), so a stale run never shows. Outside an
// async run it does nothing. Each call is a store write: callers throttle.
func Progress(ctx context.Context, v any) error {
	if f, ok := ctx.Value(progressKey{}).(func(any) error); ok && ctx.Err() == nil {
		return f(v)
	}
	return nil
}

func (r *Runtime) progress(n *node, id uint64, key string, v any) error {
	raw, err := encode(v)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if n.cur != id || n.detached || r.closed {
		return nil
	}
	return r.batch(n.addr, func(b *batch) error {
		b.writeAsync(n, envelope{Pending: true, Result: raw}, key, true, n.run)
		return nil
	})
}

type stepsKey struct{}

// steps is where a run's steps are kept: the memo cache, under their keys
// (a memoizing run: the same inputs recall them, at a restart or a
// revert), or under the run's name and their keys (one that does not:
// only the same run, started again, recalls them).
type steps struct {
	r   *Runtime
	run string
}

// RecallStep returns what RememberStep stored under key, for an async run
// made of steps (an llm tool loop's model calls and tool calls): a run
// started again — after a restart, or a revert — skips the steps that
// finished. Steps share the memo cache (and its size limit) with results;
// a node whose Key says memo: false has none (ok is false).
func RecallStep(ctx context.Context, key string) (raw json.RawMessage, ok bool) {
	st, _ := ctx.Value(stepsKey{}).(steps)
	r := st.r
	if r == nil {
		return nil, false
	}
	err := r.store.Update(ctx, func(tx cells.Tx) error {
		var err error
		raw, ok, err = r.memo(tx).get(st.run + key)
		return err
	})
	if err != nil {
		r.log.Warn("recall a step; doing it again", "key", key, "error", err)
		return nil, false
	}
	return raw, ok
}

// RememberStep stores a finished step's value under key (see RecallStep).
func RememberStep(ctx context.Context, key string, v any) error {
	st, _ := ctx.Value(stepsKey{}).(steps)
	r := st.r
	if r == nil {
		return nil
	}
	raw, err := encode(v)
	if err != nil {
		return err
	}
	return r.store.Update(context.WithoutCancel(ctx), func(tx cells.Tx) error { return r.memo(tx).put(st.run+key, raw) })
}

// storeRetries are the pauses between attempts to store a run's result
// when the store refuses the write (a full disk, an I/O error): a run's
// result is not dropped on a passing failure.
var storeRetries = []time.Duration{10 * time.Millisecond, 100 * time.Millisecond, time.Second}

// finishRun writes a run's result if the run is still the node's current
// one, retrying a write the store refuses; when every attempt fails, the
// node's cell says so (an error, no longer pending).
func (r *Runtime) finishRun(n *node, id uint64, key string, memo bool, res any, runErr error, d time.Duration) {
	env := envelope{}
	var raw json.RawMessage
	if runErr == nil {
		raw, runErr = encode(res)
	}
	if runErr != nil {
		msg := runErr.Error()
		env.Error = &msg
		// A failure may carry what the run did produce (an exec's stdout
		// and exit code): keep it beside the error, never in the memo.
		var partial interface{ PartialResult() any }
		if errors.As(runErr, &partial) {
			if p, err := encode(partial.PartialResult()); err == nil {
				env.Result = p
			}
		}
	} else {
		env.Result = raw
	}
	for attempt := 0; !r.storeRun(n, id, key, memo && runErr == nil, env, raw, runErr, d, attempt == len(storeRetries)); attempt++ {
		time.Sleep(storeRetries[attempt])
	}
}

// storeRun is one attempt of finishRun. It returns false when the store
// refused the write and another attempt is due; on the last attempt a
// refused write is replaced by an error in the node's cell.
func (r *Runtime) storeRun(n *node, id uint64, key string, memo bool, env envelope, raw json.RawMessage, runErr error, d time.Duration, last bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n.cur != id || n.detached || r.closed {
		r.emit(Status{Node: n.addr, Kind: Aborted, Duration: d})
		r.end()
		return true
	}
	err := r.batch(n.addr, func(b *batch) error {
		b.writeAsync(n, env, key, false, "")
		if memo {
			if err := r.memo(b.tx).put(key, raw); err != nil {
				return fmt.Errorf("memoize %s: %w", n.addr, err)
			}
		}
		return nil
	})
	if err != nil && !last {
		r.log.Warn("store a run's result; trying again", "node", n.addr.String(), "error", err)
		return false
	}
	defer r.end()
	n.cur, n.cancel = 0, nil
	if err != nil {
		msg := fmt.Sprintf("store the run's result: %v (retry the node once the store takes writes again)", err)
		if werr := r.batch(n.addr, func(b *batch) error { b.writeAsync(n, envelope{Error: &msg}, key, false, ""); return nil }); werr != nil {
			// Nothing can be written: the cell stays pending and the run
			// runs again on the next start; the node's state says why.
			msg += fmt.Sprintf("; storing this error failed too (%v): the run stays pending and runs again on the next start", werr)
		} else {
			n.pending = false
		}
		n.err = msg
		r.emit(Status{Node: n.addr, Kind: Failed, Duration: d, Err: n.err})
		return true
	}
	n.pending, n.last = false, d
	n.runs++
	s := Status{Node: n.addr, Kind: Finished, Duration: d}
	if runErr != nil {
		n.err = runErr.Error()
		s.Kind, s.Err = Failed, n.err
	} else {
		n.err = ""
	}
	r.emit(s)
	return true
}

func safeKey(a Async, in Inputs) (key string, memo bool, err error) {
	defer recoverTo(&err)
	return a.Key(in)
}

func safeRun(ctx context.Context, a Async, in Inputs) (out any, err error) {
	defer recoverTo(&err)
	return a.Run(ctx, in)
}
