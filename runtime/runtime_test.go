package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/builtins"
	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/runtime"
)

const space, pat = "test", "p"

func at(name string) cells.Address { return cells.Address{Space: space, Pattern: pat, Name: name} }

// stores runs fn against an in-memory and a bbolt store.
func stores(t *testing.T, fn func(t *testing.T, s cells.Store)) {
	t.Run("memory", func(t *testing.T) {
		s := cells.NewMemory(cells.Options{})
		t.Cleanup(func() { s.Close() })
		fn(t, s)
	})
	t.Run("bolt", func(t *testing.T) {
		s, err := cells.OpenBolt(filepath.Join(t.TempDir(), "cells.db"), cells.Options{NoSync: true})
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		fn(t, s)
	})
}

func start(t *testing.T, s cells.Store, p runtime.Pattern, opts runtime.Options) *runtime.Runtime {
	t.Helper()
	rt := runtime.New(s, opts)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rt.Close(ctx)
	})
	if p.Space == "" {
		p.Space, p.Name = space, pat
	}
	require.NoError(t, rt.Load(context.Background(), p))
	settle(t, rt)
	return rt
}

func settle(t *testing.T, rt *runtime.Runtime) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, rt.Wait(ctx))
}

func computed(t *testing.T, name, src string) runtime.Node {
	t.Helper()
	c, err := builtins.NewComputed(src)
	require.NoError(t, err)
	return runtime.Node{Name: name, Inputs: c.Inputs(), Kind: c, Builtin: "computed"}
}

func set(t *testing.T, rt *runtime.Runtime, name string, v string) {
	t.Helper()
	require.NoError(t, rt.Set(context.Background(), at(name), json.RawMessage(v)))
}

func get(t *testing.T, s cells.Store, name string) cells.Cell {
	t.Helper()
	c, err := s.Get(context.Background(), at(name))
	require.NoError(t, err)
	return c
}

// counted wraps a compute kind and records every run's inputs.
type counted struct {
	mu   sync.Mutex
	ins  []runtime.Inputs
	kind runtime.Compute
}

func (c *counted) Compute(in runtime.Inputs) (any, error) {
	c.mu.Lock()
	c.ins = append(c.ins, in)
	c.mu.Unlock()
	return c.kind.Compute(in)
}

func (c *counted) runs() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ins)
}

func TestDiamondGlitchFree(t *testing.T) {
	stores(t, func(t *testing.T, s cells.Store) {
		d := computed(t, "d", "{a: a, b: b, c: c}")
		probe := &counted{kind: d.Kind.(runtime.Compute)}
		d.Kind = probe
		p := runtime.Pattern{
			Cells: []runtime.Cell{{Name: "a", Initial: json.RawMessage(`1`)}},
			Nodes: []runtime.Node{computed(t, "b", "a + 1"), computed(t, "c", "a * 2"), d},
		}
		rt := start(t, s, p, runtime.Options{})
		require.Equal(t, 1, probe.runs())

		w, err := s.Watch(context.Background(), "", s.Version())
		require.NoError(t, err)
		for i := 2; i <= 6; i++ {
			set(t, rt, "a", fmt.Sprint(i))
			batch := <-w
			assert.Len(t, batch.Changes, 4, "one notification with a, b, c and d")
		}
		require.Equal(t, 6, probe.runs(), "d runs once per change")
		for _, in := range probe.ins {
			a := in["a"].(int)
			assert.Equal(t, a+1, in["b"], "b from the same a")
			assert.Equal(t, a*2, in["c"], "c from the same a")
		}
		assert.JSONEq(t, `{"a":6,"b":7,"c":12}`, string(get(t, s, "d").Value))
	})
}

func TestEarlyCutoff(t *testing.T) {
	stores(t, func(t *testing.T, s cells.Store) {
		last := computed(t, "last", "parity == 0 ? 'even' : 'odd'")
		probe := &counted{kind: last.Kind.(runtime.Compute)}
		last.Kind = probe
		p := runtime.Pattern{
			Cells: []runtime.Cell{{Name: "n", Initial: json.RawMessage(`1`)}},
			Nodes: []runtime.Node{computed(t, "parity", "n % 2"), last},
		}
		rt := start(t, s, p, runtime.Options{})
		before := get(t, s, "parity").Version
		set(t, rt, "n", `3`)
		set(t, rt, "n", `5`)
		assert.Equal(t, 1, probe.runs(), "an unchanged parity stops propagation")
		assert.Equal(t, before, get(t, s, "parity").Version, "an unchanged output keeps its version")
		set(t, rt, "n", `4`)
		assert.Equal(t, 2, probe.runs())
		assert.Equal(t, `"even"`, string(get(t, s, "last").Value))
	})
}

func TestLoadErrors(t *testing.T) {
	s := cells.NewMemory(cells.Options{})
	defer s.Close()
	node := func(name string, inputs ...string) runtime.Node {
		return runtime.Node{Name: name, Inputs: inputs, Kind: &counted{}}
	}
	for _, tc := range []struct {
		name string
		p    runtime.Pattern
		err  string
	}{
		{"two-node cycle", runtime.Pattern{Nodes: []runtime.Node{node("a", "b"), node("b", "a")}}, "cycle: a -> b -> a"},
		{"three-node cycle", runtime.Pattern{Cells: []runtime.Cell{{Name: "x"}}, Nodes: []runtime.Node{node("a", "x", "c"), node("b", "a"), node("c", "b")}}, "cycle: a -> b -> c -> a"},
		{"self", runtime.Pattern{Nodes: []runtime.Node{node("a", "a")}}, "cycle: a -> a"},
		{"unknown input", runtime.Pattern{Cells: []runtime.Cell{{Name: "raw"}}, Nodes: []runtime.Node{node("clean", "raww")}}, `node clean: unknown input "raww" (cells: raw; nodes: clean)`},
		{"stream input", runtime.Pattern{Cells: []runtime.Cell{{Name: "ev", Stream: true}}, Nodes: []runtime.Node{node("a", "ev")}}, `input "ev" is a stream`},
		{"duplicate", runtime.Pattern{Cells: []runtime.Cell{{Name: "a"}}, Nodes: []runtime.Node{node("a")}}, `node "a": the name is already used by a cell`},
		{"bad kind", runtime.Pattern{Nodes: []runtime.Node{{Name: "a", Kind: 42}}}, "kind int implements none of Compute, Async, Service"},
		{"bad initial", runtime.Pattern{Cells: []runtime.Cell{{Name: "a", Initial: json.RawMessage(`{`)}}}, "cell a: initial value"},
		{"schema", runtime.Pattern{Cells: []runtime.Cell{{Name: "a", Initial: json.RawMessage(`-1`), Schema: json.RawMessage(`{"minimum":0}`)}}}, "cell a: initial value: set test/bad/a: value does not match the schema"},
	} {
		rt := runtime.New(s, runtime.Options{})
		tc.p.Space, tc.p.Name = space, "bad"
		err := rt.Load(context.Background(), tc.p)
		assert.ErrorContains(t, err, tc.err, tc.name)
		assert.Empty(t, rt.Nodes(), "%s: a failed load leaves nothing behind", tc.name)
	}
}

// A load that fails after queuing some of its nodes leaves none of them
// queued: the next batch (here, another pattern's load) must not run them.
func TestFailedLoadQueuesNothing(t *testing.T) {
	stores(t, func(t *testing.T, s cells.Store) {
		rt := runtime.New(s, runtime.Options{})
		t.Cleanup(func() { rt.Close(context.Background()) })
		broken := computed(t, "s", "x + 2")
		broken.Schema = json.RawMessage(`{`) // node s's output cell cannot be declared
		bad := runtime.Pattern{Space: space, Name: pat,
			Cells: []runtime.Cell{{Name: "x", Initial: json.RawMessage(`1`)}},
			Nodes: []runtime.Node{computed(t, "a", "x + 1"), broken}}
		require.ErrorContains(t, rt.Load(context.Background(), bad), "node s: output cell")

		other := runtime.Pattern{Space: space, Name: "other",
			Cells: []runtime.Cell{{Name: "y", Initial: json.RawMessage(`1`)}},
			Nodes: []runtime.Node{computed(t, "z", "y * 10")}}
		require.NoError(t, rt.Load(context.Background(), other))
		z, err := s.Get(context.Background(), cells.Address{Space: space, Pattern: "other", Name: "z"})
		require.NoError(t, err)
		assert.JSONEq(t, `10`, string(z.Value))
		_, err = s.Get(context.Background(), at("a"))
		require.ErrorIs(t, err, cells.ErrNotFound, "node a of the failed load did not run")
	})
}

func TestErrorsPropagate(t *testing.T) {
	stores(t, func(t *testing.T, s cells.Store) {
		p := runtime.Pattern{
			Cells: []runtime.Cell{{Name: "cfg", Initial: json.RawMessage(`{"n":2}`)}},
			Nodes: []runtime.Node{computed(t, "n", "cfg.n * 10"), computed(t, "m", "n + 1"), computed(t, "o", "m + 1")},
		}
		rt := start(t, s, p, runtime.Options{})
		assert.Equal(t, "22", string(get(t, s, "o").Value))
		set(t, rt, "cfg", `null`)
		n := get(t, s, "n")
		assert.Contains(t, n.Error, "cannot fetch n from <nil>")
		assert.Equal(t, "20", string(n.Value), "the last good value stays")
		assert.Equal(t, "upstream n failed: "+n.Error, get(t, s, "m").Error)
		assert.Equal(t, "upstream n failed: "+n.Error, get(t, s, "o").Error, "the origin is kept down the chain")
		info := rt.Nodes()
		assert.Equal(t, runtime.Error, info[1].State)
		set(t, rt, "cfg", `{"n":3}`)
		assert.Empty(t, get(t, s, "o").Error)
		assert.Equal(t, "32", string(get(t, s, "o").Value))
	})
}

func TestSetRules(t *testing.T) {
	s := cells.NewMemory(cells.Options{})
	defer s.Close()
	p := runtime.Pattern{
		Cells: []runtime.Cell{{Name: "cfg", Initial: json.RawMessage(`{"n":1}`), Schema: json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"}}}`)}},
		Nodes: []runtime.Node{computed(t, "n", "cfg.n")},
	}
	rt := start(t, s, p, runtime.Options{})
	err := rt.Set(context.Background(), at("cfg"), json.RawMessage(`{"n":"two"}`))
	var se *cells.SchemaError
	require.ErrorAs(t, err, &se)
	assert.ErrorContains(t, err, "/n")
	assert.Equal(t, `{"n":1}`, string(get(t, s, "cfg").Value))
	assert.ErrorContains(t, rt.Set(context.Background(), at("n"), json.RawMessage(`1`)), "it is the output of node n (computed)")
	// Loading the same instance twice is refused.
	assert.ErrorContains(t, rt.Load(context.Background(), runtime.Pattern{Space: space, Name: pat}), "already loaded")
}

// statuses collects status events.
type statuses struct {
	mu  sync.Mutex
	all []runtime.Status
}

func watchStatus(t *testing.T, rt *runtime.Runtime) *statuses {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st := &statuses{}
	ch := rt.Subscribe(ctx, 1024)
	go func() {
		for s := range ch {
			st.mu.Lock()
			st.all = append(st.all, s)
			st.mu.Unlock()
		}
	}()
	return st
}

func (s *statuses) count(node string, kind runtime.StatusKind) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, x := range s.all {
		if x.Node.Name == node && x.Kind == kind {
			n++
		}
	}
	return n
}

// work is an async test kind: its key is its input x; a run records x,
// then finishes with x*10 when released, or with the context's error.
type work struct {
	memo    bool
	block   bool
	started chan float64
	release chan struct{}
	runs    atomic.Int32
	// stubborn: a run for one of these x ignores its context: it waits for
	// the channel to close and returns its result even when aborted
	// (counted in stale), so a test can check the runtime drops it.
	stubborn map[float64]chan struct{}
	stale    atomic.Int32
}

func newWork(memo, block bool) *work {
	return &work{memo: memo, block: block, started: make(chan float64, 16), release: make(chan struct{}, 16)}
}

func (w *work) Key(in runtime.Inputs) (string, bool, error) {
	return fmt.Sprint(in["x"]), w.memo, nil
}

func (w *work) Run(ctx context.Context, in runtime.Inputs) (any, error) {
	w.runs.Add(1)
	x := toFloat(in["x"])
	w.started <- x
	if hold, ok := w.stubborn[x]; ok {
		<-hold
		if ctx.Err() != nil {
			w.stale.Add(1)
		}
		return map[string]any{"out": x * 10}, nil
	}
	if w.block {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-w.release:
		}
	}
	return map[string]any{"out": x * 10}, nil
}

func toFloat(v any) float64 {
	switch x := v.(type) {
	case int:
		return float64(x)
	case float64:
		return x
	}
	return 0
}

func waitStarted(t *testing.T, w *work) float64 {
	t.Helper()
	select {
	case x := <-w.started:
		return x
	case <-time.After(5 * time.Second):
		t.Fatal("run did not start")
		return 0
	}
}

func mustComputed(src string) *builtins.Computed {
	c, err := builtins.NewComputed(src)
	if err != nil {
		panic(err)
	}
	return c
}

func asyncPattern(w *work) runtime.Pattern {
	return runtime.Pattern{
		Cells: []runtime.Cell{{Name: "x", Initial: json.RawMessage(`1`)}},
		Nodes: []runtime.Node{
			{Name: "job", Inputs: []string{"x"}, Kind: w, Builtin: "work"},
			{Name: "after", Inputs: []string{"job"}, Kind: mustComputed("job.pending ? 'waiting' : job.result.out")},
		},
	}
}

func TestAsyncAbort(t *testing.T) {
	stores(t, func(t *testing.T, s cells.Store) {
		w := newWork(false, true)
		rt := runtime.New(s, runtime.Options{})
		defer rt.Close(context.Background())
		st := watchStatus(t, rt)
		require.NoError(t, rt.Load(context.Background(), runtime.Pattern{Space: space, Name: pat, Cells: asyncPattern(w).Cells, Nodes: asyncPattern(w).Nodes}))
		assert.Equal(t, 1.0, waitStarted(t, w))
		// pending is written in the batch that decided the run, before it
		// starts; downstream sees it in the same batch.
		assert.JSONEq(t, `{"pending":true,"result":null,"error":null}`, string(get(t, s, "job").Value))
		assert.Equal(t, `"waiting"`, string(get(t, s, "after").Value))
		w.release <- struct{}{}
		settle(t, rt)
		assert.JSONEq(t, `{"pending":false,"result":{"out":10},"error":null}`, string(get(t, s, "job").Value))

		// Two quick changes: the first run is cancelled, but it does not
		// give up: it holds on past the newer run's end, then returns a
		// result, as a kind that ignores its context would. That stale
		// result must never be written.
		w.stubborn = map[float64]chan struct{}{2: make(chan struct{})}
		set(t, rt, "x", `2`)
		assert.Equal(t, 2.0, waitStarted(t, w))
		assert.JSONEq(t, `{"pending":true,"result":{"out":10},"error":null}`, string(get(t, s, "job").Value), "the last result stays while pending")
		set(t, rt, "x", `3`)
		assert.Equal(t, 3.0, waitStarted(t, w))
		w.release <- struct{}{}
		require.Eventually(t, func() bool {
			return string(get(t, s, "job").Value) == `{"pending":false,"result":{"out":30},"error":null}`
		}, 5*time.Second, time.Millisecond, "the newer run finishes while the aborted one still runs")
		from := s.Version()
		close(w.stubborn[2]) // the aborted run now returns {"out":20}
		settle(t, rt)
		assert.EqualValues(t, 1, w.stale.Load(), "the aborted run did return its result")
		assert.JSONEq(t, `{"pending":false,"result":{"out":30},"error":null}`, string(get(t, s, "job").Value))
		assert.Equal(t, "30", string(get(t, s, "after").Value))
		assert.Equal(t, from, s.Version(), "the aborted run's result wrote nothing")
		assert.Eventually(t, func() bool {
			return st.count("job", runtime.Aborted) == 1 && st.count("job", runtime.Finished) == 2 && st.count("job", runtime.Started) == 3
		}, 5*time.Second, 10*time.Millisecond, "3 runs: 2 finished, 1 aborted")
	})
}

func TestAsyncMemo(t *testing.T) {
	stores(t, func(t *testing.T, s cells.Store) {
		w := newWork(true, false)
		rt := start(t, s, asyncPattern(w), runtime.Options{})
		st := watchStatus(t, rt)
		set(t, rt, "x", `2`)
		settle(t, rt)
		require.EqualValues(t, 2, w.runs.Load())
		set(t, rt, "x", `1`) // revert: served from the memo cache
		settle(t, rt)
		assert.EqualValues(t, 2, w.runs.Load(), "no run on a revert")
		assert.JSONEq(t, `{"pending":false,"result":{"out":10},"error":null}`, string(get(t, s, "job").Value))
		assert.Eventually(t, func() bool { return st.count("job", runtime.Cached) == 1 }, 5*time.Second, 10*time.Millisecond)
		assert.Equal(t, 1, rt.Nodes()[1].CacheHits)

		// Without memo, a revert runs again; an unchanged key does not.
		w2 := newWork(false, false)
		p := asyncPattern(w2)
		p.Space, p.Name = space, "nomemo"
		require.NoError(t, rt.Load(context.Background(), p))
		settle(t, rt)
		for _, x := range []string{`2`, `1`, `1.0`} {
			require.NoError(t, rt.Set(context.Background(), cells.Address{Space: space, Pattern: "nomemo", Name: "x"}, json.RawMessage(x)))
			settle(t, rt)
		}
		assert.EqualValues(t, 3, w2.runs.Load())
	})
}

func TestRestartResumes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cells.db")
	pattern := func(slow, fast *work) runtime.Pattern {
		return runtime.Pattern{
			Space: space, Name: pat,
			Cells: []runtime.Cell{{Name: "x", Initial: json.RawMessage(`1`)}, {Name: "y", Initial: json.RawMessage(`2`)}},
			Nodes: []runtime.Node{
				{Name: "slow", Inputs: []string{"x"}, Kind: slow},
				{Name: "fast", Inputs: []string{"y"}, Kind: &renamed{fast, "y"}},
			},
		}
	}
	s, err := cells.OpenBolt(path, cells.Options{})
	require.NoError(t, err)
	slow, fast := newWork(false, true), newWork(false, false)
	rt := runtime.New(s, runtime.Options{})
	require.NoError(t, rt.Load(context.Background(), pattern(slow, fast)))
	waitStarted(t, slow)
	require.Eventually(t, func() bool {
		c, _ := s.Get(context.Background(), at("fast"))
		return string(c.Value) == `{"pending":false,"result":{"out":20},"error":null}`
	}, 5*time.Second, 10*time.Millisecond)
	// Kill mid-run: close without finishing.
	require.NoError(t, rt.Close(context.Background()))
	require.NoError(t, s.Close())

	s, err = cells.OpenBolt(path, cells.Options{})
	require.NoError(t, err)
	defer s.Close()
	assert.JSONEq(t, `{"pending":true,"result":null,"error":null}`, string(get(t, s, "slow").Value), "the cancelled run was not written")
	slow2, fast2 := newWork(false, true), newWork(false, false)
	rt = runtime.New(s, runtime.Options{})
	defer rt.Close(context.Background())
	require.NoError(t, rt.Load(context.Background(), pattern(slow2, fast2)))
	assert.Equal(t, 1.0, waitStarted(t, slow2), "the pending run runs again")
	slow2.release <- struct{}{}
	settle(t, rt)
	assert.EqualValues(t, 0, fast2.runs.Load(), "the finished run is not repeated")
	assert.JSONEq(t, `{"pending":false,"result":{"out":10},"error":null}`, string(get(t, s, "slow").Value))
}

// renamed feeds a work kind its input under another name (y as x).
type renamed struct {
	*work
	from string
}

func (r *renamed) Key(in runtime.Inputs) (string, bool, error) {
	return r.work.Key(runtime.Inputs{"x": in[r.from]})
}

func (r *renamed) Run(ctx context.Context, in runtime.Inputs) (any, error) {
	return r.work.Run(ctx, runtime.Inputs{"x": in[r.from]})
}

func TestOutputEncoding(t *testing.T) {
	s := cells.NewMemory(cells.Options{})
	defer s.Close()
	p := runtime.Pattern{
		Cells: []runtime.Cell{{Name: "name", Initial: json.RawMessage(`"a&b"`)}, {Name: "big", Initial: json.RawMessage(`1.5e300`)}},
		Nodes: []runtime.Node{computed(t, "html", `"<b>" + name + "</b>"`), computed(t, "n", "big * 2"), computed(t, "i", "len(name) + 1")},
	}
	start(t, s, p, runtime.Options{})
	assert.Equal(t, `"<b>a&b</b>"`, string(get(t, s, "html").Value), "HTML characters are not escaped")
	assert.Equal(t, `3e+300`, string(get(t, s, "n").Value))
	assert.Equal(t, `4`, string(get(t, s, "i").Value))
}

func TestWaitTimeout(t *testing.T) {
	s := cells.NewMemory(cells.Options{})
	defer s.Close()
	w := newWork(false, true)
	rt := runtime.New(s, runtime.Options{})
	p := asyncPattern(w)
	p.Space, p.Name = space, pat
	require.NoError(t, rt.Load(context.Background(), p))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	assert.ErrorContains(t, rt.Wait(ctx), "wait for the runtime to settle: context deadline exceeded")
	require.NoError(t, rt.Close(context.Background()), "Close cancels the run")
	assert.ErrorIs(t, rt.Set(context.Background(), at("x"), json.RawMessage(`2`)), runtime.ErrClosed)
}

// A node that reads an async node's result waits for the first result
// instead of failing on the null of a run in flight.
func TestWaitsForFirstAsyncResult(t *testing.T) {
	stores(t, func(t *testing.T, s cells.Store) {
		w := newWork(false, true)
		rt := runtime.New(s, runtime.Options{})
		defer rt.Close(context.Background())
		p := runtime.Pattern{Space: space, Name: pat,
			Cells: []runtime.Cell{{Name: "x", Initial: json.RawMessage(`1`)}},
			Nodes: []runtime.Node{
				{Name: "job", Inputs: []string{"x"}, Kind: w, Builtin: "work"},
				{Name: "out", Inputs: []string{"job"}, Kind: mustComputed("job.result.out + 1")},
			}}
		require.NoError(t, rt.Load(context.Background(), p))
		assert.Equal(t, 1.0, waitStarted(t, w))
		if c, err := s.Get(context.Background(), at("out")); err == nil {
			assert.Empty(t, c.Error, "out waits, it does not fail, while job's first run is in flight")
			assert.Equal(t, "null", string(c.Value))
		} else {
			assert.ErrorIs(t, err, cells.ErrNotFound)
		}
		w.release <- struct{}{}
		settle(t, rt)
		c := get(t, s, "out")
		assert.Empty(t, c.Error)
		assert.Equal(t, `11`, string(c.Value))
	})
}

type partialErr struct{ out any }

func (e partialErr) Error() string      { return "exited with 3" }
func (e partialErr) PartialResult() any { return e.out }

type failing struct{ runs atomic.Int32 }

func (*failing) Key(in runtime.Inputs) (string, bool, error) { return fmt.Sprint(in["x"]), true, nil }
func (f *failing) Run(ctx context.Context, in runtime.Inputs) (any, error) {
	f.runs.Add(1)
	return nil, partialErr{out: map[string]any{"exit_code": 3, "stderr": "bad"}}
}

// A failed run shows what it produced beside its error, and is not memoized.
func TestFailedRunKeepsPartialResult(t *testing.T) {
	stores(t, func(t *testing.T, s cells.Store) {
		rt := runtime.New(s, runtime.Options{})
		defer rt.Close(context.Background())
		f := &failing{}
		require.NoError(t, rt.Load(context.Background(), runtime.Pattern{Space: space, Name: pat,
			Cells: []runtime.Cell{{Name: "x", Initial: json.RawMessage(`1`)}},
			Nodes: []runtime.Node{{Name: "job", Inputs: []string{"x"}, Kind: f, Builtin: "exec"}}}))
		settle(t, rt)
		assert.JSONEq(t, `{"pending":false,"result":{"exit_code":3,"stderr":"bad"},"error":"exited with 3"}`, string(get(t, s, "job").Value))
		set(t, rt, "x", `2`)
		settle(t, rt)
		set(t, rt, "x", `1`)
		settle(t, rt)
		assert.Equal(t, int32(3), f.runs.Load(), "a failure is never served from the memo cache")
	})
}

// follow is an async kind that needs job's result: on a null result its Key
// fails, the way an exec's file field reading job.result.files would.
type follow struct{ runs atomic.Int32 }

func (*follow) Key(in runtime.Inputs) (string, bool, error) {
	env, _ := in["job"].(map[string]any)
	res, ok := env["result"].(map[string]any)
	if !ok {
		return "", false, fmt.Errorf("cannot fetch out from %v", env["result"])
	}
	return fmt.Sprint(res["out"]), false, nil
}
func (f *follow) Run(ctx context.Context, in runtime.Inputs) (any, error) {
	f.runs.Add(1)
	return "ok", nil
}

// Nodes downstream of an async node's first run, however far, wait for it:
// no error shows, no async run starts on missing inputs.
func TestWaitsTransitively(t *testing.T) {
	stores(t, func(t *testing.T, s cells.Store) {
		w, f := newWork(false, true), &follow{}
		rt := runtime.New(s, runtime.Options{})
		defer rt.Close(context.Background())
		st := watchStatus(t, rt)
		require.NoError(t, rt.Load(context.Background(), runtime.Pattern{Space: space, Name: pat,
			Cells: []runtime.Cell{{Name: "x", Initial: json.RawMessage(`1`)}},
			Nodes: []runtime.Node{
				{Name: "job", Inputs: []string{"x"}, Kind: w, Builtin: "work"},
				{Name: "next", Inputs: []string{"job"}, Kind: f, Builtin: "follow"},
				{Name: "last", Inputs: []string{"next"}, Kind: mustComputed("next.result + '!'")},
			}}))
		assert.Equal(t, 1.0, waitStarted(t, w))
		for _, n := range []string{"next", "last"} {
			if c, err := s.Get(context.Background(), at(n)); err == nil {
				assert.Empty(t, c.Error, "%s waits for job's first result", n)
			}
		}
		w.release <- struct{}{}
		settle(t, rt)
		assert.Equal(t, int32(1), f.runs.Load())
		assert.Equal(t, `"ok!"`, string(get(t, s, "last").Value))
		for _, n := range []string{"job", "next", "last"} {
			assert.Zero(t, st.count(n, runtime.Failed), "%s never failed on the way", n)
		}
	})
}

// An async node does not run on the partial result of a failed upstream
// run, however far up; a computed still sees the envelope to report it.
func TestFailedUpstreamStopsAsync(t *testing.T) {
	stores(t, func(t *testing.T, s cells.Store) {
		f := &follow{}
		rt := runtime.New(s, runtime.Options{})
		defer rt.Close(context.Background())
		require.NoError(t, rt.Load(context.Background(), runtime.Pattern{Space: space, Name: pat,
			Cells: []runtime.Cell{{Name: "x", Initial: json.RawMessage(`1`)}},
			Nodes: []runtime.Node{
				{Name: "build", Inputs: []string{"x"}, Kind: &failing{}, Builtin: "exec"},
				{Name: "job", Inputs: []string{"build"}, Kind: mustComputed("{pending: false, result: {out: build.result.exit_code}}")},
				{Name: "next", Inputs: []string{"job"}, Kind: f, Builtin: "follow"},
				{Name: "why", Inputs: []string{"build"}, Kind: mustComputed("build.error")},
			}}))
		settle(t, rt)
		assert.Equal(t, `"exited with 3"`, string(get(t, s, "why").Value), "a computed reads the failure")
		assert.Zero(t, f.runs.Load(), "next never ran on a failed build")
		assert.JSONEq(t, `{"pending":false,"result":null,"error":"upstream build failed: exited with 3"}`, string(get(t, s, "next").Value))
	})
}

// flaky is an async kind that fails while broken is set, the way an exec
// fails on an image not built yet: the cause is outside its inputs.
type flaky struct {
	broken atomic.Bool
	runs   atomic.Int32
}

func (*flaky) Key(in runtime.Inputs) (string, bool, error) { return fmt.Sprint(in["x"]), true, nil }
func (f *flaky) Run(ctx context.Context, in runtime.Inputs) (any, error) {
	f.runs.Add(1)
	if f.broken.Load() {
		return nil, errors.New("image cellbox/x is not built")
	}
	return map[string]any{"out": "built"}, nil
}

// A failed async node stays failed when its cause is fixed, until it is
// retried; Retry reruns it (also after a restart), and refuses what it
// cannot retry.
func TestRetry(t *testing.T) {
	stores(t, func(t *testing.T, s cells.Store) {
		f := &flaky{}
		f.broken.Store(true)
		p := runtime.Pattern{Space: space, Name: pat,
			Cells: []runtime.Cell{{Name: "x", Initial: json.RawMessage(`1`)}},
			Nodes: []runtime.Node{
				{Name: "job", Inputs: []string{"x"}, Kind: f, Builtin: "exec"},
				{Name: "next", Inputs: []string{"job"}, Kind: &follow{}, Builtin: "follow"},
				computed(t, "twice", "x * 2"),
			}}
		rt := runtime.New(s, runtime.Options{})
		require.NoError(t, rt.Load(context.Background(), p))
		settle(t, rt)
		assert.JSONEq(t, `{"pending":false,"result":null,"error":"image cellbox/x is not built"}`, string(get(t, s, "job").Value))

		// Still broken: the retry runs and fails again.
		require.NoError(t, rt.Retry(context.Background(), at("job")))
		settle(t, rt)
		assert.EqualValues(t, 2, f.runs.Load(), "a retry runs the node again")
		assert.Contains(t, string(get(t, s, "job").Value), "not built")

		// A restart does not forget the failure.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, rt.Close(ctx))
		rt = runtime.New(s, runtime.Options{})
		defer rt.Close(context.Background())
		require.NoError(t, rt.Load(context.Background(), p))
		settle(t, rt)
		assert.EqualValues(t, 2, f.runs.Load(), "a restart does not rerun a finished (failed) run")
		for _, info := range rt.Nodes() {
			if info.Addr == at("job") {
				assert.Equal(t, runtime.Error, info.State, "the stored failure stands after the restart")
				assert.Equal(t, "image cellbox/x is not built", info.Err)
			}
		}

		f.broken.Store(false) // the image is built
		for _, tc := range []struct {
			node string
			err  error
			msg  string
		}{
			{"twice", runtime.ErrNotRetryable, "node twice is a computed node, which reruns when its inputs change"},
			{"next", runtime.ErrNotRetryable, "node next failed because an input did (upstream job failed: image cellbox/x is not built); retry or fix that one"},
			{"nope", runtime.ErrNoNode, "not the output of a loaded node"},
		} {
			err := rt.Retry(context.Background(), at(tc.node))
			assert.ErrorIs(t, err, tc.err, tc.node)
			assert.ErrorContains(t, err, tc.msg, tc.node)
		}
		require.NoError(t, rt.Retry(context.Background(), at("job")))
		settle(t, rt)
		assert.EqualValues(t, 3, f.runs.Load())
		assert.JSONEq(t, `{"pending":false,"result":{"out":"built"},"error":null}`, string(get(t, s, "job").Value))
		assert.JSONEq(t, `{"pending":false,"result":"ok","error":null}`, string(get(t, s, "next").Value), "dependents follow the retried result")
		err := rt.Retry(context.Background(), at("job"))
		assert.ErrorIs(t, err, runtime.ErrNotRetryable)
		assert.ErrorContains(t, err, "the last run of node job did not fail")
	})
}

// refusing is a store whose next fails Updates fail (a full disk).
type refusing struct {
	cells.Store
	fails atomic.Int32
}

func (s *refusing) Update(ctx context.Context, fn func(cells.Tx) error) error {
	if s.fails.Add(-1) >= 0 {
		return errors.New("write /data/cellbox.db: no space left on device")
	}
	return s.Store.Update(ctx, fn)
}

// A run's result the store refuses is written again; when the store keeps
// refusing, the node's cell says so instead of staying pending forever; when
// even that cannot be written, the node's state says why.
func TestStoreRefusesResult(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fails int32
		cell  string // the job cell after the run
		state runtime.NodeState
		err   string
	}{
		{"once", 1, `{"pending":false,"result":{"out":10},"error":null}`, runtime.Idle, ""},
		{"every attempt", 4, `{"pending":false,"result":null,"error":"store the run's result: write /data/cellbox.db: no space left on device (retry the node once the store takes writes again)"}`,
			runtime.Error, "store the run's result: write /data/cellbox.db: no space left on device"},
		{"and the error too", 5, `{"pending":true,"result":null,"error":null}`,
			runtime.Error, "storing this error failed too (write /data/cellbox.db: no space left on device): the run stays pending and runs again on the next start"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &refusing{Store: cells.NewMemory(cells.Options{})}
			defer s.Close()
			w := newWork(true, true)
			rt := runtime.New(s, runtime.Options{})
			defer rt.Close(context.Background())
			p := asyncPattern(w)
			p.Space, p.Name = space, pat
			require.NoError(t, rt.Load(context.Background(), p))
			waitStarted(t, w)
			s.fails.Store(tc.fails)
			w.release <- struct{}{}
			settle(t, rt)
			assert.JSONEq(t, tc.cell, string(get(t, s, "job").Value))
			var job runtime.NodeInfo
			for _, n := range rt.Nodes() {
				if n.Addr.Name == "job" {
					job = n
				}
			}
			assert.Equal(t, tc.state, job.State)
			assert.Contains(t, job.Err, tc.err)
			if tc.state == runtime.Error && tc.fails == 4 {
				require.NoError(t, rt.Retry(context.Background(), at("job")), "the node can be retried once the store takes writes")
				waitStarted(t, w)
				w.release <- struct{}{}
				settle(t, rt)
				assert.JSONEq(t, `{"pending":false,"result":{"out":10},"error":null}`, string(get(t, s, "job").Value))
			}
		})
	}
}

// The memo cache is capped by size: past the cap the least recently used
// result is evicted (a hit counts as a use), and a result larger than the
// cap is not cached.
func TestMemoLimit(t *testing.T) {
	stores(t, func(t *testing.T, s cells.Store) {
		w := newWork(true, false)
		// Each entry is 11 bytes: key "1" and result {"out":10}; 3 fit.
		rt := start(t, s, asyncPattern(w), runtime.Options{MemoLimit: 35})
		cached := func() []string {
			var keys []string
			require.NoError(t, s.View(context.Background(), func(tx cells.Tx) error {
				return tx.Meta("runtime.memo").ForEach("", func(k string, _ []byte) error { keys = append(keys, k); return nil })
			}))
			return keys
		}
		for _, x := range []string{"2", "3"} {
			set(t, rt, "x", x)
			settle(t, rt)
		}
		assert.Equal(t, []string{"1", "2", "3"}, cached())
		set(t, rt, "x", "1") // a hit: 1 is now the most recently used
		settle(t, rt)
		require.EqualValues(t, 3, w.runs.Load())
		set(t, rt, "x", "4") // over the cap: 2, the least recently used, goes
		settle(t, rt)
		assert.Equal(t, []string{"1", "3", "4"}, cached())
		set(t, rt, "x", "1")
		settle(t, rt)
		assert.EqualValues(t, 4, w.runs.Load(), "1 was kept: served from the cache")
		set(t, rt, "x", "2")
		settle(t, rt)
		assert.EqualValues(t, 5, w.runs.Load(), "2 was evicted: it runs again")
		assert.Equal(t, []string{"1", "2", "4"}, cached(), "and evicts 3")

		set(t, rt, "x", "123456789012345678901234567890") // {"out":1.2345678901234568e+30}: larger than the cap
		settle(t, rt)
		assert.Equal(t, []string{"1", "2", "4"}, cached(), "a result larger than the cap is not cached")
	})
}

// A memo cache written before the cap existed is indexed on the first put,
// and its entries are evicted first.
func TestMemoLimitIndexesOldEntries(t *testing.T) {
	s := cells.NewMemory(cells.Options{})
	defer s.Close()
	require.NoError(t, s.Update(context.Background(), func(tx cells.Tx) error {
		for _, k := range []string{"old1", "old2"} {
			if err := tx.Meta("runtime.memo").Put(k, []byte(`{"out":"0123456789"}`)); err != nil {
				return err
			}
		}
		return nil
	}))
	w := newWork(true, false)
	start(t, s, asyncPattern(w), runtime.Options{MemoLimit: 40}) // runs x=1: 11 bytes, over 40 with both old ones (24 each)
	var keys []string
	require.NoError(t, s.View(context.Background(), func(tx cells.Tx) error {
		return tx.Meta("runtime.memo").ForEach("", func(k string, _ []byte) error { keys = append(keys, k); return nil })
	}))
	assert.Equal(t, []string{"1", "old2"}, keys)
}

// noKey is an async kind whose Key fails, the way an llm node's does with
// no API key, naming its "why" input; it also reads "box".
type noKey struct{}

func (noKey) Key(in runtime.Inputs) (string, bool, error) {
	return "", false, fmt.Errorf("no API key (%v)", in["why"])
}
func (noKey) Run(ctx context.Context, in runtime.Inputs) (any, error) { return nil, nil }

// A node that fails before running, again and again for the same reason as
// an input keeps changing (a sandbox node going starting, running, ...),
// reports that failure once; a different reason is reported again.
func TestSameFailureReportedOnce(t *testing.T) {
	stores(t, func(t *testing.T, s cells.Store) {
		rt := runtime.New(s, runtime.Options{})
		defer rt.Close(context.Background())
		st := watchStatus(t, rt)
		require.NoError(t, rt.Load(context.Background(), runtime.Pattern{Space: space, Name: pat,
			Cells: []runtime.Cell{{Name: "box", Initial: json.RawMessage(`"starting"`)}, {Name: "why", Initial: json.RawMessage(`"a"`)}},
			Nodes: []runtime.Node{{Name: "agent", Inputs: []string{"box", "why"}, Kind: noKey{}, Builtin: "llm"}}}))
		settle(t, rt)
		for _, v := range []string{`"running"`, `"busy"`, `"running"`} {
			set(t, rt, "box", v)
			settle(t, rt)
		}
		assert.JSONEq(t, `{"pending":false,"result":null,"error":"no API key (a)"}`, string(get(t, s, "agent").Value))
		set(t, rt, "why", `"b"`)
		settle(t, rt)
		assert.JSONEq(t, `{"pending":false,"result":null,"error":"no API key (b)"}`, string(get(t, s, "agent").Value))
		// Statuses arrive in order: once b's is in, a's are all in.
		require.Eventually(t, func() bool { return st.count("agent", runtime.Failed) >= 2 }, 5*time.Second, time.Millisecond)
		st.mu.Lock()
		var errs []string
		for _, x := range st.all {
			if x.Node.Name == "agent" && x.Kind == runtime.Failed {
				errs = append(errs, x.Err)
			}
		}
		st.mu.Unlock()
		assert.Equal(t, []string{"no API key (a)", "no API key (b)"}, errs, "each distinct failure once")
	})
}

// A pattern edited between two loads over the same store: what it no
// longer declares is removed (with its node state), a cell whose kind
// changed starts from its new definition, a stored input value its schema
// now refuses is replaced by the initial value, and a value that still
// fits is kept. Loading the edited pattern again changes nothing.
func TestLoadEditedPattern(t *testing.T) {
	stores(t, func(t *testing.T, s cells.Store) {
		v1 := runtime.Pattern{Space: space, Name: pat,
			Cells: []runtime.Cell{
				{Name: "n", Initial: json.RawMessage(`3`)},
				{Name: "k", Initial: json.RawMessage(`1`)},
				{Name: "s", Initial: json.RawMessage(`"a value"`)},
				{Name: "ev", Stream: true},
			},
			Nodes: []runtime.Node{
				{Name: "both", Inputs: []string{"n"}, Kind: &renamed{newWork(false, false), "n"}, Builtin: "exec"},
				{Name: "slow", Inputs: []string{"n"}, Kind: &renamed{newWork(true, false), "n"}, Builtin: "exec"},
				computed(t, "c", "n + 1"),
			}}
		rt := start(t, s, v1, runtime.Options{})
		set(t, rt, "k", `5`)
		_, err := rt.Send(context.Background(), at("ev"), json.RawMessage(`{"queued":true}`))
		require.NoError(t, err)
		settle(t, rt)
		require.JSONEq(t, `{"pending":false,"result":{"out":30},"error":null}`, string(get(t, s, "both").Value))
		require.NoError(t, rt.Close(context.Background()))

		v2 := runtime.Pattern{Space: space, Name: pat,
			Cells: []runtime.Cell{
				{Name: "n", Initial: json.RawMessage(`"3"`), Schema: json.RawMessage(`{"type":"string"}`)},
				{Name: "k", Initial: json.RawMessage(`1`), Schema: json.RawMessage(`{"type":"integer","minimum":0}`)},
				{Name: "both", Initial: json.RawMessage(`7`), Schema: json.RawMessage(`{"type":"integer"}`)},
				{Name: "c", Initial: json.RawMessage(`"fresh"`)},
				{Name: "s", Stream: true},
			},
			Nodes: []runtime.Node{
				computed(t, "twice", "both * 2"),
				computed(t, "ev", "k"),
			}}
		rt = runtime.New(s, runtime.Options{})
		defer rt.Close(context.Background())
		st := watchStatus(t, rt)
		require.NoError(t, rt.Load(context.Background(), v2))
		settle(t, rt)

		assert.Equal(t, `7`, string(get(t, s, "both").Value), "an exec node that is now an input cell starts from its initial value")
		assert.Equal(t, `14`, string(get(t, s, "twice").Value))
		assert.Empty(t, get(t, s, "twice").Error)
		assert.Equal(t, `"3"`, string(get(t, s, "n").Value), "3 breaks n's new schema: the initial value replaces it")
		assert.Equal(t, `5`, string(get(t, s, "k").Value), "a value that still fits its (new) schema is kept")
		assert.Equal(t, `"fresh"`, string(get(t, s, "c").Value), "a computed node that is now an input cell starts from its initial value")
		assert.True(t, get(t, s, "s").Stream, "an input cell that is now a stream is one")
		assert.False(t, get(t, s, "ev").Stream, "a stream that is now a node's output is a value cell")
		assert.Equal(t, `5`, string(get(t, s, "ev").Value))
		_, err = s.Get(context.Background(), at("slow"))
		assert.ErrorIs(t, err, cells.ErrNotFound, "a removed node's cell is removed")
		require.NoError(t, s.View(context.Background(), func(tx cells.Tx) error {
			for _, name := range []string{"slow", "both"} {
				_, ok := tx.Meta("runtime.nodes").Get(at(name).String())
				assert.False(t, ok, "the node state of %s is gone", name)
			}
			evs, err := tx.Events(at("s"))
			assert.NoError(t, err)
			assert.Empty(t, evs)
			return nil
		}))
		err = rt.Set(context.Background(), at("n"), json.RawMessage(`4`))
		var se *cells.SchemaError
		assert.ErrorAs(t, err, &se, "the new schema holds")
		assert.Eventually(t, func() bool {
			return st.count("both", runtime.Reset) == 1 && st.count("n", runtime.Reset) == 1 && st.count("c", runtime.Reset) == 1 &&
				st.count("s", runtime.Reset) == 1 && st.count("ev", runtime.Reset) == 1
		}, 5*time.Second, 10*time.Millisecond, "each reset is reported")
		st.mu.Lock()
		for _, x := range st.all {
			if x.Kind == runtime.Reset {
				switch x.Node.Name {
				case "both":
					assert.Equal(t, "it was the output of a node (exec) and is now an input cell: it starts from the pattern's definition", x.Err)
				case "n":
					assert.Equal(t, "its stored value 3 does not satisfy the cell's schema ((root): must be string (got number)): replaced by the initial value", x.Err)
				case "k", "twice":
					t.Errorf("%s was reset: %s", x.Node.Name, x.Err)
				}
			}
		}
		st.mu.Unlock()

		// Loaded again as it is: nothing to reconcile, nothing written.
		require.NoError(t, rt.Close(context.Background()))
		from := s.Version()
		rt2 := runtime.New(s, runtime.Options{})
		defer rt2.Close(context.Background())
		st2 := watchStatus(t, rt2)
		require.NoError(t, rt2.Load(context.Background(), v2))
		settle(t, rt2)
		assert.Equal(t, from, s.Version(), "a settled pattern loads without a commit")
		assert.Zero(t, st2.count("both", runtime.Reset)+st2.count("n", runtime.Reset)+st2.count("c", runtime.Reset))
	})
}

// A store written before the runtime recorded what each cell was: the
// output of an async node (it has node state) that is now an input cell
// still starts from its initial value, and removed nodes go.
func TestLoadEditedPatternWithoutRecord(t *testing.T) {
	stores(t, func(t *testing.T, s cells.Store) {
		v1 := runtime.Pattern{Space: space, Name: pat,
			Cells: []runtime.Cell{{Name: "n", Initial: json.RawMessage(`3`)}},
			Nodes: []runtime.Node{
				{Name: "both", Inputs: []string{"n"}, Kind: &renamed{newWork(false, false), "n"}, Builtin: "exec"},
				{Name: "slow", Inputs: []string{"n"}, Kind: &renamed{newWork(false, false), "n"}, Builtin: "exec"},
			}}
		rt := start(t, s, v1, runtime.Options{})
		require.NoError(t, rt.Close(context.Background()))
		require.NoError(t, s.Update(context.Background(), func(tx cells.Tx) error { return tx.Meta("runtime.patterns").Delete(space + "/" + pat) }))

		v2 := runtime.Pattern{Space: space, Name: pat,
			Cells: []runtime.Cell{{Name: "n", Initial: json.RawMessage(`1`)}, {Name: "both", Initial: json.RawMessage(`7`)}},
			Nodes: []runtime.Node{computed(t, "twice", "both * 2")}}
		rt = start(t, s, v2, runtime.Options{})
		assert.Equal(t, `7`, string(get(t, s, "both").Value))
		assert.Equal(t, `14`, string(get(t, s, "twice").Value))
		assert.Equal(t, `3`, string(get(t, s, "n").Value), "an input cell stays what it was")
		_, err := s.Get(context.Background(), at("slow"))
		assert.ErrorIs(t, err, cells.ErrNotFound)
	})
}

// Another loaded instance that reads a cell by its full address sees it
// go (null) when the pattern that had it no longer declares it.
func TestRemovedCellReadByAnotherInstance(t *testing.T) {
	stores(t, func(t *testing.T, s cells.Store) {
		x := space + "/" + pat + "/x"
		rt := start(t, s, runtime.Pattern{Space: space, Name: pat, Cells: []runtime.Cell{{Name: "x", Initial: json.RawMessage(`2`)}}}, runtime.Options{})
		require.NoError(t, rt.Load(context.Background(), runtime.Pattern{Space: space, Name: "reader",
			Nodes: []runtime.Node{{Name: "y", Inputs: []string{x}, Kind: orMinusOne(x)}}}))
		settle(t, rt)
		y := cells.Address{Space: space, Pattern: "reader", Name: "y"}
		c, err := s.Get(context.Background(), y)
		require.NoError(t, err)
		require.Equal(t, `2`, string(c.Value))

		require.NoError(t, rt.Stop(context.Background(), space, pat))
		require.NoError(t, rt.Load(context.Background(), runtime.Pattern{Space: space, Name: pat, Cells: []runtime.Cell{{Name: "z"}}}))
		settle(t, rt)
		_, err = s.Get(context.Background(), at("x"))
		assert.ErrorIs(t, err, cells.ErrNotFound)
		c, err = s.Get(context.Background(), y)
		require.NoError(t, err)
		assert.Equal(t, `-1`, string(c.Value), "the reader reran on the removed cell")
	})
}

// orMinusOne is a compute that returns its one input, or -1 for null.
type orMinusOne string

func (o orMinusOne) Compute(in runtime.Inputs) (any, error) {
	if v := in[string(o)]; v != nil {
		return v, nil
	}
	return -1, nil
}

// failThenWork fails (with a partial result) for x == 1 and otherwise
// finishes with x*10 once released.
type failThenWork struct{ release chan struct{} }

func (*failThenWork) Key(in runtime.Inputs) (string, bool, error) {
	return fmt.Sprint(in["x"]), false, nil
}
func (f *failThenWork) Run(ctx context.Context, in runtime.Inputs) (any, error) {
	if in["x"] == 1 {
		return nil, partialErr{out: map[string]any{"out": "partial"}}
	}
	select {
	case <-f.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return map[string]any{"out": toFloat(in["x"]) * 10}, nil
}

// While an async node runs again after a failed run, its cell keeps that
// run's error with its result: a reader checking error does not take the
// failed run's partial result for a success while the new run is pending.
func TestRerunKeepsFailedRunsError(t *testing.T) {
	stores(t, func(t *testing.T, s cells.Store) {
		f := &failThenWork{release: make(chan struct{})}
		rt := start(t, s, runtime.Pattern{Space: space, Name: pat,
			Cells: []runtime.Cell{{Name: "x", Initial: json.RawMessage(`1`)}},
			Nodes: []runtime.Node{
				{Name: "job", Inputs: []string{"x"}, Kind: f, Builtin: "exec"},
				computed(t, "ok", `job.error == nil ? job.result.out : "failed"`),
			}}, runtime.Options{})
		assert.JSONEq(t, `{"pending":false,"result":{"out":"partial"},"error":"exited with 3"}`, string(get(t, s, "job").Value))
		assert.Equal(t, `"failed"`, string(get(t, s, "ok").Value))

		set(t, rt, "x", `2`)
		assert.JSONEq(t, `{"pending":true,"result":{"out":"partial"},"error":"exited with 3"}`, string(get(t, s, "job").Value),
			"pending, with the failed run's result and its error")
		assert.Equal(t, `"failed"`, string(get(t, s, "ok").Value), "the failed run does not pass for a success while the new one runs")
		f.release <- struct{}{}
		settle(t, rt)
		assert.JSONEq(t, `{"pending":false,"result":{"out":20},"error":null}`, string(get(t, s, "job").Value))
		assert.Equal(t, `20`, string(get(t, s, "ok").Value))

		set(t, rt, "x", `3`)
		assert.JSONEq(t, `{"pending":true,"result":{"out":20},"error":null}`, string(get(t, s, "job").Value), "after a success: the result, no error")
		f.release <- struct{}{}
		settle(t, rt)
	})
}
