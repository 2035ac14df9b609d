package sandbox

// Several servers, one state (Config.Shared): the sessions and boxes are
// records every server reads, and each session is served by one server at
// a time, the holder of its lease ("session/ID"). A call to a session no
// server holds (new to this server, or its server died and the lease ran
// out) takes the lease here and loads the session from the store, its
// running boxes reattached as a restarted server's are (boxFromRecord).
// A call to a session another server holds is that server's: this one
// answers ErrElsewhere, and the HTTP server in front forwards the request
// to the holder (SessionHolder tells it which). A server that loses a
// session's lease (cut off from etcd past its time to live) forgets the
// session at once, before another may take it: its boxes keep running,
// for the next holder to reattach.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	leases "github.com/cellbox/cellbox/sandbox/lease"
	"github.com/cellbox/cellbox/sandbox/state"
)

// sessionLeaseTTL is how long a session stays with a server that stopped
// renewing its lease: another takes it over after at most this.
const sessionLeaseTTL = 5 * time.Second

func sessionLease(id string) string { return "session/" + id }

// ErrElsewhere: the session is served by another server (Config.Shared).
var ErrElsewhere = errors.New("the session is served by another server")

// SessionHolder names the server that serves session id: "" when it is
// this one, or may be (no server holds it: the call takes it here).
func (s *Service) SessionHolder(ctx context.Context, id string) (string, error) {
	if !s.cfg.Shared {
		return "", nil
	}
	s.mu.Lock()
	local := s.sessions[id] != nil
	s.mu.Unlock()
	if local {
		return "", nil
	}
	h, err := s.cfg.Leaser.Holder(ctx, sessionLease(id))
	if err != nil || h == s.cfg.Holder {
		return "", err
	}
	return h, nil
}

// holdSession takes the lease of a new session (Config.Shared).
func (s *Service) holdSession(id string) error {
	if !s.cfg.Shared {
		return nil
	}
	h, err := leases.Keep(s.ctx, s.cfg.Leaser, sessionLease(id), s.cfg.Holder, sessionLeaseTTL)
	if err != nil {
		return err
	}
	s.heldSession(id, h)
	go s.watchSession(id, h)
	return nil
}

// heldSession notes h, the lease of session id this server took, and the
// fence of its writes of the session's records.
func (s *Service) heldSession(id string, h *leases.Held) {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	s.held[sessionLease(id)] = h
	if f, ok := s.cfg.Leaser.(leases.Fencer); ok {
		s.fenced[id] = state.Fence{Key: f.FenceKey(sessionLease(id)), Rev: int64(h.Lease().Token)}
	}
}

// lostFenceKeep is how long a server keeps the fence of a session whose
// lease it lost: longer than any call begun before may write.
const lostFenceKeep = time.Hour

// sessionFences are the fences of a commit of the records of sessions:
// of each that this server took, the lease it took, whether it still
// holds it or not (a commit of a lost one writes nothing). A session it
// never took (a new one, whose lease is being taken beside its first
// record; one the reaper expires) has none.
func (s *Service) sessionFences(sessions []string) []state.Fence {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	var out []state.Fence
	for i, id := range sessions {
		if f, ok := s.fenced[id]; ok && !slices.Contains(sessions[:i], id) {
			out = append(out, f)
		}
	}
	return out
}

// releaseSession gives a deleted session's lease up.
func (s *Service) releaseSession(id string) {
	s.leaseMu.Lock()
	h := s.held[sessionLease(id)]
	delete(s.held, sessionLease(id))
	delete(s.fenced, id)
	s.leaseMu.Unlock()
	if h != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		h.Release(ctx)
	}
}

// adoptSession takes the lease of session id and loads it from the store, with
// its boxes. One adoption runs at a time.
func (s *Service) adoptSession(id string) (*Session, error) {
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	s.adoptMu.Lock()
	defer s.adoptMu.Unlock()
	s.mu.Lock()
	sess, err := s.liveSessionLocked(id)
	s.mu.Unlock()
	if err == nil || !errors.Is(err, ErrNoSession) {
		return sess, err // adopted by a call that came first
	}
	r, err := s.st.st.Get(ctx, state.Sessions, id)
	if errors.Is(err, state.ErrNotFound) {
		return nil, fmt.Errorf("session %q: %w", id, ErrNoSession)
	}
	if err != nil {
		return nil, fmt.Errorf("read session %s: %w", id, err)
	}
	var rec sessionRecord
	if err := json.Unmarshal(r.Value, &rec); err != nil {
		return nil, fmt.Errorf("session %s: %w", id, err)
	}
	h, err := leases.Keep(s.ctx, s.cfg.Leaser, sessionLease(id), s.cfg.Holder, sessionLeaseTTL)
	if errors.Is(err, leases.ErrHeld) {
		return nil, fmt.Errorf("%w (%v)", ErrElsewhere, err)
	}
	if err != nil {
		return nil, fmt.Errorf("take session %s: %w", id, err)
	}
	boxes := map[string]*box{}
	var changes []change
	for _, bid := range rec.Boxes {
		br, err := s.st.st.Get(ctx, state.Boxes, bid)
		if err != nil {
			continue // named but not stored: sessionFromRecord says so
		}
		var brec boxRecord
		if json.Unmarshal(br.Value, &brec) != nil {
			continue
		}
		info, err := s.be.Inspect(ctx, bid)
		b, ch := s.boxFromRecord(ctx, brec, info, err == nil)
		if ch != nil {
			changes = append(changes, *ch)
		}
		boxes[bid] = b
	}
	sess = s.sessionFromRecord(rec, func(bid string) *box { return boxes[bid] })
	if sess == nil {
		h.Release(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("session %q: %w", id, ErrNoSession)
	}
	s.mu.Lock()
	for _, b := range boxes {
		s.placeBoxLocked(b)
	}
	s.sessions[id] = sess
	s.mu.Unlock()
	s.heldSession(id, h)
	s.prepareHosts(boxes)
	if len(changes) > 0 {
		if err := s.st.apply(changes...); err != nil {
			s.log.Warn("record boxes gone", "session", id, "err", err)
		}
	}
	go s.watchSession(id, h)
	s.log.Info("session taken over from the shared state", "session", id, "boxes", len(boxes))
	return sess, nil
}

// sharedSweepInterval is how often the reaper's holder sweeps the snapshot
// blobs of a shared store (snapshots.Store.Sweep), besides at its start.
const sharedSweepInterval = time.Hour

// orphanScanInterval is how often the reaper's holder looks for sessions
// no server serves (adoptOrphans).
var orphanScanInterval = 30 * time.Second

// adoptOrphans takes over every session in the shared state that no
// server holds — its server died and no client came back to it — so that
// the reaper expires it and puts its boxes to sleep as it does its own
// (otherwise a dead server's sessions, and their boxes, would stay for
// ever). The reaper's holder calls it every orphanScanInterval: one read
// of the session records, and one of a lease per session not served here.
func (s *Service) adoptOrphans(ctx context.Context) {
	if !s.cfg.Shared {
		return
	}
	recs, err := s.st.st.List(ctx, state.Sessions, "")
	if err != nil {
		s.log.Warn("list sessions to find those no server serves", "err", err)
		return
	}
	for _, r := range recs {
		s.mu.Lock()
		local := s.sessions[r.Key] != nil
		s.mu.Unlock()
		if local || ctx.Err() != nil {
			continue
		}
		if h, err := s.cfg.Leaser.Holder(ctx, sessionLease(r.Key)); err != nil || h != "" {
			continue
		}
		if _, err := s.adoptSession(r.Key); err != nil && !errors.Is(err, ErrElsewhere) && !errors.Is(err, ErrNoSession) {
			s.log.Warn("take over a session no server serves", "session", r.Key, "err", err)
		} else if err == nil {
			s.log.Info("took over a session no server served, for the reaper", "session", r.Key)
		}
	}
}

// watchSession forgets session id here when its lease is lost: another
// server may take it from then on. Its boxes keep running.
func (s *Service) watchSession(id string, h *leases.Held) {
	select {
	case <-h.Done(): // lost, or given up (the session deleted, the service closed)
	case <-s.ctx.Done():
		return
	}
	select {
	case <-h.Lost():
	default:
		return
	}
	s.leaseMu.Lock()
	if s.held[sessionLease(id)] == h {
		delete(s.held, sessionLease(id))
	}
	fence := s.fenced[id]
	s.leaseMu.Unlock()
	// Its fence stays while calls begun here may still write (sessionFences).
	time.AfterFunc(lostFenceKeep, func() {
		s.leaseMu.Lock()
		if s.fenced[id] == fence {
			delete(s.fenced, id)
		}
		s.leaseMu.Unlock()
	})
	s.mu.Lock()
	sess := s.sessions[id]
	if sess != nil {
		delete(s.sessions, id)
		for _, b := range sess.boxes {
			if b.client != nil {
				b.client.Close()
				b.client = nil
			}
			for _, pid := range b.previews {
				s.previews.Drop(pid)
			}
			delete(s.boxes, b.rec.ID)
		}
	}
	s.mu.Unlock()
	s.log.Warn("lost the lease of a session: this server no longer serves it", "session", id)
}

// previewRecord is a preview as the shared state keeps it (kind
// Previews), so that any server finds the session behind a preview id.
type previewRecord struct {
	Session string `json:"session"`
	Box     string `json:"box"`
}

// recordPreview records a new preview id's session (Config.Shared).
func (s *Service) recordPreview(ctx context.Context, id, session string) error {
	if !s.cfg.Shared {
		return nil
	}
	b, _ := json.Marshal(previewRecord{Session: session})
	_, err := s.st.st.Commit(context.WithoutCancel(ctx), state.Put(state.Previews, id, b))
	return err
}

// PreviewSession names the session of preview id when another server
// may serve it ("" when this one does, or none has it): the HTTP server
// forwards the preview there (Config.Shared).
func (s *Service) PreviewSession(ctx context.Context, id string) (string, error) {
	if _, ok := s.previews.Get(id); ok || !s.cfg.Shared {
		return "", nil
	}
	r, err := s.st.st.Get(ctx, state.Previews, id)
	if errors.Is(err, state.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	var rec previewRecord
	if err := json.Unmarshal(r.Value, &rec); err != nil {
		return "", err
	}
	return rec.Session, nil
}

// TakeSession makes this server serve session id if no server does
// (Config.Shared): it fails with ErrElsewhere when another does.
func (s *Service) TakeSession(id string) error {
	_, err := s.session(id)
	return err
}
