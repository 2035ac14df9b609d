package server

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cellbox/cellbox/builtins"
	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandboxclient"
)

// Sandboxes is the sandbox service of a Host and the host's session in
// it, the session its runtime's boxes live in. `cellbox run` opens them on
// first need (LazySandboxes) — the first box a node asks for, or the first
// request to the tool API — so that a run with nothing to do never opens
// (or probes) the backend; `cellbox serve` gives an open service
// (OpenSandboxes).
type Sandboxes struct {
	store cells.Store
	log   *slog.Logger
	// openBackend opens the backend alone (nil when the service was
	// given): image digests are asked of it before the service is open.
	openBackend func(ctx context.Context) (backend.Backend, error)
	// open opens the service over the backend, or returns the one given.
	open  func(ctx context.Context, be backend.Backend) (*sandbox.Service, error)
	owned bool // close closes svc (false: the service was given)
	// sessionKey is where in sessionBucket the runtime's session is
	// recorded: sessionKey, or one of this server's own when servers
	// share the store (each runtime has a session of its own).
	sessionKey string

	once    sync.Once
	beOnce  sync.Once
	be      backend.Backend
	beErr   error
	mu      sync.Mutex
	svc     *sandbox.Service
	session string
	err     error
	baseURL string
	// runtimeSession is session, read without mu: the sandbox service
	// asks it (execBox) under its own lock.
	runtimeSession atomic.Pointer[string]
	// expect is ExpectBoxes' hint, handed to the service when it opens;
	// begin is BeginBoxes', for the same moment.
	expect map[string]int
	begin  bool
}

// openTimeout bounds opening the backend and the service on first need.
const openTimeout = 2 * time.Minute

// LazySandboxes opens the service on first need (and closes it at
// Close): the backend with openBackend, then the service over it with
// open. The backend alone opens first when an exec node's memo key asks
// for an image's digest (lazyClient.ImageDigest). The runtime's session
// is recorded in store, so that a restart finds its boxes again.
func LazySandboxes(store cells.Store, log *slog.Logger, openBackend func(ctx context.Context) (backend.Backend, error), open func(ctx context.Context, be backend.Backend) (*sandbox.Service, error)) *Sandboxes {
	return &Sandboxes{store: store, log: log, openBackend: openBackend, open: open, owned: true}
}

// OpenSandboxes uses the open service svc, its caller's to close; the
// session is found (or made) at once.
func OpenSandboxes(ctx context.Context, store cells.Store, log *slog.Logger, svc *sandbox.Service) (*Sandboxes, error) {
	s := &Sandboxes{store: store, log: log, open: func(context.Context, backend.Backend) (*sandbox.Service, error) { return svc, nil }}
	_, _, err := s.Get(ctx)
	return s, err
}

// Get returns the service and the runtime's session in it, opening them
// if not yet done. The first caller's cancellation does not cut the
// opening short for the others; an opening that failed fails every Get.
func (s *Sandboxes) Get(ctx context.Context) (*sandbox.Service, string, error) {
	s.once.Do(func() {
		octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), openTimeout)
		defer cancel()
		svc, session, err := s.start(octx)
		if err == nil {
			s.runtimeSession.Store(&session)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.svc, s.session, s.err = svc, session, err
		if svc != nil && s.baseURL != "" {
			svc.SetBaseURL(s.baseURL)
		}
		if svc != nil {
			for image, n := range s.expect {
				svc.ExpectBoxes(image, n)
				if s.begin {
					svc.BeginBoxes(image)
				}
			}
		}
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.svc, s.session, s.err
}

// start opens the service, finds the session and removes the exec boxes
// a killed process left in it.
func (s *Sandboxes) start(ctx context.Context) (*sandbox.Service, string, error) {
	var be backend.Backend
	if s.openBackend != nil {
		var err error
		if be, err = s.backend(ctx); err != nil {
			return nil, "", err
		}
	}
	svc, err := s.open(ctx, be)
	if err != nil {
		return nil, "", err
	}
	session, made, err := runtimeSession(ctx, s.store, svc, cmp.Or(s.sessionKey, sessionKey))
	if err != nil {
		if s.owned {
			svc.Close()
		}
		return nil, "", err
	}
	// No box of this process exists yet (every call waits for this open),
	// so an exec box in the session is a killed process's leftover; a
	// session made just now has none.
	if !made {
		env := builtins.Env{Client: svc.Client(session), Logger: s.log}
		if _, err := builtins.RemoveLeftoverExecBoxes(ctx, env); err != nil {
			s.log.Warn("remove leftover exec boxes", "error", err)
		}
	}
	return svc, session, nil
}

// backend opens the backend alone, once (openBackend). The first caller's
// cancellation does not cut the opening short for the others.
func (s *Sandboxes) backend(ctx context.Context) (backend.Backend, error) {
	s.beOnce.Do(func() {
		octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), openTimeout)
		defer cancel()
		s.be, s.beErr = s.openBackend(octx)
	})
	return s.be, s.beErr
}

// sessionBucket and sessionKey are where the runtime's session is
// recorded: a meta bucket of the cell store (its name is from the days
// this code lived in cmd/cellbox, and stays: data dirs hold it).
const sessionBucket, sessionKey = "cmd.cellbox", "sandbox.session"

// runtimeSession returns the sandbox session the runtime's boxes live in:
// the one recorded in the store if the service still has it, else a new
// one, recorded (made says so).
func runtimeSession(ctx context.Context, store cells.Store, svc *sandbox.Service, key string) (id string, made bool, err error) {
	type rec struct{ ID, Token string }
	var r rec
	err = store.View(ctx, func(tx cells.Tx) error {
		if b, ok := tx.Meta(sessionBucket).Get(key); ok {
			return json.Unmarshal(b, &r)
		}
		return nil
	})
	if err == nil && r.ID != "" {
		if _, err := svc.Authenticate(r.ID, r.Token); err == nil {
			return r.ID, false, nil
		}
	}
	r.ID, r.Token, err = svc.NewSession(ctx)
	if err != nil {
		return "", false, fmt.Errorf("create the runtime's sandbox session: %w", err)
	}
	b, _ := json.Marshal(r)
	err = store.Update(ctx, func(tx cells.Tx) error { return tx.Meta(sessionBucket).Put(key, b) })
	if err != nil {
		return "", false, fmt.Errorf("record the runtime's sandbox session: %w", err)
	}
	return r.ID, true, nil
}

// execBox says whether the box name of session is an exec run's box of
// the runtime's session: one that lives for one run
// (sandbox.Config.OneShot). A tool API session's box is never one, whatever
// its name.
func (s *Sandboxes) execBox(session, name string) bool {
	rs := s.runtimeSession.Load()
	return rs != nil && *rs == session && builtins.IsExecBox(name)
}

// Opened returns the service and session if they are open (nil and ""
// before, and when the opening failed).
func (s *Sandboxes) Opened() (*sandbox.Service, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.svc, s.session
}

// ExpectBoxes says that n boxes of image ("" the default) will be taken
// soon, one after another (sandbox.Service.ExpectBoxes), now or when the
// service opens: it opens nothing.
func (s *Sandboxes) ExpectBoxes(image string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.expect == nil {
		s.expect = map[string]int{}
	}
	s.expect[image] = n
	if s.svc != nil {
		s.svc.ExpectBoxes(image, n)
	}
}

// BeginBoxes starts making the boxes ExpectBoxes announced now, before
// the first is taken (sandbox.Service.BeginBoxes), opening the service in
// the background if it is not open: for a run that knows every stage will
// run (its data dir is new), whose first box is then made while the
// pattern loads.
func (s *Sandboxes) BeginBoxes(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.svc == nil {
		s.begin = true
		go func() { _, _, _ = s.Get(ctx) }() // an error is every later Get's
		return
	}
	for image := range s.expect {
		s.svc.BeginBoxes(image)
	}
}

// SetBaseURL sets the base URL of previews, now or when the service opens.
func (s *Sandboxes) SetBaseURL(u string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.baseURL = u
	if s.svc != nil {
		s.svc.SetBaseURL(u)
	}
}

// Sleep puts every box of the service to sleep, if it was opened: those
// of the runtime's session and those of the tool API's sessions. The host
// calls it as the process shuts down, once its APIs stopped: nothing is
// left to put a box to sleep after that (the reaper lives in this
// process), and a running box holds a mounted disk.
func (s *Sandboxes) Sleep(ctx context.Context) error {
	if svc, _ := s.Opened(); svc != nil {
		return svc.SleepAll(ctx)
	}
	return nil
}

// Close closes a service this opened (LazySandboxes).
func (s *Sandboxes) Close() error {
	s.mu.Lock()
	begun := s.begin
	s.mu.Unlock()
	if begun { // BeginBoxes' opening may still run: its boxes are ours to remove
		_, _, _ = s.Get(context.Background())
	}
	if svc, _ := s.Opened(); svc != nil && s.owned {
		return svc.Close()
	}
	return nil
}

// Handler is build(svc) for the open service, built on its first request
// (which opens the service); if the service cannot open, every request
// gets 503 saying why.
func (s *Sandboxes) Handler(build func(*sandbox.Service) http.Handler) http.Handler {
	return lazyHandler(func() http.Handler {
		svc, _, err := s.Get(context.Background())
		if err != nil {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, fmt.Sprintf("the sandbox service could not start: %v", err), http.StatusServiceUnavailable)
			})
		}
		return build(svc)
	})
}

// Client is the session's client, opening the service on its first call.
// It is also a sandboxclient.ToolLister.
func (s *Sandboxes) Client() sandboxclient.Client { return lazyClient{s} }

// lazyClient is a sandboxclient.Client (and ToolLister) that opens the
// service on its first call.
type lazyClient struct{ s *Sandboxes }

func (c lazyClient) get(ctx context.Context) (*sandbox.LocalClient, error) {
	svc, session, err := c.s.Get(ctx)
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

var _ sandboxclient.ImageDigester = lazyClient{}

// ImageDigest is sandboxclient.ImageDigester: the exec memo keys results
// by the build of the image they ran in. It is asked while the runtime's
// batch holds the store's write transaction (an exec node's Key), so it
// must not open the service (whose opening writes to that store and would
// wait on the transaction): before the service is open, the backend alone
// answers, opened for it if need be (no store: an engine ping, a stat).
// The default image answers "" without opening anything, so a run with
// nothing to do in the default image opens no backend; every other image's
// key is its digest whether or not the service is open.
func (c lazyClient) ImageDigest(ctx context.Context, image string) (string, error) {
	if image == "" || image == backend.DefaultImage {
		return "", nil
	}
	if svc, _ := c.s.Opened(); svc != nil {
		return svc.ImageDigest(ctx, image)
	}
	if c.s.openBackend == nil {
		return "", nil // a service was given but failed to open
	}
	be, err := c.s.backend(ctx)
	if err != nil {
		return "", err
	}
	d, ok := be.(backend.ImageDigester)
	if !ok {
		return "", nil
	}
	return d.ImageDigest(ctx, image)
}
