package sandbox

// Reconcile: at New, the stored sessions and boxes are matched with what
// the backend has, so a restarted server reattaches to running boxes,
// marks lost ones, and removes orphans (boxes and host directories of this
// data directory that nothing names).

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/previews"
)

// reconcile loads the store and matches it with the backend: running boxes
// are reattached, stopped ones sleep, missing ones are marked gone, and
// managed boxes of this data dir that the store does not know are removed.
func (s *Service) reconcile(ctx context.Context) error {
	sessions, boxes, err := s.st.load()
	if err != nil {
		return err
	}
	listed, err := s.be.List(ctx, map[string]string{backend.LabelManaged: "1", labelInstance: s.st.instance})
	if err != nil {
		return fmt.Errorf("list %s boxes: %w", s.be.Name(), err)
	}
	infos := map[string]backend.Info{}
	for _, in := range listed {
		infos[in.ID] = in
	}
	var changes []change
	for _, rec := range boxes {
		info, ok := infos[rec.ID]
		delete(infos, rec.ID)
		b, ch := s.boxFromRecord(ctx, rec, info, ok)
		if ch != nil {
			changes = append(changes, *ch)
		}
		s.placeBoxLocked(b)
	}
	for _, rec := range sessions {
		if sess := s.sessionFromRecord(rec, func(id string) *box { return s.boxes[id] }); sess != nil {
			s.sessions[rec.ID] = sess
		}
	}
	// Boxes no session names (a crash between writes) are orphans too.
	used := map[*box]bool{}
	for _, sess := range s.sessions {
		for _, b := range sess.boxes {
			used[b] = true
		}
	}
	for id, b := range s.boxes {
		if !used[b] {
			if b.client != nil {
				b.client.Close()
			}
			delete(s.boxes, id)
			changes = append(changes, change{delBox: id})
			if b.state != stateGone {
				infos[id] = backend.Info{ID: id}
			}
		}
	}
	for id := range infos {
		s.log.Info("removing orphan box", "box", id, "backend", s.be.Name())
		s.removeBox(ctx, id)
	}
	s.sweepHostDirs()
	s.prepareHosts(s.boxes)
	if len(changes) > 0 {
		return s.st.apply(changes...)
	}
	return nil
}

// sweepHostDirs removes the host directories (DATA/boxes/ID) of boxes that
// neither the store nor the backend has: a process killed between removing
// a box and its directory, or between making the directory and the box,
// left them, and nothing else would ever remove them. It runs in reconcile,
// before anything makes boxes (one process owns a data dir).
func (s *Service) sweepHostDirs() {
	entries, err := os.ReadDir(filepath.Join(s.cfg.DataDir, "boxes"))
	if err != nil {
		return
	}
	for _, e := range entries {
		if _, known := s.boxes[e.Name()]; known || backend.ValidID(e.Name()) != nil {
			continue
		}
		s.log.Info("removing the host directory of a box that is gone", "box", e.Name())
		if err := s.removeHostDir(e.Name()); err != nil {
			s.log.Warn("remove box host dir", "box", e.Name(), "err", err)
		}
	}
}

// boxFromRecord makes the box of a stored record, matched with what the
// backend says of it (info; known false: the backend does not have it):
// a running box is reattached, a stopped one sleeps, a missing one is
// gone (and the change that records it so is returned).
func (s *Service) boxFromRecord(ctx context.Context, rec boxRecord, info backend.Info, known bool) (*box, *change) {
	b := &box{rec: rec, state: stateSleeping, previews: rec.Previews}
	b.rec.Previews = nil
	b.lastUsed.Store(rec.LastUsed.UnixNano())
	b.saved = b.lastUsed.Load()
	s.loadPolicy(b)
	var ch *change
	switch {
	case !known:
		b.state = stateGone
		if !rec.Gone {
			s.log.Warn("box is gone from the backend; it will be recreated empty on next use", "box", rec.ID, "backend", s.be.Name())
			b.rec.Gone = true
			ch = &change{box: b.record()}
		}
	case info.State == backend.StateRunning:
		cl, err := s.connect(ctx, rec.ID, 5*time.Second)
		if err != nil {
			s.log.Warn("running box did not answer; it will be restarted on next use", "box", rec.ID, "err", err)
			break
		}
		b.state, b.client = stateRunning, cl
		s.log.Info("box reattached", "box", rec.ID)
	}
	return b, ch
}

// sessionFromRecord makes the session of a stored record, its boxes found
// by boxOf; nil for a record that cannot be a session (a bad token hash).
func (s *Service) sessionFromRecord(rec sessionRecord, boxOf func(id string) *box) *Session {
	sess := &Session{
		ID:       rec.ID,
		Created:  rec.Created,
		sem:      make(chan struct{}, s.cfg.SessionConcurrency),
		boxes:    map[string]*box{},
		allowed:  rec.AllowedCommands,
		defaults: rec.Defaults,
	}
	if h, err := hex.DecodeString(rec.TokenHash); err != nil || len(h) != len(sess.tokenHash) {
		s.log.Error("session with a bad token hash skipped", "session", rec.ID)
		return nil
	} else {
		copy(sess.tokenHash[:], h)
	}
	for name, id := range rec.Boxes {
		if b := boxOf(id); b != nil {
			sess.boxes[name] = b
		} else {
			s.log.Warn("session names a box the store does not have", "session", rec.ID, "name", name, "box", id)
		}
	}
	last := rec.Created
	for _, b := range sess.boxes {
		if lu := b.rec.LastUsed; lu.After(last) {
			last = lu
		}
	}
	sess.lastUsed.Store(last.UnixNano())
	return sess
}

// placeBoxLocked puts a box loaded from the store among the service's, its
// previews with it; the caller holds s.mu (or is New, before any call).
func (s *Service) placeBoxLocked(b *box) {
	s.boxes[b.rec.ID] = b
	for port, pid := range b.previews {
		s.previews.Add(pid, previews.Target{Box: b.rec.ID, Port: port})
	}
}

// prepareHosts starts the egress proxies of the running boxes among boxes
// that have no full network (boxes loaded from the store).
func (s *Service) prepareHosts(boxes map[string]*box) {
	for id, b := range boxes {
		if b.state == stateRunning && !b.rec.Network {
			if err := s.prepareHost(id, false); err != nil {
				s.log.Warn("box egress proxy not started; its network is closed", "box", id, "err", err)
			}
		}
	}
}
