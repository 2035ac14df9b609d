package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cellbox/cellbox/cells"
)

// service is the runtime's side of an open Service. Guarded by Runtime.mu.
type service struct {
	ctx      context.Context // cancelled when the service is closed
	cancel   context.CancelFunc
	calls    sync.WaitGroup // Open, Update and Event calls in flight
	open     bool
	closing  bool // no more calls
	finished bool // Close returned: the handle is dead
	latest   Inputs
	stale    bool // latest not yet delivered
	updating bool
	draining bool
}

// openService opens a service node in the background. Callers hold r.mu.
func (r *Runtime) openService(n *node) {
	s := &service{}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	n.svc = s
	in := r.currentInputs(n)
	r.begin()
	r.goService(s, func() {
		start := time.Now()
		err := safeOpen(s.ctx, n.service, &handle{r: r, n: n}, in)
		r.mu.Lock()
		defer r.mu.Unlock()
		defer r.end()
		if err != nil {
			n.err = fmt.Sprintf("open: %v", err)
			r.emit(Status{Node: n.addr, Kind: Failed, Duration: time.Since(start), Err: n.err})
			if berr := r.batch(n.addr, func(b *batch) error { b.setError(n.out, n.err); return nil }); berr != nil {
				r.log.Error("write node error", "node", n.addr.String(), "error", berr)
			}
			return
		}
		s.open = true
		if s.closing {
			return
		}
		r.emit(Status{Node: n.addr, Kind: Opened, Duration: time.Since(start)})
		if s.stale {
			r.startUpdates(n)
		}
		r.kickEvents(n)
	})
}

// currentInputs returns a node's inputs as committed (failed inputs read as
// their last value). Callers hold r.mu.
func (r *Runtime) currentInputs(n *node) Inputs {
	in := make(Inputs, len(n.inputs))
	for _, i := range n.inputs {
		if s := i.slot; s.known {
			in[i.name] = s.val.get()
		} else {
			in[i.name] = nil
		}
	}
	return in
}

// updateService hands a service its new inputs. Callers hold r.mu.
func (r *Runtime) updateService(n *node, in Inputs) {
	s := n.svc
	if s == nil || s.closing {
		return
	}
	s.latest, s.stale = in, true
	if s.open && !s.updating {
		r.startUpdates(n)
	}
}

// startUpdates delivers the latest inputs until none are left, coalescing.
// Callers hold r.mu.
func (r *Runtime) startUpdates(n *node) {
	s := n.svc
	s.updating = true
	r.begin()
	r.goService(s, func() {
		for {
			r.mu.Lock()
			if !s.stale || s.closing {
				s.updating = false
				r.end()
				r.mu.Unlock()
				return
			}
			in := s.latest
			s.stale = false
			r.mu.Unlock()
			start := time.Now()
			if err := safeUpdate(s.ctx, n.service, in); err != nil {
				r.emit(Status{Node: n.addr, Kind: Failed, Duration: time.Since(start), Err: fmt.Sprintf("update: %v", err)})
			}
		}
	})
}

// kickEvents starts delivering a service's queued events. Callers hold
// r.mu.
func (r *Runtime) kickEvents(n *node) {
	s := n.svc
	if s == nil || !s.open || s.closing || s.draining {
		return
	}
	s.draining = true
	r.begin()
	r.goService(s, func() {
		for {
			stream, ev, ok := r.claim(n)
			if !ok {
				return
			}
			start := time.Now()
			st := Status{Node: n.addr, Kind: Finished, Stream: stream}
			if err := safeEvent(s.ctx, n.service, stream, ev); err != nil {
				st.Kind, st.Err = Failed, fmt.Sprintf("event %d on %s: %v", ev.ID, stream, err)
			}
			st.Duration = time.Since(start)
			r.emit(st)
		}
	})
}

// claim acks the oldest event queued on the service's streams, with the
// service's Accept writes, in one batch. When none is left it ends the
// drain.
func (r *Runtime) claim(n *node) (string, cells.Event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := n.svc
	for !s.closing {
		var (
			stream string
			ev     cells.Event
			found  bool
			reject error
		)
		err := r.batch(n.addr, func(b *batch) error {
			for _, name := range n.decl.Streams {
				evs, err := b.tx.Events(streamAddr(n, name))
				if err != nil {
					return err
				}
				if len(evs) > 0 && (!found || evs[0].ID < ev.ID) {
					stream, ev, found = name, evs[0], true
				}
			}
			if !found {
				return nil
			}
			if err := b.tx.Ack(streamAddr(n, stream), ev.ID); err != nil {
				return err
			}
			acc, ok := n.service.(EventAcceptor)
			if !ok {
				return nil
			}
			out, err := safeAccept(acc, stream, ev, b.get(n.out).raw)
			if err == nil && out != nil {
				var raw json.RawMessage
				if raw, err = encode(out); err == nil {
					_, err = b.setCompact(n.out, raw)
				}
			}
			reject = err
			return nil
		})
		if err != nil {
			r.emit(Status{Node: n.addr, Kind: Failed, Err: fmt.Sprintf("take the next event: %v", err)})
			break
		}
		if !found {
			break
		}
		if reject != nil {
			r.emit(Status{Node: n.addr, Kind: Failed, Stream: stream, Err: fmt.Sprintf("event %d on %s refused: %v", ev.ID, stream, reject)})
			continue
		}
		return stream, ev, true
	}
	s.draining = false
	r.end()
	return "", cells.Event{}, false
}

// closeServices closes the given services: no more calls, the calls in
// flight cancelled and awaited, then Close.
func (r *Runtime) closeServices(ctx context.Context, nodes []*node, reason CloseReason) error {
	var errs []error
	for _, n := range nodes {
		s := n.svc
		r.mu.Lock()
		s.closing = true
		r.mu.Unlock()
		s.cancel()
		done := make(chan struct{})
		go func() { s.calls.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("close %s: its calls did not return: %w", n.addr, ctx.Err()))
			continue
		}
		r.mu.Lock()
		opened := s.open
		r.mu.Unlock()
		if !opened { // Open failed: nothing to close
			r.mu.Lock()
			s.finished = true
			r.mu.Unlock()
			continue
		}
		start := time.Now()
		err := safeClose(ctx, n.service, reason)
		r.mu.Lock()
		s.finished, s.open = true, false
		r.mu.Unlock()
		st := Status{Node: n.addr, Kind: Closed, Duration: time.Since(start)}
		if err != nil {
			err = fmt.Errorf("close %s (%s): %w", n.addr, reason, err)
			st.Kind, st.Err = Failed, err.Error()
			errs = append(errs, err)
		}
		r.emit(st)
	}
	return errors.Join(errs...)
}

// handle implements Handle.
type handle struct {
	r *Runtime
	n *node
}

func (h *handle) Addr() cells.Address { return h.n.addr }

func (h *handle) Logger() *slog.Logger { return h.r.log.With("node", h.n.addr.String()) }

func (h *handle) Get() (json.RawMessage, error) {
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	if s := h.n.out; s.known {
		return append(json.RawMessage(nil), s.val.raw...), nil
	}
	c, err := h.r.store.Get(context.Background(), h.n.addr)
	return c.Value, err
}

func (h *handle) Set(ctx context.Context, v any) error {
	raw, err := encode(v)
	if err != nil {
		return fmt.Errorf("set %s: %w", h.n.addr, err)
	}
	return h.r.write(h.n, func(json.RawMessage) (any, error) { return raw, nil })
}

func (h *handle) Modify(ctx context.Context, fn func(cur json.RawMessage) (any, error)) error {
	return h.r.write(h.n, fn)
}

func (h *handle) State() (json.RawMessage, error) {
	var out json.RawMessage
	err := h.r.store.View(context.Background(), func(tx cells.Tx) error {
		out, _ = tx.Meta(bucketServices).Get(h.n.addr.String())
		return nil
	})
	return out, err
}

func (h *handle) SaveState(v any) error {
	raw, err := encode(v)
	if err != nil {
		return fmt.Errorf("save state of %s: %w", h.n.addr, err)
	}
	return h.r.store.Update(context.Background(), func(tx cells.Tx) error {
		return tx.Meta(bucketServices).Put(h.n.addr.String(), raw)
	})
}

// write applies a service's write to its output cell, unless the node is
// backing off, in which case the value is held back until the backoff ends.
func (r *Runtime) write(n *node, fn func(cur json.RawMessage) (any, error)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n.svc == nil || n.svc.finished {
		return fmt.Errorf("write %s: the service is closed", n.addr)
	}
	now := time.Now()
	cur := n.held
	if cur == nil {
		if s := n.out; s.known {
			cur = s.val.raw
		} else if c, err := r.store.Get(context.Background(), n.addr); err == nil {
			// Nothing has read the cell since the runtime started: what a
			// service modifies (a history) is the stored value, not null.
			cur = c.Value
		}
	}
	out, err := fn(cur)
	if err != nil || out == nil {
		return err
	}
	raw, err := encode(out)
	if err != nil {
		return fmt.Errorf("write %s: %w", n.addr, err)
	}
	if now.Before(n.backoffUntil) {
		n.held = raw
		return nil
	}
	var changed bool
	if err := r.batch(n.addr, func(b *batch) error {
		var err error
		changed, err = b.setCompact(n.out, raw)
		return err
	}); err != nil {
		return fmt.Errorf("write %s: %w", n.addr, err)
	}
	if changed {
		r.countChange(n, now)
	}
	return nil
}

// countChange backs a node off when it changed its output more than
// MaxChanges times within ChangeWindow. Callers hold r.mu.
func (r *Runtime) countChange(n *node, now time.Time) {
	cutoff := now.Add(-r.opts.ChangeWindow)
	i := 0
	for i < len(n.changes) && n.changes[i].Before(cutoff) {
		i++
	}
	n.changes = append(n.changes[i:], now)
	if len(n.changes) <= r.opts.MaxChanges {
		return
	}
	delay := r.opts.MinBackoff
	if n.backoffDelay > 0 && now.Sub(n.backoffEnd) < r.opts.MaxBackoff {
		delay = min(2*n.backoffDelay, r.opts.MaxBackoff)
	}
	n.backoffDelay, n.backoffUntil = delay, now.Add(delay)
	n.err = fmt.Sprintf("node %s changed its output %d times within %s: holding its writes back for %s",
		n.decl.Name, len(n.changes), r.opts.ChangeWindow, delay)
	n.changes = nil
	if err := r.batch(n.addr, func(b *batch) error { b.setError(n.out, n.err); return nil }); err != nil {
		r.log.Error("write node error", "node", n.addr.String(), "error", err)
	}
	r.emit(Status{Node: n.addr, Kind: BackedOff, Err: n.err})
	time.AfterFunc(delay, func() { r.endBackoff(n) })
}

// endBackoff writes the value held back (or clears the error).
func (r *Runtime) endBackoff(n *node) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n.svc == nil || n.svc.finished || r.closed {
		return
	}
	n.backoffUntil, n.backoffEnd, n.err = time.Time{}, time.Now(), ""
	held := n.held
	n.held = nil
	err := r.batch(n.addr, func(b *batch) error {
		if held != nil {
			if _, err := b.setCompact(n.out, held); err != nil {
				return err
			}
		}
		b.setError(n.out, "")
		return nil
	})
	if err != nil {
		r.log.Error("write held value", "node", n.addr.String(), "error", err)
	}
}

func safeOpen(ctx context.Context, s Service, h Handle, in Inputs) (err error) {
	defer recoverTo(&err)
	return s.Open(ctx, h, in)
}

func safeUpdate(ctx context.Context, s Service, in Inputs) (err error) {
	defer recoverTo(&err)
	return s.Update(ctx, in)
}

func safeEvent(ctx context.Context, s Service, stream string, ev cells.Event) (err error) {
	defer recoverTo(&err)
	return s.Event(ctx, stream, ev)
}

func safeAccept(a EventAcceptor, stream string, ev cells.Event, cur json.RawMessage) (out any, err error) {
	defer recoverTo(&err)
	return a.Accept(stream, ev, cur)
}

func safeClose(ctx context.Context, s Service, reason CloseReason) (err error) {
	defer recoverTo(&err)
	return s.Close(ctx, reason)
}

// goService runs fn on a goroutine of the service s: the runtime's and the
// service's wait groups count it (Close and stop wait for it). Callers hold
// r.mu and have called r.begin for the work fn does.
func (r *Runtime) goService(s *service, fn func()) {
	r.wg.Add(1)
	s.calls.Add(1)
	go func() {
		defer r.wg.Done()
		defer s.calls.Done()
		fn()
	}()
}
