package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/cellbox/cellbox/builtins"
	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/runtime"
)

// Targets and reference points of the runtime bench (issues 3 and 10).
const (
	targetPerNode = 500 * time.Nanosecond // computed node, in memory
	// targetChain50Bolt is a 50-level chain written through bbolt, whose
	// commit alone (two fdatasyncs) is the "Runtime.Set returns" baseline
	// of the watcher row.
	targetChain50Bolt = 100 * time.Microsecond
	// Common Tools' own scheduler benchmark: a 50-level chain in 20.6 ms
	// (published; not measured here).
	commonToolsChain50 = 20600 * time.Microsecond
)

// runtimeOptions are the flags of `cellbox bench runtime`.
type runtimeOptions struct {
	benchCommon        // n: propagations per graph; backends: of the file-binding rows
	nodes       int    // nodes of each graph
	watchN      int    // writes of the watch measurement
	js          bool   // measure alien-signals on the same shapes (node)
	node        string // the node binary of the JS rows
}

func benchRuntimeCmd(ctx context.Context, args []string) (*benchReport, bool, error) {
	fs := flag.NewFlagSet("bench runtime", flag.ContinueOnError)
	var o runtimeOptions
	o.flags(fs, 50, "propagations through each graph", 20*time.Second,
		"box backend of the file-binding measurements: docker, local, both or none", "static cellbox binary run as the agent in every box (default: cellbox beside this executable)", true)
	fs.IntVar(&o.nodes, "nodes", 10000, "nodes of each computed graph")
	fs.IntVar(&o.watchN, "watch-n", 200, "cell writes of the watcher measurement")
	fs.BoolVar(&o.js, "js", true, "measure alien-signals (JS, run by node) on the same shapes, the target's reference")
	fs.StringVar(&o.node, "node", "node", "node binary of the alien-signals rows")
	err := o.parse(fs, args, func() error { return positive("watch-n", o.watchN) }, func() error {
		if o.nodes < 3 {
			return fmt.Errorf("--nodes %d: want at least 3 (one diamond)", o.nodes)
		}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	rep, err := benchRuntime(ctx, o)
	return rep, o.asJSON, err
}

// graphShape is a computed graph over the input cell "root".
type graphShape struct {
	name  string
	nodes []runtime.Node
}

// benchShapes are the graphs of runtime/bench_test.go, with n nodes each
// (diamonds: the largest multiple of 3 not above n).
func benchShapes(n int) ([]graphShape, error) {
	var chain, fanout, diamonds []runtime.Node
	var errs []error
	node := func(name, src string) runtime.Node {
		c, err := builtins.NewComputed(src)
		errs = append(errs, err)
		if err != nil {
			return runtime.Node{}
		}
		return runtime.Node{Name: name, Inputs: c.Inputs(), Kind: c, Builtin: "computed"}
	}
	for i := range n { // n0 = root + 1, n1 = n0 + 1, ...
		in := "root"
		if i > 0 {
			in = "n" + strconv.Itoa(i-1)
		}
		chain = append(chain, node("n"+strconv.Itoa(i), in+" + 1"))
	}
	for i := range n { // every node reads root
		fanout = append(fanout, node("n"+strconv.Itoa(i), "root + "+strconv.Itoa(i)))
	}
	top := "root" // top -> left, right -> bottom = the next top
	for i := 0; len(diamonds)+3 <= n; i++ {
		l, r, b := fmt.Sprintf("l%d", i), fmt.Sprintf("r%d", i), fmt.Sprintf("b%d", i)
		diamonds = append(diamonds, node(l, top+" + 1"), node(r, top+" - 1"), node(b, "("+l+" + "+r+") / 2"))
		top = b
	}
	return []graphShape{{"chain", chain}, {"fan-out", fanout}, {"diamonds", diamonds}}, errors.Join(errs...)
}

func benchRuntime(ctx context.Context, o runtimeOptions) (*benchReport, error) {
	shapes, err := benchShapes(o.nodes)
	if err != nil {
		return nil, err
	}
	chain50, err := benchShapes(50)
	if err != nil {
		return nil, err
	}
	if len(o.backends) > 0 {
		if o.agentBinary, err = cellboxBinary(o.agentBinary); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "cellbox-bench-runtime-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	rep := newBenchReport("runtime")
	rep.note("propagate: one Runtime.Set of the root cell, which recomputes every node of the graph in one batch (one store commit); per node = the write's time / nodes. Shapes as in runtime/bench_test.go: chain (each node reads the previous), fan-out (every node reads root), diamonds (top → left, right → bottom → next top).")
	rep.note("baseline: the same compiled expressions evaluated in order, their inputs read from a Go map by name, with no runtime and no store (each bound to its inputs' order, as the runtime binds them).")
	rep.note("watcher: cells.Store.Watch on the pattern; from the start of Runtime.Set of a cell to a watcher goroutine receiving the commit with its computed dependent; baseline: Runtime.Set returning.")
	rep.note("bbolt: a cells.OpenBolt file in %s with fsync on every commit (the default); its 50-level chain is beside a bbolt commit of one key in the same directory, the floor under any durable write there. \"bbolt, no fsync\": the same with cells.Options{NoSync: true} (bbolt NoSync), to show the store and runtime work apart from the disk flush.", os.TempDir())
	if len(o.backends) > 0 {
		rep.note("file bindings: a sandbox node (builtins.Sandbox) with %s bound to the cell content and %s bound to files[%q] of its output, on a runtime over bbolt with the sandbox service in-process (as `cellbox run` has them). Cell → file: from Runtime.Set until the box's file holds the value (polled through the service). File → cell: from the start of a write of the file through the service until a store watcher sees the output cell with it; the agent debounces file events by 10 ms.", bindIn, bindOut, bindOut)
	}

	memPerNode := map[string][]time.Duration{} // by shape
	for _, st := range []string{"memory", "bbolt"} {
		for _, sh := range shapes {
			base, err := directEval(ctx, sh.nodes, o.budget)
			if err != nil {
				return rep, err
			}
			samples, err := propagate(ctx, dir, st, sh, o)
			if err != nil {
				return rep, fmt.Errorf("propagate %s on %s: %w", sh.name, st, err)
			}
			perNode := make([]time.Duration, len(samples))
			for i, d := range samples {
				perNode[i] = d / time.Duration(len(sh.nodes))
			}
			target := time.Duration(0)
			if st == "memory" {
				target = targetPerNode
				memPerNode[sh.name] = perNode
			}
			rep.add(st, fmt.Sprintf("propagate %s of %d computed nodes, per node", sh.name, len(sh.nodes)), perNode,
				"expressions evaluated directly, per node", base, target)
		}
		if st == "memory" && o.js {
			alienRows(ctx, rep, shapes, memPerNode, o)
		}
		samples, err := propagate(ctx, dir, st, chain50[0], o)
		if err != nil {
			return rep, fmt.Errorf("propagate 50-level chain on %s: %w", st, err)
		}
		if st == "memory" {
			rep.add(st, "propagate 50-level chain, whole write", samples, "Common Tools scheduler (published)", commonToolsChain50, 0)
		} else {
			// A durable write cannot be faster than a bbolt commit of
			// one key on the same file system: the floor, measured here.
			floorP50, err := boltCommitP50(ctx, dir, o, false)
			if err != nil {
				return rep, err
			}
			rep.add(st, "propagate 50-level chain, whole write", samples, "bbolt commit of one key (2 fdatasyncs)", floorP50, targetChain50Bolt)
			if samples, err = propagate(ctx, dir, "bbolt-nosync", chain50[0], o); err != nil {
				return rep, fmt.Errorf("propagate 50-level chain on bbolt without fsync: %w", err)
			}
			if floorP50, err = boltCommitP50(ctx, dir, o, true); err != nil {
				return rep, err
			}
			rep.add("bbolt, no fsync", "propagate 50-level chain, whole write", samples, "bbolt commit of one key, no fsync", floorP50, 0)
		}
		if err := watchLatency(ctx, dir, st, o, rep); err != nil {
			return rep, fmt.Errorf("watch on %s: %w", st, err)
		}
	}
	for _, name := range o.backends {
		if err := bindingRows(ctx, rep, name, o); err != nil {
			return rep, fmt.Errorf("file bindings on the %s backend: %w", name, err)
		}
	}
	return rep, nil
}

// alienRows measures alien-signals on the same shapes and adds, per
// shape, its row and the target row: cellbox's per-node figure on the
// memory store (perNode) against it. Without node or npm, or when the
// install or the run fails, a note says why and the bench goes on.
func alienRows(ctx context.Context, rep *benchReport, shapes []graphShape, perNode map[string][]time.Duration, o runtimeOptions) {
	run, err := runAlienSignals(ctx, o.node, o.nodes, o.n)
	if err != nil {
		rep.note("alien-signals rows skipped: %v", err)
		return
	}
	var held []string
	for _, sh := range shapes {
		js := run.perNode[sh.name]
		if len(js) == 0 {
			rep.note("alien-signals row of %s skipped: the JS run gave no figure", sh.name)
			continue
		}
		what := fmt.Sprintf("propagate %s of %d computed nodes, per node", sh.name, len(sh.nodes))
		var direct time.Duration // the shape's Go baseline, measured above
		for _, row := range rep.Rows {
			if row.Backend == "memory" && row.What == what {
				direct = row.BaselineP50
			}
		}
		rep.add(run.label, what, js, "expressions evaluated directly (Go), per node", direct, 0)
		jsP50 := rep.Rows[len(rep.Rows)-1].P50
		rep.add("memory", what+", against alien-signals", perNode[sh.name], "alien-signals, same shape, per node", jsP50, alienSignalsFactor*jsP50)
		row := rep.Rows[len(rep.Rows)-1]
		mark := "missed"
		if *row.Met {
			mark = "held"
		}
		held = append(held, fmt.Sprintf("%s %.3g× (%s)", sh.name, row.Ratio, mark))
	}
	rep.note("alien-signals: %s, installed with npm in the user's cache directory (cellbox-bench/js); the same shapes built with signal and computed, and one effect reading the sinks (chain: the last node; fan-out: every node; diamonds: the last bottom), so that every node recomputes on each write of root, as in cellbox; %d untimed writes first (V8 compiles the hot paths), then one sample per write of root (its effect run included, which alien-signals runs synchronously); per node = that time / nodes. All in one process's memory: no store, no log, no JSON.", run.label, alienWarmup)
	rep.note("target (issue 23): cellbox's per-node p50 on the memory store within %d× alien-signals' on each shape (the target column holds %d× alien-signals' p50): %s.", alienSignalsFactor, alienSignalsFactor, strings.Join(held, ", "))
}

// benchRuntimeInstance is a runtime over a fresh store (memory, or a
// bbolt file in dir) with pattern p loaded. closeAll closes both and
// removes the file.
func benchRuntimeInstance(ctx context.Context, dir, kind string, p runtime.Pattern) (rt *runtime.Runtime, s cells.Store, closeAll func(), err error) {
	path := ""
	if kind == "memory" {
		s = cells.NewMemory(cells.Options{})
	} else {
		path = filepath.Join(dir, fmt.Sprintf("%s-%d.db", p.Name, time.Now().UnixNano()))
		if s, err = cells.OpenBolt(path, cells.Options{NoSync: kind == "bbolt-nosync"}); err != nil {
			return nil, nil, nil, err
		}
	}
	rt = runtime.New(s, runtime.Options{Logger: benchLogger()})
	closeAll = func() {
		rt.Close(context.Background())
		s.Close()
		if path != "" {
			os.Remove(path)
		}
	}
	if err := rt.Load(ctx, p); err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	return rt, s, closeAll, nil
}

// propagate times Runtime.Set of the root of shape (after one write to
// warm up).
func propagate(ctx context.Context, dir, kind string, sh graphShape, o runtimeOptions) ([]time.Duration, error) {
	p := runtime.Pattern{Space: "bench", Name: sh.name, Cells: []runtime.Cell{{Name: "root", Initial: json.RawMessage(`0`)}}, Nodes: sh.nodes}
	rt, _, closeAll, err := benchRuntimeInstance(ctx, dir, kind, p)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	root := cells.Address{Space: "bench", Pattern: sh.name, Name: "root"}
	if err := rt.Set(ctx, root, json.RawMessage(`-1`)); err != nil {
		return nil, err
	}
	return benchLoop(ctx, o.n, o.budget, func(i int) (time.Duration, error) {
		return timed(func() error { return rt.Set(ctx, root, json.RawMessage(strconv.Itoa(i+1))) })
	})
}

// boltCommitP50 times bbolt commits of one small key in a fresh file in
// dir, with or without fsync, and returns their p50: the floor under any
// write to a store there.
func boltCommitP50(ctx context.Context, dir string, o runtimeOptions, noSync bool) (time.Duration, error) {
	path := filepath.Join(dir, fmt.Sprintf("floor-%d.db", time.Now().UnixNano()))
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoSync: noSync})
	if err != nil {
		return 0, err
	}
	defer os.Remove(path)
	defer db.Close()
	put := func(i int) error {
		return db.Update(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte("floor"))
			if err != nil {
				return err
			}
			return b.Put([]byte("k"), []byte(strconv.Itoa(i)))
		})
	}
	if err := put(-1); err != nil {
		return 0, fmt.Errorf("bbolt commit floor: %w", err)
	}
	samples, err := benchLoop(ctx, o.n, o.budget, func(i int) (time.Duration, error) {
		return timed(func() error { return put(i) })
	})
	p50, _, _ := percentiles(samples)
	return p50, err
}

// watchLatency times a cell write until a store watcher receives the commit
// (with the cell's computed dependent).
func watchLatency(ctx context.Context, dir, kind string, o runtimeOptions, rep *benchReport) error {
	c, err := builtins.NewComputed("x + 1")
	if err != nil {
		return err
	}
	p := runtime.Pattern{Space: "bench", Name: "watch",
		Cells: []runtime.Cell{{Name: "x", Initial: json.RawMessage(`0`)}},
		Nodes: []runtime.Node{{Name: "y", Inputs: c.Inputs(), Kind: c, Builtin: "computed"}}}
	rt, s, closeAll, err := benchRuntimeInstance(ctx, dir, kind, p)
	if err != nil {
		return err
	}
	defer closeAll()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	batches, err := s.Watch(wctx, "bench/watch/", s.Version())
	if err != nil {
		return err
	}
	// The watcher notes when it sees y's new value.
	type seen struct {
		value string
		at    time.Time
	}
	seenc := make(chan seen, 16)
	go func() {
		for b := range batches {
			for _, ch := range b.Changes {
				if ch.Cell.Addr.Name != "y" {
					continue
				}
				select {
				case seenc <- seen{string(ch.Cell.Value), time.Now()}:
				case <-wctx.Done():
					return
				}
			}
		}
	}()
	x := cells.Address{Space: "bench", Pattern: "watch", Name: "x"}
	var sets []time.Duration
	notified, err := benchLoop(ctx, o.watchN, o.budget, func(i int) (time.Duration, error) {
		want := strconv.Itoa(i + 2)
		start := time.Now()
		if err := rt.Set(ctx, x, json.RawMessage(strconv.Itoa(i+1))); err != nil {
			return 0, err
		}
		sets = append(sets, time.Since(start))
		timeout := time.After(10 * time.Second)
		for {
			select {
			case s := <-seenc:
				if s.value == want {
					return s.at.Sub(start), nil
				}
			case <-timeout:
				return 0, fmt.Errorf("the watcher did not see y = %s within 10s", want)
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
	})
	if err != nil {
		return err
	}
	setP50, _, _ := percentiles(sets)
	rep.add(kind, "cell write → watcher notified", notified, "Runtime.Set returns", setP50, 0)
	return nil
}

// directEval returns the time per node of evaluating the graph's
// expressions in order from a map, with no runtime or store.
func directEval(ctx context.Context, nodes []runtime.Node, budget time.Duration) (time.Duration, error) {
	vals := map[string]any{}
	fns := make([]func([]any) (any, error), len(nodes))
	for i, n := range nodes {
		fns[i] = n.Kind.(*builtins.Computed).BindArgs(n.Inputs)
	}
	var args []any
	round := func(root int) error {
		vals["root"] = root
		for k, n := range nodes {
			args = args[:0]
			for _, in := range n.Inputs {
				args = append(args, vals[in])
			}
			out, err := fns[k](args)
			if err != nil {
				return fmt.Errorf("evaluate %s: %w", n.Name, err)
			}
			vals[n.Name] = out
		}
		return nil
	}
	if err := round(-1); err != nil {
		return 0, err
	}
	samples, err := benchLoop(ctx, 20, budget, func(i int) (time.Duration, error) {
		return timed(func() error { return round(i) })
	})
	p50, _, _ := percentiles(samples)
	return p50 / time.Duration(len(nodes)), err
}
