package sandbox

// The reaper: every ReapInterval it expires idle sessions, puts idle boxes
// to sleep (keeping their workspaces), checks the health of the others,
// saves last-used times and refills the warm pool. SleepSession is the same
// sleep on demand.

import (
	"context"
	"time"

	"github.com/cellbox/cellbox/internal/safe"
)

// reaper puts idle boxes to sleep, saves last-used times and refills the
// warm pool, every ReapInterval until Close.
func (s *Service) reaper() {
	defer s.wg.Done()
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
	s.expireSessions(s.ctx)
	s.reap(s.ctx)
	s.flushLastUsed()
	s.shrinkPools(s.ctx)
	s.fillPools()
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
			s.sleep(ctx, b, idle)
		} else {
			s.checkIdle(ctx, b)
		}
	}
}

// checkIdle is the reaper's health check of the running box b: a dead box
// is restarted now, and the next call on it gets the notice.
func (s *Service) checkIdle(ctx context.Context, b *box) {
	err := s.check(ctx, nil, "", b, func(n string) {
		s.mu.Lock()
		b.note = n
		s.mu.Unlock()
	})
	if err != nil {
		s.log.Warn("health check", "box", b.rec.ID, "err", err)
	}
}

// sleep stops b, keeping its workspace; the caller holds b.life.
func (s *Service) sleep(ctx context.Context, b *box, idle time.Duration) {
	if err := s.be.Stop(ctx, b.rec.ID); err != nil {
		s.log.Warn("stop idle box", "box", b.rec.ID, "err", err)
		return
	}
	s.closeClient(b)
	s.mu.Lock()
	b.state = stateSleeping
	s.mu.Unlock()
	s.log.Info("box put to sleep", "box", b.rec.ID, "idle", idle.Round(time.Second))
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

// SleepSession stops every running box of a session, keeping each
// workspace; the next call on a box wakes it. A runner that owns a session
// (cellbox run, the runtime of cellbox serve) calls it as it shuts down, so
// that no box runs on with nobody left to use it.
func (s *Service) SleepSession(ctx context.Context, id string) error {
	sess, err := s.session(id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	boxes := make([]*box, 0, len(sess.boxes))
	for _, b := range sess.boxes {
		boxes = append(boxes, b)
	}
	s.mu.Unlock()
	for _, b := range boxes {
		b.life.Lock()
		if b.state == stateRunning {
			s.sleep(ctx, b, time.Since(time.Unix(0, b.lastUsed.Load())))
		}
		b.life.Unlock()
	}
	return nil
}
