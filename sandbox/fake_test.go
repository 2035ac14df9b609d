package sandbox

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/backend"
)

// fakeBackend runs each box's agent as a goroutine of the test process
// (agent.Serve with a temporary workspace). It is for the pool's logic only:
// paths in its boxes are host paths, so tests use relative ones.
type fakeBackend struct {
	root string

	mu      sync.Mutex
	boxes   map[string]*fakeBox
	creates int
	starts  int
	stops   int
	delay   time.Duration   // added to Create
	old     map[string]bool // boxes whose running agent speaks protocol 99 (an older cellbox's; a restart runs the current one)
	stale   map[string]bool // boxes whose agent speaks protocol 99 even once restarted
	active  int             // creates in flight
	peak    int
}

type fakeBox struct {
	info   backend.Info
	ws     string
	cancel context.CancelFunc
	done   chan struct{}
}

func newFakeBackend(t *testing.T) *fakeBackend {
	f := &fakeBackend{root: t.TempDir(), boxes: map[string]*fakeBox{}, old: map[string]bool{}, stale: map[string]bool{}}
	t.Cleanup(func() {
		f.mu.Lock()
		ids := make([]string, 0, len(f.boxes))
		for id := range f.boxes {
			ids = append(ids, id)
		}
		f.mu.Unlock()
		for _, id := range ids {
			f.Stop(context.Background(), id)
		}
	})
	return f
}

func (f *fakeBackend) Name() string { return "fake" }

func (f *fakeBackend) Create(ctx context.Context, spec backend.Spec) (backend.Info, error) {
	f.mu.Lock()
	if _, ok := f.boxes[spec.ID]; ok {
		f.mu.Unlock()
		return backend.Info{}, fmt.Errorf("box %s exists", spec.ID)
	}
	f.creates++
	f.active++
	f.peak = max(f.peak, f.active)
	delay := f.delay
	f.mu.Unlock()
	time.Sleep(delay)
	ws := filepath.Join(f.root, spec.ID, "workspace")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		return backend.Info{}, err
	}
	info := backend.Info{ID: spec.ID, Labels: maps.Clone(spec.Labels), Image: spec.Image, State: backend.StateCreated, Created: time.Now(), HostDir: spec.HostDir}
	f.mu.Lock()
	f.active--
	f.boxes[spec.ID] = &fakeBox{info: info, ws: ws}
	f.mu.Unlock()
	return info, nil
}

func (f *fakeBackend) Start(ctx context.Context, id string) (backend.Info, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.boxes[id]
	if !ok {
		return backend.Info{}, fmt.Errorf("start %s: %w", id, backend.ErrNotFound)
	}
	if b.info.State == backend.StateRunning {
		return b.info, nil
	}
	f.starts++
	ctx, cancel := context.WithCancel(context.Background())
	b.cancel, b.done = cancel, make(chan struct{})
	done := b.done
	opts := agent.Options{Socket: filepath.Join(b.info.HostDir, backend.SocketName), Workspace: b.ws,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	serve := func() { agent.Serve(ctx, opts) }
	if f.old[id] || f.stale[id] {
		serve = func() { serveOldAgent(ctx, opts.Socket) }
	}
	go func() {
		defer close(done)
		serve()
	}()
	b.info.State = backend.StateRunning
	return b.info, nil
}

func (f *fakeBackend) Stop(ctx context.Context, id string) error {
	f.mu.Lock()
	b, ok := f.boxes[id]
	if !ok {
		f.mu.Unlock()
		return fmt.Errorf("stop %s: %w", id, backend.ErrNotFound)
	}
	if b.info.State != backend.StateRunning {
		f.mu.Unlock()
		return nil
	}
	f.stops++
	b.info.State = backend.StateStopped
	delete(f.old, id) // the next start runs the current agent
	cancel, done := b.cancel, b.done
	f.mu.Unlock()
	cancel()
	<-done
	return nil
}

func (f *fakeBackend) Remove(ctx context.Context, id string) error {
	if err := f.Stop(ctx, id); err != nil {
		return nil // missing: not an error
	}
	f.mu.Lock()
	b := f.boxes[id]
	delete(f.boxes, id)
	delete(f.old, id)
	delete(f.stale, id)
	f.mu.Unlock()
	return os.RemoveAll(filepath.Dir(b.ws))
}

func (f *fakeBackend) Inspect(ctx context.Context, id string) (backend.Info, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.boxes[id]
	if !ok {
		return backend.Info{}, fmt.Errorf("inspect %s: %w", id, backend.ErrNotFound)
	}
	return b.info, nil
}

func (f *fakeBackend) List(ctx context.Context, labels map[string]string) ([]backend.Info, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []backend.Info
next:
	for _, b := range f.boxes {
		for k, v := range labels {
			if b.info.Labels[k] != v {
				continue next
			}
		}
		out = append(out, b.info)
	}
	return out, nil
}

// Capabilities: no clone, every limit (none is enforced: the fake's boxes
// are goroutines), as many CPUs as this host.
func (f *fakeBackend) Capabilities() backend.Capabilities {
	return backend.Capabilities{Network: backend.NetworkNamespace, MaxCPUs: runtime.NumCPU(),
		Limits: backend.Enforcement{Memory: true, CPU: true, Pids: true, Disk: true}}
}

// Dial connects to the agent's socket in the box's host dir.
func (f *fakeBackend) Dial(ctx context.Context, id string) (net.Conn, error) {
	f.mu.Lock()
	b, ok := f.boxes[id]
	f.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("dial %s: %w", id, backend.ErrNotFound)
	}
	conn, err := agent.DialSocket(ctx, filepath.Join(b.info.HostDir, backend.SocketName))
	if err != nil {
		err = fmt.Errorf("dial %s: %w: %w", id, backend.ErrNotReady, err)
	}
	return conn, err
}

// count returns the number of boxes the fake holds.
func (f *fakeBackend) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.boxes)
}

func (f *fakeBackend) state(id string) backend.State {
	f.mu.Lock()
	defer f.mu.Unlock()
	if b, ok := f.boxes[id]; ok {
		return b.info.State
	}
	return ""
}

// newTestService starts a Service on be over dataDir (a fresh one if "").
func newTestService(t *testing.T, be backend.Backend, dataDir string, mod func(*Config)) *Service {
	t.Helper()
	if dataDir == "" {
		dataDir = t.TempDir()
	}
	cfg := Config{
		Backend:     be,
		DataDir:     dataDir,
		AgentBinary: "/nonexistent/cellbox", // the fake runs the agent in-process
		Pool:        map[string]int{},
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		s.Close()
		testenv.UnmountUnder(t, dataDir)
	})
	return s
}

// serveOldAgent answers every request as an agent of protocol 99.
func serveOldAgent(ctx context.Context, socket string) {
	os.Remove(socket)
	ln, err := net.Listen("unix", socket)
	if err != nil {
		return
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(agent.ProtocolHeader, "99")
		w.Write([]byte(`{"protocol":99}`))
	})}
	go srv.Serve(ln)
	<-ctx.Done()
	srv.Close()
}
