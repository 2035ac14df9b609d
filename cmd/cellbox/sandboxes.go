package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/cellbox/cellbox/builtins"
	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandboxclient"
)

// sandboxes is the sandbox service of a runtime host and the host's
// session in it. `cellbox run` opens them on first need — the first box a
// node asks for, or the first request to the tool API — so that a run
// with nothing to do never opens (or probes) the backend; `cellbox serve`
// gives an open service.
type sandboxes struct {
	store cells.Store
	log   *slog.Logger
	open  func(ctx context.Context) (*sandbox.Service, error) // opens the service, or returns the one given
	owned bool                                                // close closes svc (false: the service was given)

	once    sync.Once
	mu      sync.Mutex
	svc     *sandbox.Service
	session string
	err     error
	baseURL string
}

// openTimeout bounds opening the backend and the service on first need.
const openTimeout = 2 * time.Minute

// lazySandboxes opens the service with open on first need (and closes it
// at close).
func lazySandboxes(store cells.Store, log *slog.Logger, open func(ctx context.Context) (*sandbox.Service, error)) *sandboxes {
	return &sandboxes{store: store, log: log, open: open, owned: true}
}

// openSandboxes uses the open service svc, its caller's to close; the
// session is found (or made) at once.
func openSandboxes(ctx context.Context, store cells.Store, log *slog.Logger, svc *sandbox.Service) (*sandboxes, error) {
	s := &sandboxes{store: store, log: log, open: func(context.Context) (*sandbox.Service, error) { return svc, nil }}
	_, _, err := s.get(ctx)
	return s, err
}

// get opens the service and the session if not yet done. The first
// caller's cancellation does not cut the opening short for the others.
func (s *sandboxes) get(ctx context.Context) (*sandbox.Service, string, error) {
	s.once.Do(func() {
		octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), openTimeout)
		defer cancel()
		svc, session, err := s.start(octx)
		s.mu.Lock()
		defer s.mu.Unlock()
		s.svc, s.session, s.err = svc, session, err
		if svc != nil && s.baseURL != "" {
			svc.SetBaseURL(s.baseURL)
		}
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.svc, s.session, s.err
}

// start opens the service, finds the session and removes the exec boxes
// a killed process left in it.
func (s *sandboxes) start(ctx context.Context) (*sandbox.Service, string, error) {
	svc, err := s.open(ctx)
	if err != nil {
		return nil, "", err
	}
	session, err := runtimeSession(ctx, s.store, svc)
	if err != nil {
		if s.owned {
			svc.Close()
		}
		return nil, "", err
	}
	// No box of this process exists yet (every call waits for this open),
	// so an exec box in the session is a killed process's leftover.
	env := builtins.Env{Client: svc.Client(session), Logger: s.log}
	if _, err := builtins.RemoveLeftoverExecBoxes(ctx, env); err != nil {
		s.log.Warn("remove leftover exec boxes", "error", err)
	}
	return svc, session, nil
}

// opened returns the service and session if they are open.
func (s *sandboxes) opened() (*sandbox.Service, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.svc, s.session
}

// setBaseURL sets the base URL of previews, now or when the service opens.
func (s *sandboxes) setBaseURL(u string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.baseURL = u
	if s.svc != nil {
		s.svc.SetBaseURL(u)
	}
}

// sleep puts every box of the service to sleep, if it was opened: those
// of the runtime's session and those of the tool API's sessions. The host
// calls it as the process shuts down, once its APIs stopped: nothing is
// left to put a box to sleep after that (the reaper lives in this
// process), and a running box holds a mounted disk.
func (s *sandboxes) sleep(ctx context.Context) error {
	if svc, _ := s.opened(); svc != nil {
		return svc.SleepAll(ctx)
	}
	return nil
}

// close closes a service this opened.
func (s *sandboxes) close() error {
	if svc, _ := s.opened(); svc != nil && s.owned {
		return svc.Close()
	}
	return nil
}

// handler is build(svc) for the open service, built on its first request
// (which opens the service); if the service cannot open, every request
// gets 503 saying why.
func (s *sandboxes) handler(build func(*sandbox.Service) http.Handler) http.Handler {
	return lazyHandler(func() http.Handler {
		svc, _, err := s.get(context.Background())
		if err != nil {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, fmt.Sprintf("the sandbox service could not start: %v", err), http.StatusServiceUnavailable)
			})
		}
		return build(svc)
	})
}

// client is the session's client, opening the service on its first call.
func (s *sandboxes) client() sandboxclient.Client { return lazyClient{s} }

// lazyClient is a sandboxclient.Client (and ToolLister) that opens the
// service on its first call.
type lazyClient struct{ s *sandboxes }

func (c lazyClient) get(ctx context.Context) (*sandbox.LocalClient, error) {
	svc, session, err := c.s.get(ctx)
	if err != nil {
		return nil, fmt.Errorf("start the sandbox service: %w", err)
	}
	return svc.Client(session), nil
}

func (c lazyClient) Tool(ctx context.Context, name string, input any) (json.RawMessage, error) {
	cl, err := c.get(ctx)
	if err != nil {
		return nil, err
	}
	return cl.Tool(ctx, name, input)
}

func (c lazyClient) CreateBox(ctx context.Context, in api.SandboxCreateInput) (api.SandboxCreateOutput, error) {
	cl, err := c.get(ctx)
	if err != nil {
		return api.SandboxCreateOutput{}, err
	}
	return cl.CreateBox(ctx, in)
}

func (c lazyClient) Exec(ctx context.Context, box string, req api.ExecRequest, onOutput func(stream string, data []byte)) (api.ExecResult, error) {
	cl, err := c.get(ctx)
	if err != nil {
		return api.ExecResult{}, err
	}
	return cl.Exec(ctx, box, req, onOutput)
}

func (c lazyClient) Upload(ctx context.Context, box, path string, r io.Reader) (int64, error) {
	cl, err := c.get(ctx)
	if err != nil {
		return 0, err
	}
	return cl.Upload(ctx, box, path, r)
}

func (c lazyClient) Download(ctx context.Context, box, path string, w io.Writer) (int64, error) {
	cl, err := c.get(ctx)
	if err != nil {
		return 0, err
	}
	return cl.Download(ctx, box, path, w)
}

func (c lazyClient) Watch(ctx context.Context, box, path string) (<-chan []api.WatchEvent, error) {
	cl, err := c.get(ctx)
	if err != nil {
		return nil, err
	}
	return cl.Watch(ctx, box, path)
}

func (c lazyClient) DestroyBox(ctx context.Context, box string) error {
	cl, err := c.get(ctx)
	if err != nil {
		return err
	}
	return cl.DestroyBox(ctx, box)
}

func (c lazyClient) Tools(ctx context.Context) ([]api.ToolInfo, error) {
	cl, err := c.get(ctx)
	if err != nil {
		return nil, err
	}
	return cl.Tools(ctx)
}
