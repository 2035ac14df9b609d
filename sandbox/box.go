package sandbox

// A box's life as the pool drives it: the box and its states, leases
// (a box in use by one call), and the transitions — lazy create (from the
// warm pool when it can), wake, recreate, destroy. Each transition holds
// the box's life mutex; the fields it changes are also guarded by
// Service.mu, so a holder of life reads them without Service.mu.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cellbox/cellbox/internal/crashpoint"
	"github.com/cellbox/cellbox/internal/suggest"
	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/egress"
)

// boxState is a box's life state as the pool sees it.
type boxState int

const (
	stateNew      boxState = iota // named, not made yet
	stateRunning                  // agent answers
	stateSleeping                 // stopped (idle, or not reattached yet); woken on use
	stateGone                     // the backend lost it; recreated empty on use
	stateRemoved                  // destroyed
	stateDead                     // died behind the pool's back and could not be restarted; retried on use
)

func (st boxState) String() string {
	return [...]string{"new", "running", "sleeping", "lost", "removed", "dead"}[st]
}

// box is one box of the pool. Lifecycle transitions (create, wake, sleep,
// destroy) hold life; rec, state and client are guarded by Service.mu and
// written only while life is held too, so a holder of life may read them
// without Service.mu.
type box struct {
	life          sync.Mutex
	rec           boxRecord
	state         boxState
	client        *agent.Client
	failed        error                         // why making a new box failed (for waiters)
	policy        atomic.Pointer[egress.Policy] // compiled rec.Egress; nil allows nothing
	inflight      atomic.Int32                  // calls using the box; the reaper leaves it alone
	lastUsed      atomic.Int64                  // unix nanoseconds
	saved         int64                         // lastUsed as last written to the store (guarded by Service.mu)
	kept          atomic.Int64                  // lastUsed at the last checkpoint (backend.Checkpointer)
	checkpointing atomic.Bool                   // a checkpoint runs
	previews      map[int]string                // port -> preview id (guarded by Service.mu)
	note          string                        // what the reaper did to the box, for the next call's notice (guarded by Service.mu)
	// made says the backend box of a new box exists already (a fork's
	// clone made it), so creating it only starts it (guarded by life).
	made bool
	// workspace is held by the tools that read or replace the workspace
	// whole (snapshot, restore, fork), so that two restores never clear
	// and fill it at once, nor a snapshot copy half a restore.
	workspace sync.Mutex
}

// record returns b's record for the store; the caller holds Service.mu.
func (b *box) record() *boxRecord {
	r := b.rec
	r.Previews = maps.Clone(b.previews)
	r.LastUsed = time.Unix(0, b.lastUsed.Load()).UTC()
	return &r
}

func (b *box) touch() { b.lastUsed.Store(time.Now().UnixNano()) }

// lease is a box in use by one call.
type lease struct {
	b      *box
	name   string // the box's name in the caller's session
	client *agent.Client
	once   sync.Once
}

func (l *lease) release() {
	l.once.Do(func() {
		l.b.touch()
		l.b.inflight.Add(-1)
	})
}

// The lengths (1-63) are checked beside these, not by a counted
// repetition, which compiles to a large program at every start.
var (
	nameRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)
	boxIDRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]*$`)
)

const maxNameLen = 63

// CheckName checks that name can name a sandbox: 1-63 letters, digits,
// '.', '_' or '-', starting with a letter or digit.
func CheckName(name string) error {
	if len(name) > maxNameLen || !nameRE.MatchString(name) {
		return api.WithCode(api.CodeInvalidInput, fmt.Errorf("invalid sandbox name %q: use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit", name))
	}
	return nil
}

// boxSpec is what a new box is made from.
type boxSpec struct {
	Image        string
	Env          map[string]string
	Limits       api.Limits
	Network      bool              // full network
	Egress       *api.NetworkRules // allow list (a box without a full network)
	policy       *egress.Policy    // Egress compiled
	SleepAfterMs int64
	ID           string // preset id (shared boxes)
	Shared       bool
	WorkspaceDir string // "": the session's default
	// DestroyOnClose: nil is the session's default.
	DestroyOnClose *bool
	OneShot        bool // Config.OneShot: not stored
}

// acquire returns a lease on the session's box name, creating it with the
// default settings if the session has none by that name, and waking it if
// it sleeps. Notices (box recreated, ...) are passed to notice.
func (s *Service) acquire(ctx context.Context, sess *Session, name string, notice func(string)) (*lease, error) {
	return s.acquireBox(ctx, sess, name, notice, false)
}

// acquireBox is acquire; with mustExist, a box the session has no sandbox
// of that name is an error (no_box) instead of a new box.
func (s *Service) acquireBox(ctx context.Context, sess *Session, name string, notice func(string), mustExist bool) (*lease, error) {
	if name == "" {
		name = api.DefaultBox
	}
	if err := CheckName(name); err != nil {
		return nil, err
	}
	for try := 0; ; try++ {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("sandbox %q: %w", name, err)
		}
		s.mu.Lock()
		if sess.deleted {
			s.mu.Unlock()
			return nil, fmt.Errorf("session %s: %w", sess.ID, ErrNoSession)
		}
		b := sess.boxes[name]
		if b == nil && mustExist {
			s.mu.Unlock()
			return nil, api.WithCode(api.CodeNoBox, fmt.Errorf("no sandbox %q in this session (see sandbox_list)", name))
		}
		if b == nil {
			if err := s.checkCapsLocked(sess, 1); err != nil {
				s.mu.Unlock()
				return nil, fmt.Errorf("create sandbox %q: %w", name, err)
			}
			b = s.newBoxLocked(sess, boxSpec{OneShot: s.oneShot(sess.ID, name)})
			sess.boxes[name] = b
		}
		s.mu.Unlock()
		l, err := s.use(ctx, sess, name, b, notice)
		if errors.Is(err, errRetry) && try < maxRetries {
			continue // lost a race with a destroy or a failed creation
		}
		if errors.Is(err, errRetry) {
			return nil, fmt.Errorf("sandbox %q was destroyed and remade %d times during this call; try again", name, try+1)
		}
		return l, err
	}
}

// maxRetries bounds acquire's retries after losing races with destroys.
const maxRetries = 8

// errRetry says the box changed under the caller; look it up again.
var errRetry = errors.New("retry")

// oneShot says whether the box name of session lives for one run
// (Config.OneShot).
func (s *Service) oneShot(session, name string) bool {
	return s.cfg.OneShot != nil && s.cfg.OneShot(session, name)
}

// newBoxLocked makes a not-yet-created box of sess from spec.
func (s *Service) newBoxLocked(sess *Session, spec boxSpec) *box {
	if spec.Image == "" {
		spec.Image = s.cfg.DefaultImage
	}
	if spec.SleepAfterMs <= 0 {
		spec.SleepAfterMs = DefaultSleepAfter.Milliseconds()
	}
	// The session's defaults fill what the spec leaves open; env merges,
	// the box's own keys winning.
	d := sess.defaults
	if len(d.Env) > 0 {
		env := maps.Clone(d.Env)
		maps.Copy(env, spec.Env)
		spec.Env = env
	}
	spec.WorkspaceDir = cmp.Or(spec.WorkspaceDir, d.WorkspaceDir)
	destroyOnClose := d.DestroyOnClose
	if spec.DestroyOnClose != nil {
		destroyOnClose = *spec.DestroyOnClose
	}
	now := time.Now().UTC()
	b := &box{state: stateNew, rec: boxRecord{
		ID:           spec.ID,
		Session:      sess.ID,
		Shared:       spec.Shared,
		Image:        spec.Image,
		Env:          spec.Env,
		Limits:       spec.Limits,
		Network:      spec.Network,
		Egress:       spec.Egress,
		SleepAfterMs: spec.SleepAfterMs,
		WorkspaceDir: spec.WorkspaceDir,
		Created:      now,
		LastUsed:     now,
		OneShot:      spec.OneShot,
	}}
	if spec.Shared {
		b.rec.Session = ""
	}
	b.policy.Store(spec.policy)
	b.rec.DestroyOnClose = destroyOnClose
	b.touch()
	return b
}

// use brings b up if needed and leases it.
func (s *Service) use(ctx context.Context, sess *Session, name string, b *box, notice func(string)) (*lease, error) {
	b.life.Lock()
	defer b.life.Unlock()
	switch b.state {
	case stateRunning:
		// No ping: a request that cannot reach a dead agent heals the box
		// and is sent again (heal). A box without a client is checked now.
		if b.client == nil {
			if err := s.check(ctx, sess, name, b, notice); err != nil {
				return nil, err
			}
		}
	case stateRemoved:
		if b.failed != nil {
			return nil, b.failed
		}
		if err := s.unbindRemoved(sess, name, b); err != nil {
			return nil, err
		}
		return nil, errRetry
	default:
		if err := s.bringUp(ctx, sess, name, b, notice); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	if b.note != "" {
		notice(b.note)
		b.note = ""
	}
	s.mu.Unlock()
	b.inflight.Add(1)
	b.touch()
	return &lease{b: b, name: name, client: b.client}, nil
}

// unbindRemoved handles a name of sess still bound to the removed box b:
// a shared box another session destroyed while this one attached to it.
// The name is unbound and the caller told; a retry would find b forever.
func (s *Service) unbindRemoved(sess *Session, name string, b *box) error {
	if sess == nil {
		return nil
	}
	s.mu.Lock()
	if sess.boxes[name] != b {
		s.mu.Unlock()
		return nil // rebound meanwhile: retry
	}
	delete(sess.boxes, name)
	srec := s.sessionRecordLocked(sess)
	deleted := sess.deleted
	s.mu.Unlock()
	if !deleted {
		if err := s.st.apply(change{session: &srec}); err != nil {
			s.log.Warn("save session", "session", sess.ID, "err", err)
		}
	}
	return fmt.Errorf("sandbox %q (%s) was destroyed by another session while this one attached to it; create it again with sandbox_create", name, b.rec.ID)
}

// bringUp makes, wakes or recreates b; the caller holds b.life.
func (s *Service) bringUp(ctx context.Context, sess *Session, name string, b *box, notice func(string)) error {
	switch b.state {
	case stateNew:
		if sess == nil {
			return fmt.Errorf("sandbox %q is not made yet", name)
		}
		if err := s.create(ctx, sess, name, b); err != nil {
			s.mu.Lock()
			b.state, b.failed = stateRemoved, err
			if sess.boxes[name] == b {
				delete(sess.boxes, name)
			}
			if b.rec.ID != "" && s.boxes[b.rec.ID] == b {
				delete(s.boxes, b.rec.ID)
			}
			s.mu.Unlock()
			return err
		}
		return nil
	case stateSleeping, stateDead:
		release, err := s.acquireSlot(ctx, sess)
		if err != nil {
			return err
		}
		defer release()
		start := time.Now()
		cl, err := s.wake(ctx, b.rec.ID)
		var pe *agent.ProtocolError
		switch {
		case err == nil:
			s.setRunning(b, cl)
			s.log.Info("box woken", "box", b.rec.ID, "ms", time.Since(start).Milliseconds())
			return nil
		case errors.Is(err, backend.ErrNotFound):
			s.log.Warn("box lost while asleep; recreating it", "box", b.rec.ID, "err", err)
			notice(fmt.Sprintf("sandbox %q (%s) had been lost by the %s backend; it was recreated with an empty workspace", name, b.rec.ID, s.be.Name()))
		case errors.As(err, &pe):
			// A box left running by an older cellbox: restarted, it runs
			// this server's agent on the same disk.
			s.log.Warn("box agent speaks another protocol; restarting it", "box", b.rec.ID, "protocol", pe.Got, "want", agent.ProtocolVersion)
			cl, rerr := s.restart(ctx, b.rec.ID)
			if rerr == nil {
				s.setRunning(b, cl)
				notice(fmt.Sprintf("sandbox %q (%s) ran an agent of protocol %d, this server speaks %d; it was restarted with this server's agent, its workspace kept (its processes ended)", name, b.rec.ID, pe.Got, agent.ProtocolVersion))
				return nil
			}
			s.log.Warn("restarted box still cannot serve this server; recreating it", "box", b.rec.ID, "err", rerr)
			notice(fmt.Sprintf("sandbox %q (%s) ran an agent of protocol %d, this server speaks %d, even once restarted; it was recreated with an empty workspace", name, b.rec.ID, pe.Got, agent.ProtocolVersion))
		default:
			return fmt.Errorf("wake sandbox %q (%s): %w", name, b.rec.ID, err)
		}
		return s.recreate(ctx, name, b)
	case stateGone:
		release, err := s.acquireSlot(ctx, sess)
		if err != nil {
			return err
		}
		defer release()
		notice(fmt.Sprintf("sandbox %q (%s) was lost (it no longer existed in the %s backend when this server started); it was recreated with an empty workspace", name, b.rec.ID, s.be.Name()))
		return s.recreate(ctx, name, b)
	}
	return fmt.Errorf("sandbox %q is %s", name, b.state)
}

// create makes the new box b, from the warm pool when its spec allows.
func (s *Service) create(ctx context.Context, sess *Session, name string, b *box) error {
	start := time.Now()
	rec := b.rec
	if rec.ID == "" && rec.Limits == (api.Limits{}) && !rec.Network && rec.WorkspaceDir == "" {
		if id, cl, ok := s.takeWarm(ctx, rec.Image, rec.OneShot); ok {
			s.setID(b, id)
			if err := s.adopt(sess, name, b, cl); err != nil {
				s.removeBox(context.WithoutCancel(ctx), id)
				return err
			}
			s.log.Info("box created from warm pool", "session", sess.ID, "name", name, "box", id, "ms", time.Since(start).Milliseconds())
			return nil
		}
	}
	release, err := s.acquireSlot(ctx, sess)
	if err != nil {
		return err
	}
	defer release()
	if rec.ID == "" {
		s.setID(b, "cb-"+randomID(8))
	}
	cl, err := s.makeBox(ctx, b.rec, sess.ID, name, b.made)
	if err != nil {
		return fmt.Errorf("create sandbox %q: %w", name, err)
	}
	if err := s.adopt(sess, name, b, cl); err != nil {
		s.removeBox(context.WithoutCancel(ctx), b.rec.ID)
		return err
	}
	crashpoint.Hit("box.stored", b.rec.ID)
	s.log.Info("box created", "session", sess.ID, "name", name, "box", b.rec.ID, "image", b.rec.Image, "ms", time.Since(start).Milliseconds())
	return nil
}

// errShuttingDown refuses a box made or woken after SleepAll: unavailable,
// a call to make again once the server is back.
func errShuttingDown(id string) error {
	return api.WithCode(api.CodeUnavailable, fmt.Errorf("box %s was not started: the server is shutting down and has put its boxes to sleep; call again once it is back", id))
}

// adopt records the freshly made box b as running and owned, in memory and
// in the store. After SleepAll it refuses (the caller removes the box):
// SleepAll stops the boxes s.boxes holds when it runs, and one added later
// would run on after the process exited.
func (s *Service) adopt(sess *Session, name string, b *box, cl *agent.Client) error {
	s.mu.Lock()
	if s.asleep.Load() { // set before SleepAll reads s.boxes, under s.mu
		s.mu.Unlock()
		cl.Close()
		return errShuttingDown(b.rec.ID)
	}
	b.state, b.client = stateRunning, cl
	s.boxes[b.rec.ID] = b
	rec := b.record()
	srec := s.sessionRecordLocked(sess)
	s.mu.Unlock()
	s.lendIfAllowed(rec.ID) // its allow list is known now (a warm box's too)
	if rec.OneShot {
		return nil // not stored: nothing to commit
	}
	if err := s.st.apply(change{box: rec}, change{session: &srec}); err != nil {
		s.mu.Lock()
		b.state, b.client = stateNew, nil
		delete(s.boxes, b.rec.ID)
		s.mu.Unlock()
		cl.Close()
		return fmt.Errorf("save sandbox %q: %w", name, err)
	}
	return nil
}

func (s *Service) setID(b *box, id string) {
	s.mu.Lock()
	b.rec.ID = id
	s.mu.Unlock()
}

func (s *Service) setState(b *box, st boxState) {
	s.mu.Lock()
	b.state = st
	s.mu.Unlock()
}

func (s *Service) setRunning(b *box, cl *agent.Client) {
	s.mu.Lock()
	b.state, b.client = stateRunning, cl
	s.mu.Unlock()
}

func (s *Service) closeClient(b *box) {
	s.mu.Lock()
	cl := b.client
	b.client = nil
	s.mu.Unlock()
	if cl != nil {
		cl.Close()
	}
}

// removeBox removes a backend box and its host directory, logging failures.
func (s *Service) removeBox(ctx context.Context, id string) {
	s.stopEgress(id)
	if err := s.be.Remove(ctx, id); err != nil {
		s.log.Error("remove box", "box", id, "err", err)
	}
	if err := s.removeHostDir(id); err != nil {
		s.log.Warn("remove box host dir", "box", id, "err", err)
	}
}

// destroyBox unbinds name from sess and removes the box, unless it is a
// shared box another session still uses.
func (s *Service) destroyBox(ctx context.Context, sess *Session, name string) error {
	s.mu.Lock()
	b := sess.boxes[name]
	if b == nil {
		names := sortedNames(sess.boxes)
		s.mu.Unlock()
		return api.WithCode(api.CodeNoBox, fmt.Errorf("no sandbox named %q in this session (sandboxes: %s)", name, suggest.ListOrNone(names)))
	}
	delete(sess.boxes, name)
	used := false
	for _, other := range s.sessions {
		for _, ob := range other.boxes {
			used = used || ob == b
		}
	}
	srec := s.sessionRecordLocked(sess)
	s.mu.Unlock()
	var changes []change
	if !sess.deleted && !b.rec.OneShot { // a one-shot box is not in the record
		changes = append(changes, change{session: &srec})
	}
	if used {
		s.log.Info("shared box detached", "session", sess.ID, "box", b.rec.ID)
		return s.st.apply(changes...)
	}
	b.life.Lock()
	defer b.life.Unlock()
	prev := b.state
	s.mu.Lock()
	b.state = stateRemoved // before its client closes: a call it breaks sees why (explain)
	id := b.rec.ID
	if id != "" && s.boxes[id] == b {
		delete(s.boxes, id)
	}
	s.dropPreviewsLocked(b)
	s.mu.Unlock()
	s.closeClient(b)
	if prev != stateNew || b.made { // made: a fork made it before its first use
		s.removeBox(ctx, id)
		if !b.rec.OneShot {
			changes = append(changes, change{delBox: id, owner: sess.ID})
		}
	}
	s.log.Info("box destroyed", "session", sess.ID, "name", name, "box", id)
	return s.st.apply(changes...)
}
