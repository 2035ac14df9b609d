package sandbox

// The reaper: every ReapInterval it expires idle sessions, puts idle boxes
// to sleep (keeping their workspaces), checks the health of the others,
// saves last-used times and refills the warm pool. SleepAll is the same
// sleep on demand, for every box.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cellbox/cellbox/internal/safe"
	"github.com/cellbox/cellbox/sandbox/backend"
)

// reaper frees the snapshot blobs no snapshot names (sweep), then puts
// idle boxes to sleep, saves last-used times and refills the warm pool,
// every ReapInterval until Close.
func (s *Service) reaper() {
	defer s.wg.Done()
	if s.holds(leaseReaper) { // blobs a capture of another server is writing are not orphans
		s.swept = time.Now()
		s.snaps.Sweep(s.ctx, s.log)
	}
	t := time.NewTicker(s.cfg.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			s.tick()
		}
	}
}

// tick is one round of the reaper; a panic in it is logged and the next
// round runs.
func (s *Service) tick() {
	defer safe.Recover(s.log, "reaper", nil)
	if s.holds(leaseReaper) {
		if now := time.Now(); now.Sub(s.orphansScanned) >= orphanScanInterval {
			s.orphansScanned = now
			s.adoptOrphans(s.ctx)
		}
		s.expireSessions(s.ctx)
		s.reap(s.ctx)
		// Servers sharing a store also leave blobs between starts: a
		// snapshot deleted while another server captured in its session
		// frees nothing then (snapshots.Store.Delete).
		if now := time.Now(); s.cfg.Shared && now.Sub(s.swept) >= sharedSweepInterval {
			s.swept = now
			s.snaps.Sweep(s.ctx, s.log)
		}
	}
	s.flushLastUsed()
	s.pools.Shrink(s.ctx)
	s.pools.Fill()
}

// reap stops every running box idle for longer than its sleep_after_ms.
func (s *Service) reap(ctx context.Context) {
	s.mu.Lock()
	boxes := make([]*box, 0, len(s.boxes))
	for _, b := range s.boxes {
		boxes = append(boxes, b)
	}
	s.mu.Unlock()
	now := time.Now()
	for _, b := range boxes {
		s.reapOne(ctx, b, now)
	}
}

// reapOne puts b to sleep if it is idle, else checks its health.
func (s *Service) reapOne(ctx context.Context, b *box, now time.Time) {
	if !b.life.TryLock() {
		return // busy with a transition
	}
	defer b.life.Unlock()
	idle := now.Sub(time.Unix(0, b.lastUsed.Load()))
	if b.state == stateRunning && b.inflight.Load() == 0 {
		if idle > sleepAfter(b.rec.SleepAfterMs) {
			_ = s.sleep(ctx, b, idle) // logged; the next round tries again
		} else {
			s.checkIdle(ctx, b)
			s.checkpoint(ctx, b)
		}
	}
}

// checkpoint keeps the running box b's workspace through its backend
// (backend.Checkpointer) if it was used since the last time, in the
// background: calls go on meanwhile (the copy is of a live workspace, as a
// snapshot's is), and the backend orders it with the box's Stop. The
// caller holds b.life. A failure is logged: the next round tries again,
// and the health check finds a box that died.
func (s *Service) checkpoint(ctx context.Context, b *box) {
	cp, ok := s.be.(backend.Checkpointer)
	lu := b.lastUsed.Load()
	if !ok || lu == b.kept.Load() || !b.checkpointing.CompareAndSwap(false, true) {
		return
	}
	id := b.rec.ID
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer b.checkpointing.Store(false)
		start := time.Now()
		if err := cp.Checkpoint(ctx, id); err != nil {
			if !errors.Is(err, backend.ErrNotFound) && ctx.Err() == nil { // removed meanwhile, or closing
				s.log.Warn("checkpoint", "box", id, "err", err)
			}
			return
		}
		b.kept.Store(lu)
		s.log.Debug("box checkpointed", "box", id, "ms", time.Since(start).Milliseconds())
	}()
}

// checkIdle is the reaper's health check of the running box b: a dead box
// is restarted now, and the next call on it gets the notice.
func (s *Service) checkIdle(ctx context.Context, b *box) {
	if err := s.check(ctx, nil, "", b, s.noteFor(b)); err != nil {
		s.log.Warn("health check", "box", b.rec.ID, "err", err)
	}
}

// noteFor is a notice sink that keeps a notice for b's next call (b.note),
// for a check made outside any call.
func (s *Service) noteFor(b *box) func(string) {
	return func(n string) {
		s.mu.Lock()
		b.note = n
		s.mu.Unlock()
	}
}

// sleep stops b, keeping its workspace; the caller holds b.life. A
// failure is logged and returned; the box stays running.
func (s *Service) sleep(ctx context.Context, b *box, idle time.Duration) error {
	if err := s.be.Stop(ctx, b.rec.ID); err != nil {
		s.log.Warn("stop box to put it to sleep", "box", b.rec.ID, "err", err)
		return fmt.Errorf("put box %s to sleep: %w", b.rec.ID, err)
	}
	s.closeClient(b)
	s.mu.Lock()
	b.state = stateSleeping
	s.mu.Unlock()
	s.releaseHost(b.rec.ID)
	s.log.Info("box put to sleep", "box", b.rec.ID, "idle", idle.Round(time.Second))
	return nil
}

// flushLastUsed saves the last-used times that changed.
func (s *Service) flushLastUsed() {
	s.mu.Lock()
	var changes []change
	for _, b := range s.boxes {
		lu := b.lastUsed.Load()
		if lu == b.saved || b.state == stateNew || b.state == stateRemoved {
			continue
		}
		b.saved = lu
		changes = append(changes, change{box: b.record()})
	}
	s.mu.Unlock()
	if len(changes) > 0 {
		if err := s.st.apply(changes...); err != nil {
			s.log.Warn("save last-used times", "err", err)
		}
	}
}

// SleepAll stops every running box of every session, keeping each
// workspace; the next call on a box (of this service or of the next one
// over the data directory) wakes it. The process that owns the data
// directory (cellbox serve, cellbox run) calls it as it shuts down, after
// its APIs stopped, so that no box runs on with nobody left to put it to
// sleep; from then on no box of this service starts (a call still in
// flight that would wake or create one fails, saying why). Close does not:
// a service closed and opened again in one process reattaches to the boxes
// that run. Warm pool boxes are not sessions' boxes: Close removes them.
func (s *Service) SleepAll(ctx context.Context) error {
	s.asleep.Store(true)
	s.mu.Lock()
	boxes := make([]*box, 0, len(s.boxes))
	for _, b := range s.boxes {
		boxes = append(boxes, b)
	}
	s.mu.Unlock()
	return s.sleepBoxes(ctx, boxes)
}

// sleepConcurrency is how many boxes sleepBoxes stops at once: a stop
// mostly waits (for an agent to exit, a disk to unmount, the engine), so
// stopping in parallel shortens a shutdown, while a bound keeps a server
// with hundreds of boxes from starting hundreds of unmounts at once.
const sleepConcurrency = 8

// sleepBoxes puts the running ones of boxes to sleep, sleepConcurrency at
// once, and returns when each is done or when ctx ends. A box still
// busy then (its stop hangs, or a call holds it in a transition) is named
// in the error and not waited for: its stop goes on in the background,
// and if the process exits first, the next start reattaches the box or
// finds it stopped (as after a kill).
func (s *Service) sleepBoxes(ctx context.Context, boxes []*box) error {
	// The boxes that may run: running ones, and those in a transition
	// (a wake, a create) that may leave them running. TryLock never
	// blocks, so taking it under s.mu cannot deadlock.
	s.mu.Lock()
	pending := map[*box]string{} // the boxes not done yet, with their IDs
	for _, b := range boxes {
		if b.state == stateRunning || !b.life.TryLock() {
			pending[b] = cmp.Or(b.rec.ID, "(a box being made)")
		} else {
			b.life.Unlock()
		}
	}
	s.mu.Unlock()
	var (
		mu   sync.Mutex // guards pending and errs
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, sleepConcurrency)
	)
	for _, b := range slices.Collect(maps.Keys(pending)) { // not pending itself: the goroutines delete from it
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			select {
			case sem <- struct{}{}:
				err = s.sleepIfRunning(ctx, b)
				<-sem
			case <-ctx.Done():
				return // left pending: named below
			}
			mu.Lock()
			defer mu.Unlock()
			delete(pending, b)
			if err != nil {
				errs = append(errs, err)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	if len(pending) > 0 {
		ids := slices.Sorted(maps.Values(pending))
		s.log.Warn("boxes not put to sleep in time; the next start reattaches them", "boxes", ids, "err", ctx.Err())
		errs = append(errs, fmt.Errorf("put boxes to sleep: %s did not stop in time: %w", strings.Join(ids, ", "), ctx.Err()))
	}
	return errors.Join(errs...)
}

// sleepIfRunning puts b to sleep if it runs, waiting for a transition in
// progress (a wake, a create) to end first.
func (s *Service) sleepIfRunning(ctx context.Context, b *box) error {
	b.life.Lock()
	defer b.life.Unlock()
	if b.state != stateRunning || ctx.Err() != nil {
		return nil
	}
	return s.sleep(ctx, b, time.Since(time.Unix(0, b.lastUsed.Load())))
}
