package sandbox

// Sessions: the tenancy boundary. A session is a bearer token (kept as a
// SHA-256) and its named boxes; creating, authenticating, deleting and
// expiring sessions, the caps on boxes, and the create/wake slots that
// bound concurrency per session and in all.

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/tools"
)

// Session is one tenant: a bearer token and its named boxes.
type Session struct {
	ID        string
	Created   time.Time
	tokenHash [sha256.Size]byte
	sem       chan struct{}   // the session's create/wake slots
	boxes     map[string]*box // by name; guarded by Service.mu
	deleted   bool            // guarded by Service.mu
	lastUsed  atomic.Int64    // unix nanoseconds of the last call; the reaper expires idle sessions
	pinned    bool            // served in-process (see pin): never expires; guarded by Service.mu
	own       bool            // the server's own, served by a LocalClient (its runtime's); guarded by Service.mu
	allowed   tools.AllowList // allowed_commands; fixed when the session is made
	defaults  api.BoxDefaults // what its boxes get unless sandbox_create says otherwise; fixed too
}

// Errors of session lookups, for the HTTP layer to map to status codes.
var (
	ErrNoSession = api.ErrNoSession // "no such session"
	ErrBadToken  = errors.New("token does not grant access to this session")
)

// NewSession creates a session and returns its id and bearer token. Only a
// SHA-256 of the token is kept.
func (s *Service) NewSession(ctx context.Context) (id, token string, err error) {
	return s.NewSessionWith(ctx, api.NewSessionRequest{})
}

// NewSessionWith is NewSession with options (allowed_commands, the boxes'
// defaults).
func (s *Service) NewSessionWith(ctx context.Context, opts api.NewSessionRequest) (id, token string, err error) {
	allowed, err := tools.NewAllowList(opts.AllowedCommands)
	if err != nil {
		return "", "", api.WithCode(api.CodeInvalidInput, err)
	}
	if len(opts.Env) > 0 {
		if err := allowed.Refusal("", opts.Env); err != nil {
			return "", "", api.WithCode(api.CodeInvalidInput, err)
		}
	}
	if err := backend.ValidWorkDir(opts.WorkspaceDir); err != nil {
		return "", "", api.WithCode(api.CodeInvalidInput, err)
	}
	// Checked here, not only when a box is made: every box of the session
	// gets it, and would fail as internal.
	if err := backend.ValidEnv(opts.Env); err != nil {
		return "", "", api.WithCode(api.CodeInvalidInput, err)
	}
	id = "s-" + randomID(8)
	token = randomID(32)
	sess := &Session{
		ID:        id,
		Created:   time.Now().UTC(),
		tokenHash: sha256.Sum256([]byte(token)),
		sem:       make(chan struct{}, s.cfg.SessionConcurrency),
		boxes:     map[string]*box{},
		allowed:   allowed,
		defaults:  opts.BoxDefaults,
	}
	sess.lastUsed.Store(sess.Created.UnixNano())
	s.mu.Lock()
	if n := s.clientSessionsLocked(); n >= s.cfg.MaxSessions {
		s.mu.Unlock()
		return "", "", api.WithCode(api.CodeLimit, fmt.Errorf("this server has %d sessions, the most it keeps at once: delete finished ones (DELETE /v1/sessions/ID, cellbox session rm ID), wait for idle ones to expire, or raise the limit (cellbox serve --max-sessions)", n))
	}
	s.sessions[id] = sess
	rec := s.sessionRecordLocked(sess)
	s.mu.Unlock()
	// The session's lease (a shared state's) and its record, at once: the
	// id is new, so no server can take it between the two.
	held := make(chan error, 1)
	go func() { held <- s.holdSession(id) }()
	stored := s.st.apply(change{session: &rec})
	err = errors.Join(stored, <-held)
	if err != nil {
		s.mu.Lock()
		delete(s.sessions, id)
		s.mu.Unlock()
		s.releaseSession(id)
		if stored == nil {
			s.st.apply(change{delSession: id}) // no half-made session stays
		}
		return "", "", fmt.Errorf("create session: %w", err)
	}
	s.log.Info("session created", "session", id)
	return id, token, nil
}

// Authenticate returns the session id names if token is its bearer token
// (ErrNoSession, ErrBadToken otherwise). The comparison takes constant time.
func (s *Service) Authenticate(id, token string) (*Session, error) {
	sess, err := s.session(id)
	if err != nil {
		return nil, err
	}
	h := sha256.Sum256([]byte(token))
	if subtle.ConstantTimeCompare(h[:], sess.tokenHash[:]) != 1 {
		return nil, ErrBadToken
	}
	return sess, nil
}

func (s *Service) session(id string) (*Session, error) {
	s.mu.Lock()
	sess, err := s.liveSessionLocked(id)
	s.mu.Unlock()
	if err != nil && s.cfg.Shared && errors.Is(err, ErrNoSession) {
		sess, err = s.adoptSession(id) // served by no server now, or by another
	}
	if err != nil {
		return nil, err
	}
	sess.lastUsed.Store(time.Now().UnixNano())
	return sess, nil
}

// liveSessionLocked returns session id unless it is unknown or deleted;
// the caller holds s.mu.
func (s *Service) liveSessionLocked(id string) (*Session, error) {
	sess := s.sessions[id]
	if sess == nil || sess.deleted {
		return nil, fmt.Errorf("session %q: %w", id, ErrNoSession)
	}
	return sess, nil
}

// DeleteSession destroys every box of the session (shared boxes only when
// no other session uses them) and forgets the session.
func (s *Service) DeleteSession(ctx context.Context, id string) error {
	s.mu.Lock()
	sess, err := s.liveSessionLocked(id)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	sess.deleted = true
	names := make([]string, 0, len(sess.boxes))
	for name := range sess.boxes {
		names = append(names, name)
	}
	s.mu.Unlock()
	var errs []error
	for _, name := range names {
		if err := s.destroyBox(ctx, sess, name); err != nil {
			errs = append(errs, err)
		}
	}
	if ids, err := s.snaps.SessionIDs(context.WithoutCancel(ctx), id); err != nil { // the session is going: its snapshots go with it
		errs = append(errs, err)
	} else if len(ids) > 0 {
		if _, err := s.snaps.Delete(ctx, id, ids...); err != nil {
			errs = append(errs, fmt.Errorf("delete the snapshots of session %s: %w", id, err))
		}
	}
	s.mu.Lock()
	delete(s.sessions, id)
	s.mu.Unlock()
	if err := s.st.apply(change{delSession: id}); err != nil {
		errs = append(errs, err)
	}
	s.releaseSession(id)
	s.log.Info("session deleted", "session", id, "boxes", len(names))
	return errors.Join(errs...)
}

// CloseSession ends a connection's use of session id (the last MCP session
// served on it ended): its boxes made with destroy_on_close are destroyed,
// the others are kept (they sleep when idle) for the next connection.
func (s *Service) CloseSession(ctx context.Context, id string) error {
	s.mu.Lock()
	sess, err := s.liveSessionLocked(id)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	var names []string
	for name, b := range sess.boxes {
		if b.rec.DestroyOnClose {
			names = append(names, name)
		}
	}
	s.mu.Unlock()
	var errs []error
	for _, name := range names {
		if err := s.destroyBox(ctx, sess, name); err != nil && api.CodeOf(err) != api.CodeNoBox {
			errs = append(errs, err)
		}
	}
	if len(names) > 0 {
		s.log.Info("session closed: destroy_on_close boxes destroyed", "session", id, "boxes", len(names))
	}
	return errors.Join(errs...)
}

// checkCapsLocked refuses n new boxes of sess beyond MaxBoxesPerSession or
// MaxBoxes (the error has the code limit); the caller holds s.mu.
func (s *Service) checkCapsLocked(sess *Session, n int) error {
	return api.WithCode(api.CodeLimit, s.capsExceededLocked(sess, n))
}

func (s *Service) capsExceededLocked(sess *Session, n int) error {
	// A call for several boxes (fork, branch) is told what it has and what
	// it asked for: the count alone can be far from the cap.
	over := func(have, most int, who, flag string) error {
		if n > 1 {
			return fmt.Errorf("%s has %d sandboxes; %d more would pass %d, the most %s may have: ask for fewer, destroy some with sandbox_destroy, or raise the limit (cellbox serve %s)", who, have, n, most, who, flag)
		}
		return fmt.Errorf("%s already has %d sandboxes, the most %s may have: destroy one with sandbox_destroy, or raise the limit (cellbox serve %s)", who, have, who, flag)
	}
	if have := len(sess.boxes); have+n > s.cfg.MaxBoxesPerSession {
		return over(have, s.cfg.MaxBoxesPerSession, "session "+sess.ID, "--max-boxes-per-session")
	}
	all := map[*box]bool{}
	for _, other := range s.sessions {
		for _, b := range other.boxes {
			all[b] = true
		}
	}
	if have := len(all); have+n > s.cfg.MaxBoxes {
		return over(have, s.cfg.MaxBoxes, "this server", "--max-boxes")
	}
	return nil
}

// expireSessions deletes the sessions idle for longer than SessionTTL,
// with their boxes; sessions with a call in flight are kept.
func (s *Service) expireSessions(ctx context.Context) {
	if s.cfg.SessionTTL < 0 {
		return
	}
	s.mu.Lock()
	var idle []string
	for id, sess := range s.sessions {
		busy := false
		for _, b := range sess.boxes {
			busy = busy || b.inflight.Load() > 0
		}
		if !busy && !sess.pinned && time.Since(time.Unix(0, sess.lastUsed.Load())) > s.cfg.SessionTTL {
			idle = append(idle, id)
		}
	}
	s.mu.Unlock()
	for _, id := range idle {
		s.log.Info("session expired", "session", id, "ttl", s.cfg.SessionTTL)
		if err := s.DeleteSession(ctx, id); err != nil && !errors.Is(err, ErrNoSession) {
			s.log.Warn("delete expired session", "session", id, "err", err)
		}
	}
}

// ClientSessions counts the sessions that count against MaxSessions.
func (s *Service) ClientSessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clientSessionsLocked()
}

// clientSessionsLocked counts the sessions clients made: the server's own
// do not count against MaxSessions. The caller holds s.mu.
func (s *Service) clientSessionsLocked() int {
	n := 0
	for _, sess := range s.sessions {
		if !sess.own {
			n++
		}
	}
	return n
}

// ErrOwnSession refuses a client's deletion of a session the server serves
// itself (DeleteSessionForClient).
var ErrOwnSession = api.WithCode(api.CodeRefused, errors.New("it is this server's own session, its runtime's: deleting it would break every pattern's exec and sandbox nodes; stop the patterns instead (cellbox stop NAME, DELETE /v1/patterns/NAME)"))

// DeleteSessionForClient is DeleteSession for a client of the HTTP API,
// which may not delete the server's own sessions (ErrOwnSession).
func (s *Service) DeleteSessionForClient(ctx context.Context, id string) error {
	s.mu.Lock()
	own := s.sessions[id] != nil && s.sessions[id].own
	s.mu.Unlock()
	if own {
		return fmt.Errorf("delete session %s: %w", id, ErrOwnSession)
	}
	return s.DeleteSession(ctx, id)
}

// pin exempts session id from expiry: a session served in-process (the
// runtime of cellbox run and serve, cellbox mcp) belongs to this process,
// which keeps it as long as it needs it or deletes it. Only clients over
// HTTP leave sessions behind. Pins are not stored: the owner pins again
// when it starts.
func (s *Service) pin(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sess := s.sessions[id]; sess != nil {
		sess.pinned = true
	}
}

func (s *Service) sessionRecordLocked(sess *Session) sessionRecord {
	rec := sessionRecord{
		ID:        sess.ID,
		TokenHash: hex.EncodeToString(sess.tokenHash[:]),
		Created:   sess.Created,
		Boxes:     map[string]string{},

		AllowedCommands: sess.allowed,
		Defaults:        sess.defaults,
	}
	for name, b := range sess.boxes {
		if b.rec.ID != "" && b.state != stateNew && !b.rec.OneShot {
			rec.Boxes[name] = b.rec.ID
		}
	}
	return rec
}

// acquireSlot takes a session slot and a global slot for a box creation or
// wake, waiting for them (or ctx). release gives them back.
func (s *Service) acquireSlot(ctx context.Context, sess *Session) (release func(), err error) {
	var sem chan struct{}
	if sess != nil {
		sem = sess.sem
	}
	if sem != nil {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for a free box slot of session %s: %w", sess.ID, ctx.Err())
		}
	}
	select {
	case s.global <- struct{}{}:
	case <-ctx.Done():
		if sem != nil {
			<-sem
		}
		return nil, fmt.Errorf("waiting for a free box slot: %w", ctx.Err())
	}
	return func() {
		<-s.global
		if sem != nil {
			<-sem
		}
	}, nil
}
