package sandbox

// Health: a box whose agent died behind the pool's back (killed,
// OOM-killed, its container stopped or removed) is noticed — on the next
// call, by the reaper's idle check, or when a call fails — and restarted
// with its workspace (or recreated empty when the backend lost it); the
// caller gets a notice saying so.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/backend"
)

// pingTimeout bounds a health check of a running box's agent.
const pingTimeout = 2 * time.Second

// check makes sure the running box b answers; the caller holds b.life. A
// box whose agent died behind the pool's back (killed, OOM-killed, its
// container killed) is restarted with its workspace, and notice says so;
// one the backend no longer has is recreated empty. A box that runs but is
// slow to answer is left alone: the call will tell.
func (s *Service) check(ctx context.Context, sess *Session, name string, b *box, notice func(string)) error {
	perr := errors.New("no connection to its agent")
	if b.client != nil {
		pctx, cancel := context.WithTimeout(agent.WithoutHeal(ctx), pingTimeout)
		_, perr = b.client.Version(pctx)
		cancel()
		var pe *agent.ProtocolError
		if perr == nil || errors.As(perr, &pe) || ctx.Err() != nil {
			return nil
		}
	}
	slow := errors.Is(perr, context.DeadlineExceeded)
	grace := pingTimeout
	if slow {
		grace = 0
	}
	info, err := s.stopped(ctx, b.rec.ID, grace)
	if err == nil && info.State == backend.StateRunning {
		if slow {
			return nil // busy, or hung: the call will tell
		}
		// It runs, but its agent refuses connections (its socket was
		// removed or replaced): restart it.
		if err := s.be.Stop(ctx, b.rec.ID); err != nil {
			return fmt.Errorf("sandbox %s: its agent does not answer (%v) and stopping it failed: %w", boxName(name, b.rec.ID), perr, err)
		}
		info.Exit = fmt.Sprintf("its agent did not answer: %v", perr)
		if after, err := s.be.Inspect(ctx, b.rec.ID); err == nil {
			info.Lost = after.Lost // what the stop could not keep
		}
	}
	return s.revive(ctx, sess, name, b, info, err, notice)
}

// stopped inspects box id whose agent does not answer, asking again for up
// to grace while the backend still says running: a box whose agent was
// just killed takes a little while to show as stopped.
func (s *Service) stopped(ctx context.Context, id string, grace time.Duration) (backend.Info, error) {
	deadline := time.Now().Add(grace)
	for {
		info, err := s.be.Inspect(ctx, id)
		if err != nil || info.State != backend.StateRunning || time.Now().After(deadline) {
			return info, err
		}
		select {
		case <-ctx.Done():
			return info, nil
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// revive restarts the dead box b (info and ierr: what Inspect said); the
// caller holds b.life. On failure b is marked dead and the next use tries
// again.
func (s *Service) revive(ctx context.Context, sess *Session, name string, b *box, info backend.Info, ierr error, notice func(string)) error {
	id := b.rec.ID
	what := boxName(name, id)
	if ierr != nil && !errors.Is(ierr, backend.ErrNotFound) {
		return fmt.Errorf("sandbox %s does not answer and the %s backend cannot say why: %w", what, s.be.Name(), ierr)
	}
	release, err := s.acquireSlot(ctx, sess)
	if err != nil {
		return err
	}
	defer release()
	s.closeClient(b)
	if ierr != nil {
		s.log.Warn("box removed behind the server's back; recreating it", "box", id, "err", ierr)
		notice(fmt.Sprintf("sandbox %s had been removed from the %s backend behind this server's back; it was recreated with an empty workspace", what, s.be.Name()))
		if err := s.recreate(ctx, name, b); err != nil {
			s.setState(b, stateDead)
			return err
		}
		return nil
	}
	why := exitReason(info)
	s.log.Warn("box died; restarting it", "box", id, "why", why)
	cl, err := s.wake(ctx, id)
	if err != nil {
		s.setState(b, stateDead)
		return fmt.Errorf("sandbox %s had died (%s) and could not be restarted: %w", what, why, err)
	}
	s.setRunning(b, cl)
	s.metrics.observeRevive()
	kept := "with its workspace"
	if info.Lost != "" {
		kept = "but " + info.Lost
	}
	notice(fmt.Sprintf("sandbox %s had died (%s); it was restarted %s (processes it ran are gone)", what, why, kept))
	return nil
}

// heal is what box id's agent client does when a request cannot reach
// the agent at all (agent.Client.SetHeal): the box is checked and, dead,
// restarted (or recreated) as on use; the notice goes to the call the
// context carries (withCall), else to the box's next call.
func (s *Service) heal(ctx context.Context, id string) error {
	s.mu.Lock()
	b := s.boxes[id]
	s.mu.Unlock()
	if b == nil {
		return fmt.Errorf("box %s is gone", id)
	}
	b.life.Lock()
	defer b.life.Unlock()
	if b.state != stateRunning {
		return fmt.Errorf("box %s is %s", id, b.state)
	}
	ci, _ := ctx.Value(callKey{}).(callInfo)
	name := ""
	s.mu.Lock()
	if ci.sess != nil {
		for n, ob := range ci.sess.boxes {
			if ob == b {
				name = n
			}
		}
	}
	s.mu.Unlock()
	notice := ci.notice
	if notice == nil {
		notice = s.noteFor(b)
	}
	return s.check(ctx, ci.sess, name, b, notice)
}

// callInfo is the session and the notice sink of a call, carried in its
// context for heal.
type callInfo struct {
	sess   *Session
	notice func(string)
}

type callKey struct{}

// withCall returns ctx carrying the call's session and notice sink.
func withCall(ctx context.Context, sess *Session, notice func(string)) context.Context {
	return context.WithValue(ctx, callKey{}, callInfo{sess: sess, notice: notice})
}

// boxName names a box in messages: by name and id, or id alone where the
// name (which is per session) is not known.
func boxName(name, id string) string {
	if name == "" {
		return id
	}
	return fmt.Sprintf("%q (%s)", name, id)
}

// explain turns err, the failure of a call of session sess on l's box,
// into one that says what happened to the box: it was destroyed during the
// call (sandbox_destroy, or the session's deletion: nothing restarts it),
// or it died during the call (the next call restarts it).
func (s *Service) explain(ctx context.Context, sess *Session, l *lease, err error) error {
	if err == nil || ctx.Err() != nil {
		return err
	}
	s.mu.Lock()
	removed, sessGone := l.b.state == stateRemoved, sess.deleted
	s.mu.Unlock()
	if removed {
		// The transport error (EOF from the killed agent) says nothing
		// the caller can use: it goes to the log, not the message.
		s.log.Debug("box destroyed during a call", "session", sess.ID, "box", l.b.rec.ID, "err", err)
		what := boxName(l.name, l.b.rec.ID)
		if sessGone {
			return api.WithCode(api.CodeNoSession, fmt.Errorf("session %s was deleted while this call ran: sandbox %s and the session's other sandboxes were destroyed; create a new session to go on", sess.ID, what))
		}
		return api.WithCode(api.CodeNoBox, fmt.Errorf("sandbox %s was destroyed (sandbox_destroy) while this call ran: its processes and files are gone; a call that names it makes a new, empty sandbox", what))
	}
	var ae *agent.Error
	if errors.As(err, &ae) {
		return err
	}
	ctx = context.WithoutCancel(ctx)
	pctx, cancel := context.WithTimeout(agent.WithoutHeal(ctx), pingTimeout)
	_, perr := l.client.Version(pctx)
	cancel()
	if perr == nil {
		return err
	}
	info, ierr := s.stopped(ctx, l.b.rec.ID, pingTimeout)
	if ierr == nil && info.State == backend.StateRunning {
		return err
	}
	why := "it is gone from the backend"
	if ierr == nil {
		why = exitReason(info)
	}
	return fmt.Errorf("sandbox %s died during this call (%s); the next call restarts it: %w", boxName(l.name, l.b.rec.ID), why, err)
}
