package examples_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/builtins"
	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/patterns"
	"github.com/cellbox/cellbox/runtime"
	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/sandboxtest"
)

// The run-level tests run each example the way `cellbox run` does, in
// process: the runtime on a bbolt store, the sandbox service on the real
// local (bubblewrap) backend, boxes running the real cellbox agent.

// counting is the real backend, counting the boxes it creates by box name
// (the label cellbox.box), so a test can tell which nodes started a box.
type counting struct {
	backend.Backend
	mu      sync.Mutex
	created []string
}

func (c *counting) Create(ctx context.Context, spec backend.Spec) (backend.Info, error) {
	info, err := c.Backend.Create(ctx, spec)
	if err == nil {
		c.mu.Lock()
		c.created = append(c.created, spec.Labels[backend.LabelBox])
		c.mu.Unlock()
	}
	return info, err
}

// boxes returns how many boxes were created whose name starts with prefix.
func (c *counting) boxes(prefix string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, b := range c.created {
		if strings.HasPrefix(b, prefix) {
			n++
		}
	}
	return n
}

// quiet logs errors only: the tests make nodes fail on purpose.
var quiet = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))

// world is one data directory: a sandbox service and a bbolt cell store, as
// `cellbox run --data DIR` has them. A test may close and reopen the
// runtime over the same world to restart.
type world struct {
	t     *testing.T
	dir   string
	be    *counting
	svc   *sandbox.Service
	store cells.Store
	env   builtins.Env
}

// newWorld opens a world in a fresh short temporary directory (agent socket
// paths must stay short). imagesDir may be "" (only the default image).
func newWorld(t *testing.T, imagesDir string) *world {
	t.Helper()
	return newWorldOn(t, imagesDir, nil)
}

// newWorldOn is newWorld with boxes on be (nil: a local backend).
func newWorldOn(t *testing.T, imagesDir string, be backend.Backend) *world {
	t.Helper()
	w := &world{t: t}
	w.svc, w.dir = sandboxtest.Service(t, sandboxtest.Options{ImagesDir: imagesDir, Logger: quiet, Backend: be, Wrap: func(be backend.Backend) backend.Backend {
		w.be = &counting{Backend: be}
		return w.be
	}})
	ctx := context.Background()
	sid, _, err := w.svc.NewSession(ctx)
	require.NoError(t, err)
	w.env = builtins.Env{Client: w.svc.Client(sid), Logger: quiet}
	w.store, err = cells.OpenBolt(filepath.Join(w.dir, "cells.db"), cells.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { w.store.Close() })
	return w
}

// instance is an example loaded on a runtime of a world.
type instance struct {
	w   *world
	rt  *runtime.Runtime
	pat runtime.Pattern

	// Statuses are emitted synchronously (Set returns after its batch's,
	// Wait after every run's), so draining the channel after either sees
	// them all.
	ch       <-chan runtime.Status
	statuses []runtime.Status
	stop     context.CancelFunc
	closed   bool
}

// drain moves the statuses emitted so far into in.statuses.
func (in *instance) drain() {
	for {
		select {
		case s, ok := <-in.ch:
			if !ok {
				return
			}
			in.statuses = append(in.statuses, s)
		default:
			return
		}
	}
}

// load compiles the pattern and loads it on a new runtime over the world's
// store, recording node statuses.
func (w *world) load(p *patterns.Pattern) *instance {
	t := w.t
	t.Helper()
	rp, err := patterns.Compile(p, w.env)
	require.NoError(t, err, "compile %s", p.Name)
	in := &instance{w: w, rt: runtime.New(w.store, runtime.Options{Logger: quiet}), pat: rp}
	ctx, cancel := context.WithCancel(context.Background())
	in.stop = cancel
	in.ch = in.rt.Subscribe(ctx, 1<<16)
	require.NoError(t, in.rt.Load(context.Background(), rp), "load %s", p.Name)
	t.Cleanup(func() { in.close(runtime.Stopped) })
	return in
}

// close stops the pattern (Stopped: its boxes are removed) or only shuts the
// runtime down (Shutdown: state kept for a restart).
func (in *instance) close(reason runtime.CloseReason) {
	if in.closed {
		return
	}
	in.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if reason == runtime.Stopped {
		if err := in.rt.Stop(ctx, in.pat.Space, in.pat.Name); err != nil {
			in.w.t.Logf("stop %s: %v", in.pat.Name, err)
		}
	}
	if err := in.rt.Close(ctx); err != nil {
		in.w.t.Logf("close runtime: %v", err)
	}
	in.stop()
}

func (in *instance) addr(name string) cells.Address {
	return cells.Address{Space: in.pat.Space, Pattern: in.pat.Name, Name: name}
}

// wait waits until the runtime settles.
func (in *instance) wait() {
	in.w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(in.w.t, in.rt.Wait(ctx))
}

// set writes an input cell (JSON of v) through the runtime.
func (in *instance) set(name string, v any) {
	in.w.t.Helper()
	raw, err := json.Marshal(v)
	require.NoError(in.w.t, err)
	require.NoError(in.w.t, in.rt.Set(context.Background(), in.addr(name), raw), "set %s", name)
}

// send sends an event to a node's stream.
func (in *instance) send(node, stream string, v any) {
	in.w.t.Helper()
	raw, err := json.Marshal(v)
	require.NoError(in.w.t, err)
	_, err = in.rt.Send(context.Background(), in.addr(node+"."+stream), raw)
	require.NoError(in.w.t, err, "send %s.%s", node, stream)
}

// get decodes a cell's current value into out.
func (in *instance) get(name string, out any) {
	in.w.t.Helper()
	c, err := in.w.store.Get(context.Background(), in.addr(name))
	require.NoError(in.w.t, err, "get %s", name)
	require.NoError(in.w.t, json.Unmarshal(c.Value, out), "decode %s: %s", name, c.Value)
}

// str returns a cell holding a string.
func (in *instance) str(name string) string {
	in.w.t.Helper()
	var s string
	in.get(name, &s)
	return s
}

// execOut is an exec node's output cell.
type execOut struct {
	Pending bool `json:"pending"`
	Result  *struct {
		Stdout   string         `json:"stdout"`
		Stderr   string         `json:"stderr"`
		ExitCode int            `json:"exit_code"`
		Files    map[string]any `json:"files"`
	} `json:"result"`
	Error *string `json:"error"`
}

func (in *instance) exec(name string) execOut {
	in.w.t.Helper()
	var o execOut
	in.get(name, &o)
	return o
}

// count returns how many statuses of kind the node had since it loaded.
func (in *instance) count(node string, kind runtime.StatusKind) int {
	in.drain()
	n := 0
	for _, s := range in.statuses {
		if s.Node.Name == node && s.Kind == kind {
			n++
		}
	}
	return n
}

// mark returns the number of statuses so far; since counts after it.
func (in *instance) mark() int {
	in.drain()
	return len(in.statuses)
}

// since returns, per node, the status kinds seen after mark m, in order.
func (in *instance) since(m int) map[string][]runtime.StatusKind {
	in.drain()
	out := map[string][]runtime.StatusKind{}
	for _, s := range in.statuses[m:] {
		out[s.Node.Name] = append(out[s.Node.Name], s.Kind)
	}
	return out
}

// waitStatus blocks until the node has had n statuses of kind.
func (in *instance) waitStatus(node string, kind runtime.StatusKind, n int) {
	in.w.t.Helper()
	timeout := time.After(time.Minute)
	for in.count(node, kind) < n {
		select {
		case s, ok := <-in.ch:
			require.True(in.w.t, ok, "the runtime stopped before %s was %s %d times", node, kind, n)
			in.statuses = append(in.statuses, s)
		case <-timeout:
			in.w.t.Fatalf("%s was not %s %d times within a minute", node, kind, n)
		}
	}
}

// step runs f as a subtest whose helpers (the world's) report to it.
func step(t *testing.T, w *world, name string, f func(t *testing.T)) {
	t.Helper()
	t.Run(name, func(st *testing.T) {
		w.t = st
		defer func() { w.t = t }()
		f(st)
	})
}

// eventually polls cond until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// load reads an example folder.
func load(t *testing.T, name string) *patterns.Pattern {
	t.Helper()
	p, err := patterns.Load(name)
	require.NoError(t, err, "load example %s", name)
	return p
}
