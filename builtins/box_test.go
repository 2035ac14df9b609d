package builtins_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/builtins"
	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/patterns"
	"github.com/cellbox/cellbox/runtime"
	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/httpapi"
	"github.com/cellbox/cellbox/sandbox/sandboxtest"
	"github.com/cellbox/cellbox/sandboxclient"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// counting is a sandbox client that records the boxes it creates. A
// command held (hold) waits for its gate and then runs to its end even if
// its run was aborted meanwhile, the way a slow agent might answer after
// the abort; its result is recorded in late.
type counting struct {
	sandboxclient.Client
	mu      sync.Mutex
	created []string
	hold    map[string]chan struct{} // command -> gate
	reached chan string
	late    []api.ExecResult
	// destroyGate, if set, holds every DestroyBox until it is closed.
	destroyGate chan struct{}
}

func (c *counting) DestroyBox(ctx context.Context, name string) error {
	c.mu.Lock()
	gate := c.destroyGate
	c.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return c.Client.DestroyBox(ctx, name)
}

// holdDestroys makes DestroyBox wait until the function it returns is
// called (by the test's cleanup at the latest).
func (c *counting) holdDestroys(t *testing.T) (release func()) {
	gate := make(chan struct{})
	c.mu.Lock()
	c.destroyGate = gate
	c.mu.Unlock()
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	return release
}

func (c *counting) Exec(ctx context.Context, box string, req api.ExecRequest, onOutput func(string, []byte)) (api.ExecResult, error) {
	c.mu.Lock()
	gate, held := c.hold[req.Command]
	c.mu.Unlock()
	if !held {
		return c.Client.Exec(ctx, box, req, onOutput)
	}
	c.reached <- req.Command
	<-gate
	res, err := c.Client.Exec(context.WithoutCancel(ctx), box, req, onOutput)
	c.mu.Lock()
	c.late = append(c.late, res)
	c.mu.Unlock()
	return res, err
}

// holdCommand makes the command wait until the function it returns is
// called (by the test's cleanup at the latest).
func (c *counting) holdCommand(t *testing.T, command string) (release func()) {
	gate := make(chan struct{})
	c.mu.Lock()
	if c.hold == nil {
		c.hold, c.reached = map[string]chan struct{}{}, make(chan string, 16)
	}
	c.hold[command] = gate
	c.mu.Unlock()
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	return release
}

// Tools lists the registry's tools (sandboxclient.ToolLister), for llm
// nodes.
func (c *counting) Tools(ctx context.Context) ([]api.ToolInfo, error) {
	return c.Client.(sandboxclient.ToolLister).Tools(ctx)
}

// ImageDigest passes the client's image digests on
// (sandboxclient.ImageDigester), for the exec node's memo key.
func (c *counting) ImageDigest(ctx context.Context, image string) (string, error) {
	if d, ok := c.Client.(sandboxclient.ImageDigester); ok {
		return d.ImageDigest(ctx, image)
	}
	return "", nil
}

func (c *counting) CreateBox(ctx context.Context, in api.SandboxCreateInput) (api.SandboxCreateOutput, error) {
	out, err := c.Client.CreateBox(ctx, in)
	if err == nil && out.Created {
		c.mu.Lock()
		c.created = append(c.created, in.Sandbox)
		c.mu.Unlock()
	}
	return out, err
}

func (c *counting) boxesCreated() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.created)
}

// box is the sandbox service on the real local (bubblewrap) backend, one
// session of it, and a counting client of that session.
type box struct {
	svc     *sandbox.Service
	session string
	client  *counting
	llm     builtins.LLMEnv // for llm nodes
	// teardowns, if set, is the patterns' builtins.Env.Teardowns.
	teardowns *builtins.Teardowns
}

func newBox(t *testing.T) *box { return startBox(t, false) }

// newBoxHTTP is newBox with the HTTP client, through the service's HTTP API.
func newBoxHTTP(t *testing.T) *box { return startBox(t, true) }

func startBox(t *testing.T, overHTTP bool) *box {
	t.Helper()
	svc, _ := sandboxtest.Service(t, sandboxtest.Options{Pool: 2, Logger: quiet()})
	if overHTTP {
		hs := httptest.NewServer(httpapi.Handler(svc))
		t.Cleanup(hs.Close)
		c, err := sandboxclient.NewSession(context.Background(), hs.URL)
		require.NoError(t, err)
		id, _ := c.Session()
		return &box{svc: svc, session: id, client: &counting{Client: c}}
	}
	id, _, err := svc.NewSession(context.Background())
	require.NoError(t, err)
	return &box{svc: svc, session: id, client: &counting{Client: svc.Client(id)}}
}

// list returns the names of the session's boxes.
func (b *box) list(t *testing.T) []string {
	t.Helper()
	raw, err := b.client.Tool(context.Background(), "sandbox_list", nil)
	require.NoError(t, err)
	var out api.SandboxListOutput
	require.NoError(t, json.Unmarshal(raw, &out))
	var names []string
	for _, s := range out.Sandboxes {
		names = append(names, s.Name)
	}
	sort.Strings(names)
	return names
}

// read returns a file of a box ("" and false when missing).
func (b *box) read(name, path string) (string, bool) {
	var sb strings.Builder
	if _, err := b.client.Download(context.Background(), name, path, &sb); err != nil {
		return "", false
	}
	return sb.String(), true
}

// run is a pattern running on a runtime over a bbolt store in a temp dir.
type run struct {
	t     *testing.T
	box   *box
	store cells.Store
	rt    *runtime.Runtime
	pat   runtime.Pattern
}

// load parses a YAML pattern (files: the pattern folder), compiles it onto
// the box's client and loads it.
func (b *box) load(t *testing.T, yaml string, files map[string]string) *run {
	t.Helper()
	store, err := cells.OpenBolt(filepath.Join(t.TempDir(), "cells.db"), cells.Options{NoSync: true})
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	return b.loadOn(t, store, yaml, files)
}

func (b *box) loadOn(t *testing.T, store cells.Store, yaml string, files map[string]string) *run {
	t.Helper()
	fsys := fstest.MapFS{}
	for name, content := range files {
		fsys[name] = &fstest.MapFile{Data: []byte(content)}
	}
	p, err := patterns.Parse("pattern.yaml", []byte(yaml), fsys)
	require.NoError(t, err)
	rp, err := patterns.Compile(p, builtins.Env{Client: b.client, Logger: quiet(), LLM: b.llm, Teardowns: b.teardowns})
	require.NoError(t, err)
	rt := runtime.New(store, runtime.Options{Logger: quiet()})
	r := &run{t: t, box: b, store: store, rt: rt, pat: rp}
	t.Cleanup(func() { r.close(runtime.Shutdown) })
	require.NoError(t, rt.Load(context.Background(), rp))
	return r
}

// close stops the pattern (Stopped) or shuts the runtime down.
func (r *run) close(reason runtime.CloseReason) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if reason == runtime.Stopped {
		_ = r.rt.Stop(ctx, r.pat.Space, r.pat.Name)
	}
	_ = r.rt.Close(ctx)
}

func (r *run) addr(name string) cells.Address {
	return cells.Address{Space: r.pat.Space, Pattern: r.pat.Name, Name: name}
}

func (r *run) settle() {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	require.NoError(r.t, r.rt.Wait(ctx))
}

func (r *run) set(name, value string) {
	r.t.Helper()
	require.NoError(r.t, r.rt.Set(context.Background(), r.addr(name), json.RawMessage(value)))
}

func (r *run) send(stream, payload string) {
	r.t.Helper()
	_, err := r.rt.Send(context.Background(), r.addr(stream), json.RawMessage(payload))
	require.NoError(r.t, err)
}

// get decodes a cell's value into v and returns the cell.
func (r *run) get(name string, v any) cells.Cell {
	r.t.Helper()
	c, err := r.store.Get(context.Background(), r.addr(name))
	require.NoError(r.t, err)
	if v != nil {
		require.NoError(r.t, json.Unmarshal(c.Value, v), "cell %s: %s", name, c.Value)
	}
	return c
}

// execOut is an exec node's output cell.
type execOut struct {
	Pending bool                 `json:"pending"`
	Result  *builtins.ExecResult `json:"result"`
	Error   *string              `json:"error"`
}

func (r *run) exec(name string) execOut {
	r.t.Helper()
	var o execOut
	r.get(name, &o)
	return o
}

// safetyNet bounds every wait of these tests for something to happen: a
// test waits for the event, however slow the machine; the bound only ends
// a test whose event never comes.
const safetyNet = 2 * time.Minute

// waitFor polls cond until it holds (or the safety net is spent).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(safetyNet)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", safetyNet, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestBoxToolsDefaultSet: a model bound to a box gets, without an allow
// list, no tool that makes, removes or re-makes boxes or changes a
// network (network_set, sandbox_create, sandbox_destroy, fork, branch),
// and no default tool takes a network, box id, image or limits (a tool
// added to the registry later with such a field must be withheld too);
// the allow list offers them; branch (whose box takes the network of the
// snapshot's box) needs network_set beside it.
func TestBoxToolsDefaultSet(t *testing.T) {
	svc, _ := sandboxtest.Service(t, sandboxtest.Options{Logger: quiet()})
	id, _, err := svc.NewSession(context.Background())
	require.NoError(t, err)
	bind := func(allow ...string) (*builtins.BoxToolSet, error) {
		return builtins.BoxTools(context.Background(), svc.Client(id), allow)
	}
	names := func(ts *builtins.BoxToolSet) []string {
		var out []string
		for _, tl := range ts.Tools {
			out = append(out, tl.Name)
		}
		return out
	}
	def, err := bind()
	require.NoError(t, err)
	all := names(def)
	require.Contains(t, all, "shell")
	require.Contains(t, all, "snapshot")
	for _, w := range []string{"network_set", "sandbox_create", "sandbox_destroy", "fork", "branch", "sandbox_list", "transfer"} {
		assert.NotContains(t, all, w)
	}
	for _, tl := range def.Tools {
		var schema struct{ Properties map[string]any }
		require.NoError(t, json.Unmarshal(tl.InputSchema, &schema))
		for _, field := range []string{"network", "box_id", "image", "limits", "names", "name"} {
			assert.NotContains(t, schema.Properties, field, "tool %s is in the default set but takes %s", tl.Name, field)
		}
	}

	only, err := bind("network_set")
	require.NoError(t, err)
	require.Equal(t, []string{"network_set"}, names(only))
	create, err := bind("sandbox_create", "sandbox_destroy", "fork")
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"sandbox_create", "sandbox_destroy", "fork"}, names(create))
	_, err = bind("shell", "branch")
	require.ErrorContains(t, err, "allow names branch but not network_set")
	_, err = bind("branch", "network_set")
	require.NoError(t, err)
}
