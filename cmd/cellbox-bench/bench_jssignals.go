package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// alienSignalsVersion is the alien-signals (JS signals library) release the
// runtime bench compares propagation with (issue 23: per node within 3× of
// it, measured in the same run).
const alienSignalsVersion = "3.2.1"

// alienSignalsFactor is the target: cellbox's per-node p50 within this
// many times alien-signals' on the same shape.
const alienSignalsFactor = 3

// alienWarmup is the number of untimed propagations the JS run makes
// first, so that V8 has compiled the hot paths (the Go runtime gets one).
// After 20, diamonds still ran at 88-109 ns per node in some runs and
// 40 ns in others; after 200, at 33-37 ns in every run (chain and
// fan-out were as fast after 20). It costs well under a second.
const alienWarmup = 200

// alienSignalsJS builds the bench's three shapes with alien-signals'
// signal and computed, and one effect that reads the shape's sinks (chain:
// the last node; fan-out: every node; diamonds: the last bottom), so that
// every node recomputes on every write of root, as in cellbox. It prints
// one JSON object: per shape, its node count and the time of each timed
// write of root (ns, the effect run included: alien-signals runs it
// synchronously). Arguments: nodes, rounds, warm-up rounds.
const alienSignalsJS = `import { signal, computed, effect } from 'alien-signals';
const [nodes, rounds, warmup] = process.argv.slice(2).map(Number);
function build(shape, root) {
  const all = [];
  if (shape === 'chain') { // n0 = root + 1, n1 = n0 + 1, ...
    let prev = root;
    for (let i = 0; i < nodes; i++) { const p = prev; prev = computed(() => p() + 1); all.push(prev); }
    return { all, sinks: [prev], want: v => v + nodes };
  }
  if (shape === 'fan-out') { // every node reads root
    for (let i = 0; i < nodes; i++) { const k = i; all.push(computed(() => root() + k)); }
    return { all, sinks: all, want: v => nodes * v + nodes * (nodes - 1) / 2 };
  }
  let top = root; // top -> left, right -> bottom = the next top
  for (let i = 0; all.length + 3 <= nodes; i++) {
    const t = top;
    const l = computed(() => t() + 1), r = computed(() => t() - 1);
    top = computed(() => (l() + r()) / 2);
    all.push(l, r, top);
  }
  return { all, sinks: [top], want: v => v };
}
const out = {};
for (const shape of ['chain', 'fan-out', 'diamonds']) {
  const root = signal(0);
  const { all, sinks, want } = build(shape, root);
  // A first read in order: a computed first read from the end of a
  // 10,000-deep chain would recurse 10,000 frames deep.
  for (const x of all) x();
  let sum = 0;
  effect(() => { let s = 0; for (const x of sinks) s += x(); sum = s; });
  const ns = [];
  for (let i = -warmup; i < rounds; i++) {
    const t0 = process.hrtime.bigint();
    root(i + 1);
    const d = process.hrtime.bigint() - t0;
    if (sum !== want(i + 1)) throw new Error(shape + ': the sinks read ' + sum + ', want ' + want(i + 1));
    if (i >= 0) ns.push(Number(d));
  }
  out[shape] = { nodes: all.length, ns };
}
console.log(JSON.stringify(out));
`

// alienRun is what the JS run measured: per shape (chain, fan-out,
// diamonds), the time of each write of root per node.
type alienRun struct {
	label   string // "alien-signals 3.2.1, node v20.20.2"
	perNode map[string][]time.Duration
}

// runAlienSignals installs alien-signals (once, into the user's cache
// directory) and runs alienSignalsJS with node. An error says why there
// is no JS figure (node or npm missing, the install failed).
func runAlienSignals(ctx context.Context, nodeBin string, nodes, rounds int) (*alienRun, error) {
	nodePath, err := exec.LookPath(nodeBin)
	if err != nil {
		return nil, fmt.Errorf("no node to run it: %w", err)
	}
	ver, err := exec.CommandContext(ctx, nodePath, "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --version: %w", nodePath, err)
	}
	dir, err := alienSignalsDir(ctx, nodePath)
	if err != nil {
		return nil, err
	}
	script := filepath.Join(dir, "bench-runtime.mjs")
	if err := os.WriteFile(script, []byte(alienSignalsJS), 0o644); err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	// Deep chains: a margin of stack for alien-signals' first reads.
	cmd := exec.CommandContext(rctx, nodePath, "--stack-size=16000", script,
		strconv.Itoa(nodes), strconv.Itoa(rounds), strconv.Itoa(alienWarmup))
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("node %s: %w: %s", script, err, clip(stderr.String(), 500))
	}
	var res map[string]struct {
		Nodes int     `json:"nodes"`
		NS    []int64 `json:"ns"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return nil, fmt.Errorf("node %s printed %q: %w", script, clip(string(out), 200), err)
	}
	run := &alienRun{
		label:   fmt.Sprintf("alien-signals %s, node %s", alienSignalsVersion, strings.TrimSpace(string(ver))),
		perNode: map[string][]time.Duration{},
	}
	for shape, r := range res {
		for _, ns := range r.NS {
			run.perNode[shape] = append(run.perNode[shape], time.Duration(ns/int64(max(r.Nodes, 1))))
		}
	}
	return run, nil
}

// alienSignalsDir returns a directory with alien-signals installed in
// node_modules: <user cache dir>/cellbox-bench/js, installed there with
// npm (beside node) unless the pinned version is there already.
func alienSignalsDir(ctx context.Context, nodePath string) (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory to install alien-signals in: %w", err)
	}
	dir := filepath.Join(cache, "cellbox-bench", "js")
	if installedVersion(dir) == alienSignalsVersion {
		return dir, nil
	}
	npm, err := exec.LookPath(filepath.Join(filepath.Dir(nodePath), "npm"))
	if err != nil {
		if npm, err = exec.LookPath("npm"); err != nil {
			return "", fmt.Errorf("no npm to install alien-signals with: %w", err)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	pkg := filepath.Join(dir, "package.json")
	if _, err := os.Stat(pkg); errors.Is(err, os.ErrNotExist) {
		if err := os.WriteFile(pkg, []byte(`{"private": true}`+"\n"), 0o644); err != nil {
			return "", err
		}
	}
	ictx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ictx, npm, "install", "--no-audit", "--no-fund", "--loglevel=error", "alien-signals@"+alienSignalsVersion)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("npm install alien-signals@%s in %s: %w: %s", alienSignalsVersion, dir, err, clip(string(out), 500))
	}
	if v := installedVersion(dir); v != alienSignalsVersion {
		return "", fmt.Errorf("npm install alien-signals@%s in %s left version %q", alienSignalsVersion, dir, v)
	}
	return dir, nil
}

// installedVersion is the version of alien-signals in dir's node_modules
// ("" if none).
func installedVersion(dir string) string {
	data, err := os.ReadFile(filepath.Join(dir, "node_modules", "alien-signals", "package.json"))
	if err != nil {
		return ""
	}
	var p struct {
		Version string `json:"version"`
	}
	if json.Unmarshal(data, &p) != nil {
		return ""
	}
	return p.Version
}

// clip keeps the last n bytes of s, trimmed.
func clip(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
