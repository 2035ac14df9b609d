// Package sandbox is the box service: sessions, a pool of named boxes per
// session (lazy create, idle sleep, transparent wake, destroy, reattach after
// a restart, pre-started warm boxes), the one tool registry, the HTTP API and
// the preview proxy.
//
// Boxes are made by a backend.Backend (sandbox/docker, sandbox/local); every
// operation inside a box is a request to the box's agent (sandbox/agent).
// Sessions and boxes are kept in one bbolt file in the data directory, so a
// restarted service serves the same sessions and reattaches to their boxes.
package sandbox

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/backend"
)

// Defaults of Config.
const (
	DefaultPoolSize           = 2
	DefaultSessionConcurrency = 4
	DefaultGlobalConcurrency  = 16
	DefaultSleepAfter         = 10 * time.Minute
	DefaultReapInterval       = 5 * time.Second
	DefaultReadyTimeout       = 30 * time.Second
	DefaultMaxBoxesPerSession = 32
	DefaultMaxBoxes           = 256
	DefaultSessionTTL         = 24 * time.Hour
)

// labelInstance marks the backend boxes of one data directory, so that two
// services on one engine never take each other's boxes for orphans.
const labelInstance = "cellbox.instance"

// StateFile is the bbolt file of a data directory.
const StateFile = "cellbox.db"

// Config configures a Service.
type Config struct {
	// Backend makes the boxes. Required.
	Backend backend.Backend
	// DataDir holds the state file (StateFile) and the boxes' host
	// directories (boxes/<id>). Required.
	DataDir string
	// DB, if set, is the open state file to keep sessions and boxes in,
	// shared with its opener (cellbox run and serve keep cells in the same
	// file); the service does not close it.
	DB *bolt.DB
	// AgentBinary is the static cellbox binary run as every box's agent.
	// Default: os.Executable().
	AgentBinary string
	// DefaultImage is the image of boxes created without one.
	// Default backend.DefaultImage.
	DefaultImage string
	// Pool is the number of pre-started boxes kept per image. nil means
	// {DefaultImage: DefaultPoolSize}; an empty map keeps none.
	Pool map[string]int
	// SessionConcurrency and GlobalConcurrency bound the box creations and
	// wakes in flight, per session and in all; more wait their turn.
	SessionConcurrency int
	GlobalConcurrency  int
	// ReapInterval is how often idle boxes are looked for. Default 5s.
	ReapInterval time.Duration
	// ReadyTimeout bounds the wait for a started box's agent. Default 30s.
	ReadyTimeout time.Duration
	// MaxBoxesPerSession and MaxBoxes cap the sandboxes of one session and
	// of all sessions (warm pool boxes aside); a creation beyond either is
	// refused. Defaults DefaultMaxBoxesPerSession, DefaultMaxBoxes; cellbox
	// serve sets them with --max-boxes-per-session and --max-boxes.
	MaxBoxesPerSession int
	MaxBoxes           int
	// SessionTTL is how long a session may stay idle (no call) before the
	// reaper deletes it with its boxes. 0 means DefaultSessionTTL, a
	// negative value never; cellbox serve sets it with --session-ttl.
	SessionTTL time.Duration
	// BaseURL is this server's URL as a browser on this machine reaches it
	// (http://127.0.0.1:PORT); preview URLs start with it. See SetBaseURL.
	BaseURL string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Service is the box service. Create it with New; it is safe for
// concurrent use.
type Service struct {
	cfg     Config
	be      backend.Backend
	st      *store
	log     *slog.Logger
	metrics *metrics
	global  chan struct{} // global create/wake slots
	baseURL atomic.Pointer[string]

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	sessions map[string]*Session
	boxes    map[string]*box          // by id; boxes that exist (or existed) in the backend
	previews map[string]previewTarget // preview id -> box and port
	pools    map[string]*warmPool     // by image
	closed   bool
}

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
	allowed   allowList       // allowed_commands; fixed when the session is made
}

// Errors of session lookups, for the HTTP layer to map to status codes.
var (
	ErrNoSession = api.ErrNoSession // "no such session"
	ErrBadToken  = errors.New("token does not grant access to this session")
)

// New opens (or creates) the state in cfg.DataDir, reconciles it with the
// backend — reattaching boxes that still run, marking lost ones, removing
// orphans — and starts the idle reaper and the warm pool.
func New(ctx context.Context, cfg Config) (*Service, error) {
	if cfg.Backend == nil {
		return nil, errors.New("sandbox: Config.Backend is required")
	}
	if cfg.DataDir == "" {
		return nil, errors.New("sandbox: Config.DataDir is required")
	}
	if cfg.AgentBinary == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("sandbox: find agent binary: %w", err)
		}
		cfg.AgentBinary = exe
	}
	if cfg.DefaultImage == "" {
		cfg.DefaultImage = backend.DefaultImage
	}
	if cfg.Pool == nil {
		cfg.Pool = map[string]int{cfg.DefaultImage: DefaultPoolSize}
	}
	if cfg.SessionConcurrency <= 0 {
		cfg.SessionConcurrency = DefaultSessionConcurrency
	}
	if cfg.GlobalConcurrency <= 0 {
		cfg.GlobalConcurrency = DefaultGlobalConcurrency
	}
	if cfg.ReapInterval <= 0 {
		cfg.ReapInterval = DefaultReapInterval
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxBoxesPerSession <= 0 {
		cfg.MaxBoxesPerSession = DefaultMaxBoxesPerSession
	}
	if cfg.MaxBoxes <= 0 {
		cfg.MaxBoxes = DefaultMaxBoxes
	}
	if cfg.SessionTTL == 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if err := os.MkdirAll(filepath.Join(cfg.DataDir, "boxes"), 0o700); err != nil {
		return nil, fmt.Errorf("sandbox: create data dir: %w", err)
	}
	if n := len(socketPath(cfg.DataDir, "cb-0123456789abcdef")); n > maxSocketPath {
		return nil, fmt.Errorf("sandbox: data dir %s is too long: box agent sockets under it would have %d-byte paths, unix sockets allow %d; use a shorter --data path", cfg.DataDir, n, maxSocketPath)
	}
	st, err := openStore(filepath.Join(cfg.DataDir, StateFile), cfg.DB)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	s := &Service{
		cfg:      cfg,
		be:       cfg.Backend,
		st:       st,
		log:      cfg.Logger,
		metrics:  newMetrics(),
		global:   make(chan struct{}, cfg.GlobalConcurrency),
		ctx:      sctx,
		cancel:   cancel,
		sessions: map[string]*Session{},
		boxes:    map[string]*box{},
		previews: map[string]previewTarget{},
		pools:    map[string]*warmPool{},
	}
	s.SetBaseURL(cfg.BaseURL)
	if err := s.reconcile(ctx); err != nil {
		cancel()
		st.close()
		return nil, err
	}
	for image, n := range cfg.Pool {
		if n > 0 {
			s.pools[image] = &warmPool{image: image, size: n}
		}
	}
	s.fillPools()
	s.wg.Add(1)
	go s.reaper()
	return s, nil
}

// SetBaseURL sets the URL preview links start with (e.g. once the listener's
// port is known).
func (s *Service) SetBaseURL(u string) {
	for len(u) > 0 && u[len(u)-1] == '/' {
		u = u[:len(u)-1]
	}
	s.baseURL.Store(&u)
}

// Backend returns the backend the service makes boxes with.
func (s *Service) Backend() backend.Backend { return s.be }

// Close stops the reaper and the warm pool, removes the pooled boxes and
// saves the state. Boxes of sessions keep running; a new Service over the
// same data directory reattaches to them.
func (s *Service) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.drainPools(ctx)
	s.flushLastUsed()
	s.mu.Lock()
	for _, b := range s.boxes {
		if cl := b.client; cl != nil {
			cl.Close()
		}
	}
	s.mu.Unlock()
	return s.st.close()
}

// NewSession creates a session and returns its id and bearer token. Only a
// SHA-256 of the token is kept.
func (s *Service) NewSession(ctx context.Context) (id, token string, err error) {
	return s.NewSessionWith(ctx, api.NewSessionRequest{})
}

// NewSessionWith is NewSession with options (allowed_commands).
func (s *Service) NewSessionWith(ctx context.Context, opts api.NewSessionRequest) (id, token string, err error) {
	allowed, err := newAllowList(opts.AllowedCommands)
	if err != nil {
		return "", "", err
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
	}
	sess.lastUsed.Store(sess.Created.UnixNano())
	s.mu.Lock()
	s.sessions[id] = sess
	rec := s.sessionRecordLocked(sess)
	s.mu.Unlock()
	if err := s.st.apply(change{session: &rec}); err != nil {
		s.mu.Lock()
		delete(s.sessions, id)
		s.mu.Unlock()
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
	defer s.mu.Unlock()
	sess := s.sessions[id]
	if sess == nil || sess.deleted {
		return nil, fmt.Errorf("session %q: %w", id, ErrNoSession)
	}
	sess.lastUsed.Store(time.Now().UnixNano())
	return sess, nil
}

// DeleteSession destroys every box of the session (shared boxes only when
// no other session uses them) and forgets the session.
func (s *Service) DeleteSession(ctx context.Context, id string) error {
	s.mu.Lock()
	sess := s.sessions[id]
	if sess == nil || sess.deleted {
		s.mu.Unlock()
		return fmt.Errorf("session %q: %w", id, ErrNoSession)
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
	s.mu.Lock()
	delete(s.sessions, id)
	s.mu.Unlock()
	if err := s.st.apply(change{delSession: id}); err != nil {
		errs = append(errs, err)
	}
	s.log.Info("session deleted", "session", id, "boxes", len(names))
	return errors.Join(errs...)
}

// checkCapsLocked refuses a new box of sess beyond MaxBoxesPerSession or
// MaxBoxes (the error has the code limit); the caller holds s.mu.
func (s *Service) checkCapsLocked(sess *Session) error {
	return api.WithCode(api.CodeLimit, s.capsExceededLocked(sess))
}

func (s *Service) capsExceededLocked(sess *Session) error {
	if n := len(sess.boxes); n >= s.cfg.MaxBoxesPerSession {
		return fmt.Errorf("session %s already has %d sandboxes, the most a session may have: destroy one with sandbox_destroy, or raise the limit (cellbox serve --max-boxes-per-session)", sess.ID, n)
	}
	all := map[*box]bool{}
	for _, other := range s.sessions {
		for _, b := range other.boxes {
			all[b] = true
		}
	}
	if n := len(all); n >= s.cfg.MaxBoxes {
		return fmt.Errorf("this server already has %d sandboxes in all sessions, the most it may have: destroy some with sandbox_destroy, or raise the limit (cellbox serve --max-boxes)", n)
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
	}
	for name, b := range sess.boxes {
		if b.rec.ID != "" && b.state != stateNew {
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

// Boxes' host directories live under DataDir/boxes.
func (s *Service) hostDir(id string) string { return filepath.Join(s.cfg.DataDir, "boxes", id) }

// maxSocketPath is the longest unix socket path (sun_path less its NUL).
const maxSocketPath = 107

// socketPath is the host path of box id's agent socket.
func socketPath(dataDir, id string) string {
	return filepath.Join(dataDir, "boxes", id, backend.SocketName)
}

// defaultSleepAfter returns ms or the default.
func sleepAfter(ms int64) time.Duration {
	if ms <= 0 {
		return DefaultSleepAfter
	}
	return time.Duration(ms) * time.Millisecond
}

// toBackendLimits converts wire limits.
func toBackendLimits(l api.Limits) backend.Limits {
	return backend.Limits{MemoryBytes: l.MemoryBytes, CPUs: l.CPUs, Pids: l.Pids, DiskBytes: l.DiskBytes}
}
