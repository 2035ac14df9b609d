// Package server is cellbox's composition root as a library: it opens a
// data directory's state (State), a box backend and the sandbox service
// over it (OpenBackend, Sandboxes), a runtime over the cells with its API
// (Host), and serves them — the runtime API on the data directory's unix
// socket (Host.ServeUnix), and the tool API, previews, the runtime API and
// the web page over HTTP behind one guard (Host.ServeTCP, Guard: the Host,
// Origin and server key checks; WithBodyPace).
//
// `cellbox serve` and `cellbox run` are two configurations of Open: serve
// opens the sandbox service at once and resumes the patterns it had
// loaded, run opens the service when a node first needs a box
// (RunConfig). Another server role is another Config:
//
//	srv, err := server.Open(ctx, server.Config{DataDir: dir, Backend: "auto", HTTP: server.DefaultHTTPOptions()})
//	if err != nil {
//		return err
//	}
//	defer srv.Close() // stops serving, puts the boxes to sleep
//	ep, err := srv.Host.ServeTCP("127.0.0.1:7078")
//	...
//
// One process owns a data directory at a time: State's file is the lock.
package server

import (
	"cmp"
	"context"
	"errors"
	"log/slog"

	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/backend"
)

// Config says how Open sets up a server over a data directory.
type Config struct {
	// DataDir is the data directory (made if missing): the state file,
	// box directories, the runtime API's socket, the server key.
	DataDir string
	// Backend names the box backend (OpenBackend): docker,
	// docker-remote, local or auto.
	Backend string
	// Sandbox configures the sandbox service; Open sets its Backend,
	// DataDir and State.
	Sandbox sandbox.Config
	// Lazy opens the backend and the sandbox service when a node first
	// needs a box or the tool API gets its first request (`cellbox run`),
	// rather than in Open (`cellbox serve`): a run with nothing to do never
	// opens (or probes) the backend.
	Lazy bool
	// Persist records the loaded patterns, so that Host.API().Resume loads
	// them again after a restart (`cellbox serve`).
	Persist bool
	// HTTP are the options of the Host's servers (start from
	// DefaultHTTPOptions).
	HTTP HTTPOptions
	// Logger: default slog.Default().
	Logger *slog.Logger
	// Cluster shares the state with other servers (docs/cluster.md); the
	// zero value keeps it in DataDir.
	Cluster ClusterConfig
}

// Server is what Open opened: the data directory's state, the sandbox
// service and the runtime's session in it, and the runtime host.
type Server struct {
	State     *State
	Sandboxes *Sandboxes
	Host      *Host
}

// Open opens the data directory's state (first: it is the lock that says
// this process owns the directory), the sandbox service (now, or on first
// need with Config.Lazy) and a runtime host over them. Nothing is served
// yet: Host.ServeUnix and Host.ServeTCP serve it. Close closes it all.
func Open(ctx context.Context, cfg Config) (_ *Server, err error) {
	log := cmp.Or(cfg.Logger, slog.Default())
	s := &Server{}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if cfg.Cluster.On() {
		s.State, err = openShared(ctx, cfg.DataDir, cfg.Cluster)
	} else {
		s.State, err = OpenState(cfg.DataDir)
	}
	if err != nil {
		return nil, err
	}
	cl := s.State.shared
	// The backend opens first, alone (an exec node's memo key may ask it
	// for an image's digest before any box is made), then the service
	// over it.
	sc := cfg.Sandbox
	openBE := func(ctx context.Context) (backend.Backend, error) {
		var keeper backend.Keeper
		if cl != nil {
			sc.Shared, sc.Leaser, sc.Holder = true, cl.Leaser(), cl.Holder()
			bs, k, err := cl.Blobs(ctx)
			if err != nil {
				return nil, err
			}
			if bs != nil {
				// Snapshots, and the kept workspaces of stopped pods, in
				// the bucket every server reaches.
				sc.Blobs, keeper = bs, k
			}
		}
		return openBackend(ctx, cfg.Backend, cfg.DataDir, cfg.Sandbox.AgentBinary, keeper)
	}
	openService := func(ctx context.Context, be backend.Backend) (*sandbox.Service, error) {
		c := sc
		c.Backend, c.DataDir, c.State = be, cfg.DataDir, s.State.Sandbox
		if c.AgentBinary == "" && mountsAgent(be) {
			c.AgentBinary = AgentBinary(log)
		}
		if c.AgentBinary == "" {
			c.AgentBinary = Executable()
		}
		if cl == nil && c.OneShot == nil {
			// The exec stages' boxes live for one run: not stored, so no
			// commit (and its sync) on their way in or out; one a killed
			// process leaves is an orphan the next start removes. Not
			// with servers sharing the state, where a box the store does
			// not know may be another server's.
			c.OneShot = s.execBox
		}
		return sandbox.New(ctx, c)
	}
	if !cfg.Lazy {
		// Opened now under ctx, so that an interrupt cuts it short; the
		// Sandboxes own it from here on.
		be, err := openBE(ctx)
		if err != nil {
			return nil, err
		}
		svc, err := openService(ctx, be)
		if err != nil {
			return nil, err
		}
		openBE = func(context.Context) (backend.Backend, error) { return be, nil }
		openService = func(context.Context, backend.Backend) (*sandbox.Service, error) { return svc, nil }
	}
	s.Sandboxes = LazySandboxes(s.State.Cells, log, openBE, openService)
	if cl != nil {
		s.Sandboxes.sessionKey = sessionKey + "/" + cl.Holder()
	}
	if !cfg.Lazy {
		if _, _, err := s.Sandboxes.Get(ctx); err != nil {
			return nil, err
		}
	}
	if s.Host, err = NewHost(HostConfig{DataDir: cfg.DataDir, Store: s.State.Cells, Sandboxes: s.Sandboxes, Logger: log, Persist: cfg.Persist, HTTP: cfg.HTTP, shared: cl}); err != nil {
		return nil, err
	}
	return s, nil
}

// execBox says whether a box lives for one run: an exec stage's box in
// the runtime's session (nil Sandboxes, before Open made them: none).
func (s *Server) execBox(session, name string) bool {
	return s.Sandboxes != nil && s.Sandboxes.execBox(session, name)
}

// Backend is the box backend, nil until the sandbox service is open.
func (s *Server) Backend() backend.Backend {
	if svc, _ := s.Sandboxes.Opened(); svc != nil {
		return svc.Backend()
	}
	return nil
}

// Close closes what Open opened, in reverse order: the host (its servers
// stopped, the runtime shut down, every box put to sleep), the sandbox
// service, the state.
func (s *Server) Close() error {
	var errs []error
	if s.Host != nil {
		errs = append(errs, s.Host.Close())
	}
	if s.Sandboxes != nil {
		errs = append(errs, s.Sandboxes.Close())
	}
	if s.State != nil {
		errs = append(errs, s.State.Close())
	}
	return errors.Join(errs...)
}

// RunPool is the most warm boxes `cellbox run` keeps.
const RunPool = 2

// RunConfig is the Config of `cellbox run` (and of `cellbox-bench
// pipeline`, which measures it) over dataDir: the backend and the
// sandbox service open on first need; exec stages take fresh boxes from a
// warm pool of the default image whose size follows their use (none
// until a stage runs, at most RunPool, shrinking again when the run is
// idle), and, as under every server that keeps its state to itself, their
// boxes are not stored (Open); loaded patterns are not recorded.
// agentBinary "" is this executable.
func RunConfig(dataDir, backendName, agentBinary string, log *slog.Logger) Config {
	return Config{
		DataDir: dataDir,
		Backend: backendName,
		Sandbox: sandbox.Config{AgentBinary: agentBinary, Pool: map[string]int{backend.DefaultImage: RunPool},
			PoolFollowsUse: true, Logger: log},
		Lazy:   true,
		HTTP:   DefaultHTTPOptions(),
		Logger: log,
	}
}
