// Package sandbox is the box service: sessions, a pool of named boxes per
// session (lazy create, idle sleep, transparent wake, heal, destroy,
// reattach after a restart, warm boxes) and the one tool registry.
//
// Boxes are made by a backend.Backend (sandbox/docker, sandbox/local); every
// operation inside a box is a request to the box's agent (sandbox/agent).
// Sessions, boxes and snapshot records are kept in a state.Store (by
// default the bbolt file of the data directory), so a restarted service
// serves the same sessions and reattaches to their boxes.
//
// Where things are (the concerns of their own are packages beside it:
// sandbox/tools, the registry's machinery and the box tools' handlers;
// sandbox/warm, the warm pools; sandbox/previews, preview ids and origins;
// sandbox/snapshots, the snapshot store; sandbox/state, sandbox/blobs and
// sandbox/lease, the contracts of state, content and ownership):
//
//   - service.go: Config, New, Close; session.go: sessions, tokens, caps,
//     expiry and the create/wake slots.
//   - box.go, box_backend.go: a box's life (create, wake, recreate,
//     destroy) and leases; heal.go: dead boxes noticed and restarted;
//     reaper.go: idle sleep and the periodic round; reconcile.go: matching
//     the store with the backend at start; hostdir.go, network.go: a box's
//     host directory and egress proxy; warmpool.go: what a warm box is;
//     owner.go: the leases this server's background work holds; store.go:
//     the records in the state store.
//   - call.go: a tool call (the per-call value, a tools.Call), CallTool and
//     the registry's profiles; tools_sandboxes.go: the list of tools and
//     the tools that make, list and remove boxes; tools_snap.go: snapshot,
//     restore, branch, fork; preview.go: browse and OpenPreview;
//     network.go: network_set; profiles.go and profile_*.go: the seed tool
//     sets mapped onto the registry's handlers.
//   - ops.go: the streaming operations and LocalClient, the in-process
//     sandboxclient.Client; faces.go: what the faces need from the service.
//
// Locks: Service.mu guards the maps of sessions and boxes and each box's
// state (the warm pools, sandbox/warm, the preview ids, sandbox/previews,
// and the egress proxies, Service.egressMu, have locks of their own); a
// box's own life mutex serializes its transitions (box.go says which
// fields each guards). Never take a life mutex while holding Service.mu.
//
// The faces are packages of their own over the exported API: sandbox/httpapi
// (HTTP API, MCP over HTTP, preview proxy, /metrics) and sandbox/mcpserver
// (the registry as an MCP server, served on stdio by cellbox mcp).
package sandbox

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/blobs"
	leases "github.com/cellbox/cellbox/sandbox/lease"
	"github.com/cellbox/cellbox/sandbox/previews"
	"github.com/cellbox/cellbox/sandbox/snapshots"
	"github.com/cellbox/cellbox/sandbox/state"
	"github.com/cellbox/cellbox/sandbox/warm"
)

// Defaults of Config.
const (
	DefaultPoolSize           = 2
	DefaultSessionConcurrency = 4
	DefaultGlobalConcurrency  = 16
	DefaultSleepAfter         = 10 * time.Minute
	DefaultReapInterval       = 5 * time.Second
	DefaultReadyTimeout       = 30 * time.Second
	DefaultRemoteReadyTimeout = 3 * time.Minute
	DefaultPoolIdle           = 30 * time.Second
	DefaultMaxBoxesPerSession = 32
	DefaultMaxBoxes           = 256
	// DefaultMaxSessions caps the sessions of a server: each may keep
	// DefaultMaxSnapshotBytes of snapshots, so the number bounds the disk.
	DefaultMaxSessions      = 1024
	DefaultSessionTTL       = 24 * time.Hour
	DefaultMaxSnapshotBytes = 16 << 30
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
	// DataDir holds the state file (StateFile, unless State is set), the
	// snapshots' blobs and the boxes' host directories (boxes/<id>).
	// Required.
	DataDir string
	// State, if set, is the store to keep sessions, boxes and snapshot
	// records in (cellbox run and serve give state.OpenBolt over the file
	// they keep cells in); the service does not close it. Unset, the
	// service opens DataDir/StateFile and closes it on Close.
	State state.Store
	// AgentBinary is the static cellbox binary run as every box's agent.
	// Default: os.Executable().
	AgentBinary string
	// DefaultImage is the image of boxes created without one.
	// Default backend.DefaultImage.
	DefaultImage string
	// Pool is the number of pre-started boxes kept per image. nil means
	// {DefaultImage: DefaultPoolSize}; an empty map keeps none.
	Pool map[string]int
	// PoolFollowsUse starts each pool empty and lets its size follow use,
	// up to its Pool size: every box creation that could take a pooled box
	// grows it by one, every PoolIdle without one shrinks it by one
	// (cellbox run: exec stages get warm boxes, an idle run keeps none).
	PoolFollowsUse bool
	// PoolBurstsOnly (with PoolFollowsUse) sizes each pool by
	// ExpectBoxes alone: the boxes of the stages a run expects, and none
	// after them (cellbox run --once, which exits when its run is done).
	PoolBurstsOnly bool
	// OneShot, if set, names the boxes that live for one run, by session
	// and box name (cellbox run and serve: the exec stages' boxes of the
	// runtime's session). Their creations are the uses a use-following
	// pool follows (other boxes still take a ready box, but neither grow
	// the pool nor keep it from shrinking), and they are not stored: no
	// commit on their way in or out; a process that dies leaves them to
	// the next start's reconcile, which removes backend boxes the store
	// does not know.
	OneShot func(session, name string) bool
	// PoolIdle is how long a use-following pool stays unused before it
	// shrinks by a box. Default DefaultPoolIdle.
	PoolIdle time.Duration
	// SessionConcurrency and GlobalConcurrency bound the box creations and
	// wakes in flight, per session and in all; more wait their turn.
	SessionConcurrency int
	GlobalConcurrency  int
	// ReapInterval is how often idle boxes are looked for. Default 5s.
	ReapInterval time.Duration
	// Blobs keeps the content of snapshots. Default: the directory
	// DataDir/snapshots (blobs.Dir); several servers share one that all
	// reach (an S3 bucket).
	Blobs blobs.Store
	// Leaser grants the leases of the reaper and the warm pools: they act
	// only while this server holds them (owner.go). Default lease.Local,
	// which always does; several servers sharing state share a Leaser.
	Leaser leases.Leaser
	// Holder names this server to Leaser. Default: host, pid and a random
	// part.
	Holder string
	// Shared says that State is shared with other servers (etcd): each
	// session is served by the one server that holds its lease, taken
	// when a call first needs it here (shared.go); New loads nothing and
	// removes no orphans, since the boxes it finds may be another
	// server's.
	Shared bool
	// ReadyTimeout bounds the wait for a started box's agent. Default 30s,
	// 3m on a backend whose boxes run elsewhere (Capabilities.Remote).
	ReadyTimeout time.Duration
	// MaxBoxesPerSession and MaxBoxes cap the sandboxes of one session and
	// of all sessions (warm pool boxes aside); a creation beyond either is
	// refused. Defaults DefaultMaxBoxesPerSession, DefaultMaxBoxes; cellbox
	// serve sets them with --max-boxes-per-session and --max-boxes.
	MaxBoxesPerSession int
	MaxBoxes           int
	// MaxSessions caps the sessions that exist at once; a new one past it
	// is refused (limit). Default DefaultMaxSessions; cellbox serve sets
	// it with --max-sessions.
	MaxSessions int
	// MaxSnapshotBytes caps the bytes one session's snapshots take in the
	// store (deduplicated); a snapshot past it is refused. Default
	// DefaultMaxSnapshotBytes; cellbox serve sets it with
	// --max-snapshot-bytes.
	MaxSnapshotBytes int64
	// SessionTTL is how long a session may stay idle (no call) before the
	// reaper deletes it with its boxes. 0 means DefaultSessionTTL, a
	// negative value never; cellbox serve sets it with --session-ttl.
	SessionTTL time.Duration
	// BaseURL is this server's URL as a browser on this machine reaches it
	// (http://127.0.0.1:PORT); preview URLs start with it. See SetBaseURL.
	BaseURL string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// EgressRootCAs verify the HTTPS upstreams of network inject rules
	// with tls: true; nil means the host's roots (tests set their own).
	EgressRootCAs *x509.CertPool
}

// Service is the box service. Create it with New; it is safe for
// concurrent use.
type Service struct {
	cfg     Config
	be      backend.Backend
	caps    backend.Capabilities // be's, asked once
	st      *store
	snaps   *snapshots.Store
	log     *slog.Logger
	metrics *metrics
	global  chan struct{} // global create/wake slots
	pools   *warm.Pools[warmBox]
	// previews maps preview ids to their boxes and ports (a lock of its
	// own; taken under Service.mu, never the other way round).
	previews *previews.Table
	baseURL  atomic.Pointer[string]

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	sessions map[string]*Session
	boxes    map[string]*box // by id; boxes that exist (or existed) in the backend
	closed   bool

	// egressMu guards proxies, the egress proxies by box id, and
	// serializes startEgress, so two starts for one box never both place
	// a socket. Taken before Service.mu, never under it.
	egressMu sync.Mutex
	proxies  map[string]*boxProxy
	// hostDirMu serializes mounting and removing boxes' host directories
	// (hostdir.go), so that two wakes never mount one twice.
	hostDirMu sync.Mutex
	leaseMu   sync.Mutex
	held      map[string]*leases.Held // the leases this server holds, by name
	// fenced is the fence of each session whose lease this server took
	// (Config.Shared), kept when the lease is lost: a write of its records
	// from here on is refused (sessionFences).
	fenced  map[string]state.Fence
	adoptMu sync.Mutex // one session taken over at a time (shared.go)
	// orphansScanned is when the reaper last looked for sessions no
	// server serves (adoptOrphans); the reaper's goroutine's alone.
	orphansScanned time.Time
	// swept is when the reaper last swept the snapshot blobs (its
	// goroutine's alone).
	swept time.Time
	// asleep is set by SleepAll: the process is shutting down, and no box
	// starts again (wake refuses) to run on after it exits.
	asleep atomic.Bool
}

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
	if cfg.Leaser == nil {
		cfg.Leaser = leases.NewLocal()
	}
	if cfg.Holder == "" {
		cfg.Holder = leases.DefaultHolder()
	}
	if cfg.ReapInterval <= 0 {
		cfg.ReapInterval = DefaultReapInterval
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
		if cfg.Backend != nil && cfg.Backend.Capabilities().Remote {
			// A pod is scheduled, its images and agent set up, by a
			// cluster that may be busy: a box there takes seconds, not
			// milliseconds, and ten made at once longer still.
			cfg.ReadyTimeout = DefaultRemoteReadyTimeout
		}
	}
	if cfg.PoolIdle <= 0 {
		cfg.PoolIdle = DefaultPoolIdle
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxBoxesPerSession <= 0 {
		cfg.MaxBoxesPerSession = DefaultMaxBoxesPerSession
	}
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = DefaultMaxSessions
	}
	if cfg.MaxBoxes <= 0 {
		cfg.MaxBoxes = DefaultMaxBoxes
	}
	if cfg.MaxSnapshotBytes <= 0 {
		cfg.MaxSnapshotBytes = DefaultMaxSnapshotBytes
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
	if err := makeEgressDir(cfg.DataDir); err != nil {
		return nil, err
	}
	st, err := openStore(ctx, filepath.Join(cfg.DataDir, StateFile), cfg.State)
	if err != nil {
		return nil, err
	}
	snaps, err := snapshots.Open(st.st, cfg.Blobs, cfg.DataDir, cfg.Shared)
	if err != nil {
		st.close()
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	s := &Service{
		cfg:      cfg,
		be:       cfg.Backend,
		caps:     cfg.Backend.Capabilities(),
		st:       st,
		snaps:    snaps,
		log:      cfg.Logger,
		metrics:  newMetrics(),
		global:   make(chan struct{}, cfg.GlobalConcurrency),
		ctx:      sctx,
		cancel:   cancel,
		sessions: map[string]*Session{},
		held:     map[string]*leases.Held{},
		fenced:   map[string]state.Fence{},
		boxes:    map[string]*box{},
		previews: previews.NewTable(),
		proxies:  map[string]*boxProxy{},
	}
	s.SetBaseURL(cfg.BaseURL)
	if cfg.Shared {
		st.fences = s.sessionFences
		s.log.Info("state shared with other servers: sessions are taken over as calls need them")
	} else if err := s.reconcile(ctx); err != nil {
		cancel()
		st.close()
		return nil, err
	}
	s.pools = s.newPools()
	s.pools.Fill()
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
// same data directory reattaches to them. A process that shuts down for
// good calls SleepAll first, so that none runs on without it.
func (s *Service) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	// Before the leases go (a session's, cancelled with s.ctx, fences the
	// writes of its records).
	s.flushLastUsed()
	s.cancel()
	s.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.pools.Close(ctx)
	s.stopAllEgress()
	s.releaseLeases()
	s.mu.Lock()
	for _, b := range s.boxes {
		if cl := b.client; cl != nil {
			cl.Close()
		}
	}
	s.mu.Unlock()
	return s.st.close()
}

// maxSocketPath is the longest unix socket path (sun_path less its NUL).
const maxSocketPath = 107

// socketPath is the host path of the agent socket of a box id made now
// (hostdir.go), for checking its length.
func socketPath(dataDir, id string) string {
	return filepath.Join(dataDir, "boxes", id, hostRunDir, backend.SocketName)
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

func sortedNames[V any](m map[string]V) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
