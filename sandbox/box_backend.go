package sandbox

// How a box's backend box is made, woken, recreated and reached: the spec
// the backend is given (backendSpec), the agent connection (connect, via
// the backend's Dial), and why a box stopped (exitReason). box.go's
// transitions call these with the box's life mutex held; they take
// Service.mu only to change the fields it guards.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/cellbox/cellbox/internal/crashpoint"
	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/backend"
)

// recreate replaces b's backend box by a new empty one with the same id and
// spec; the caller holds b.life and a slot.
func (s *Service) recreate(ctx context.Context, name string, b *box) error {
	s.closeClient(b)
	if err := s.be.Remove(ctx, b.rec.ID); err != nil {
		return fmt.Errorf("recreate sandbox %q: remove old box %s: %w", name, b.rec.ID, err)
	}
	session := b.rec.Session
	cl, err := s.makeBox(ctx, b.rec, session, name, false)
	if err != nil {
		return fmt.Errorf("recreate sandbox %q: %w", name, err)
	}
	s.mu.Lock()
	b.rec.Gone = false
	s.dropPreviewsLocked(b)
	b.state, b.client = stateRunning, cl
	rec := b.record()
	s.mu.Unlock()
	return s.st.apply(change{box: rec})
}

// makeBox creates (unless made says the backend made it already) and
// starts a backend box for rec and waits for its agent.
func (s *Service) makeBox(ctx context.Context, rec boxRecord, session, name string, made bool) (*agent.Client, error) {
	spec, err := s.backendSpec(rec, session, name)
	if err == nil && !made {
		crashpoint.Hit("box.hostdir", rec.ID)
		_, err = s.be.Create(ctx, spec)
	}
	if err != nil {
		// An interrupted create may still have made the box.
		s.removeBox(context.WithoutCancel(ctx), rec.ID)
		return nil, fmt.Errorf("%s backend: create box %s (image %s): %w", s.be.Name(), rec.ID, rec.Image, err)
	}
	crashpoint.Hit("box.created", rec.ID)
	cl, err := s.wake(ctx, rec.ID)
	if err != nil {
		s.removeBox(context.WithoutCancel(ctx), rec.ID)
		return nil, err
	}
	crashpoint.Hit("box.started", rec.ID)
	return cl, nil
}

// backendSpec is the backend's spec of box rec, named name in session; it
// makes the box's host directory.
func (s *Service) backendSpec(rec boxRecord, session, name string) (backend.Spec, error) {
	if err := s.prepareHost(rec.ID, rec.Network); err != nil {
		return backend.Spec{}, err
	}
	return backend.Spec{
		ID: rec.ID,
		Labels: map[string]string{
			backend.LabelManaged: "1",
			backend.LabelSession: session,
			backend.LabelBox:     name,
			backend.LabelID:      rec.ID,
			labelInstance:        s.st.instance,
		},
		Image:       rec.Image,
		Env:         boxEnv(rec),
		Network:     rec.Network,
		Limits:      toBackendLimits(rec.Limits),
		AgentBinary: s.cfg.AgentBinary,
		HostDir:     s.hostDir(rec.ID),
		WorkDir:     rec.WorkspaceDir,
	}, nil
}

// restart stops box id and wakes it again: its processes end, its disk
// stays.
func (s *Service) restart(ctx context.Context, id string) (*agent.Client, error) {
	if err := s.be.Stop(ctx, id); err != nil {
		return nil, fmt.Errorf("%s backend: stop box %s: %w", s.be.Name(), id, err)
	}
	return s.wake(ctx, id)
}

// wake starts box id (a no-op if it runs) and waits for its agent.
func (s *Service) wake(ctx context.Context, id string) (*agent.Client, error) {
	if s.asleep.Load() {
		return nil, errShuttingDown(id)
	}
	s.mu.Lock()
	network := s.boxes[id] != nil && s.boxes[id].rec.Network
	s.mu.Unlock()
	if err := s.prepareHost(id, network); err != nil {
		return nil, err
	}
	if _, err := s.be.Start(ctx, id); err != nil {
		return nil, fmt.Errorf("%s backend: start box %s: %w", s.be.Name(), id, err)
	}
	return s.connect(ctx, id, s.cfg.ReadyTimeout)
}

// connect waits up to timeout for box id's agent and checks its protocol.
// It waits in short rounds and between them asks the backend whether the
// box still runs, so that a box that cannot start (its agent died: no
// memory, pids: 1, a broken image) fails at once, saying why.
func (s *Service) connect(ctx context.Context, id string, timeout time.Duration) (*agent.Client, error) {
	cl := s.agentClient(id)
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var pe *agent.ProtocolError
	for {
		rctx, rcancel := context.WithTimeout(wctx, connectRound)
		err := cl.WaitReady(rctx)
		rcancel()
		switch {
		case err == nil:
			cl.SetHeal(func(ctx context.Context) error { return s.heal(ctx, id) })
			return cl, nil
		case errors.As(err, &pe):
			cl.Close()
			return nil, fmt.Errorf("agent of box %s: %w", id, err)
		case wctx.Err() != nil:
			cl.Close()
			return nil, fmt.Errorf("agent of box %s did not answer within %s: %w", id, timeout, err)
		}
		info, ierr := s.be.Inspect(wctx, id)
		switch {
		case errors.Is(ierr, backend.ErrNotFound):
			cl.Close()
			return nil, fmt.Errorf("box %s vanished from the %s backend while starting: %w", id, s.be.Name(), ierr)
		case ierr == nil && info.State != backend.StateRunning:
			cl.Close()
			return nil, fmt.Errorf("box %s stopped while starting: %s", id, exitReason(info))
		}
	}
}

// agentClient is a client of box id's agent, connected through the
// backend (Backend.Dial): the one way to a box. On a backend whose boxes
// run here, waiting for the agent sleeps on its socket's directory.
func (s *Service) agentClient(id string) *agent.Client {
	cl := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return s.be.Dial(ctx, id) })
	if !s.caps.Remote {
		cl.WatchSocket(filepath.Join(s.hostDir(id), backend.SocketName))
	}
	return cl
}

// connectRound is how long connect waits for the agent between two looks
// at the backend.
const connectRound = 250 * time.Millisecond

// exitReason says why a box stopped, as far as the backend knows.
func exitReason(info backend.Info) string {
	if info.Exit != "" {
		return info.Exit
	}
	return "it is " + string(info.State)
}
