package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/patterns"
	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/docker"
	"github.com/cellbox/cellbox/server"
	"github.com/cellbox/cellbox/server/runapi"
)

// Targets of the pipeline bench (issue 10): an exec stage's overhead beyond
// its command, and a run with nothing to do.
var (
	targetStageOverhead = map[string]time.Duration{"local": 10 * time.Millisecond, "docker": 20 * time.Millisecond}
	// targetRerunRatio is the csv rerun's target as a share of make's with
	// the backend's own sandbox.
	targetRerunRatio = map[string]float64{"local": 1.2, "docker": 0.5}
	targetNoop       = 10 * time.Millisecond
)

// The three peers of a pipeline stage: make running it in `docker run`, in
// `bwrap`, or with no sandbox.
const (
	peerPlain  = "make, no sandbox"
	peerBwrap  = "make + bwrap"
	peerDocker = "make + docker run"
)

// pipelineOptions are the flags of `cellbox bench pipeline`.
type pipelineOptions struct {
	benchCommon
	example string // the csv-pipeline example's folder
}

func benchPipelineCmd(ctx context.Context, args []string) (*benchReport, bool, error) {
	fs := flag.NewFlagSet("bench pipeline", flag.ContinueOnError)
	var o pipelineOptions
	o.flags(fs, 20, "iterations of each measurement", 30*time.Second,
		"box backend to measure: docker, local (bubblewrap) or both", "static cellbox binary run as the agent in every box, and as `cellbox run --once` (default: cellbox beside this executable)", false)
	fs.StringVar(&o.example, "example", "examples/csv-pipeline", "folder of the csv-pipeline example, whose stages are measured")
	err := o.parse(fs, args, func() error {
		if _, err := os.Stat(filepath.Join(o.example, patterns.FileName)); err != nil {
			return fmt.Errorf("--example %s: %w (give the folder of examples/csv-pipeline)", o.example, err)
		}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	rep, err := benchPipeline(ctx, o)
	return rep, o.asJSON, err
}

// pipelineBench is one run of the pipeline bench: its folders (under a
// temporary root) and what it measured so far.
type pipelineBench struct {
	o    pipelineOptions
	rep  *benchReport
	root string
	// csv and stage are the two patterns cellbox runs: the example's
	// stages with memoization off (every change reruns them, as under
	// make), and one stage running `true`.
	csv, stage string
	// What was measured, kept until every peer has run and the rows can
	// be written with their baselines.
	cellboxRuns []scenarioSamples          // one per backend, in order
	peers       map[string]scenarioSamples // by peer
	// makeDirs are the make peers' csv folders, by peer.
	makeDirs map[string]string
	// first are the first full runs, by backend and by peer; apiRun and
	// apiServe the csv reruns through the HTTP API of `cellbox run` and
	// `cellbox serve`, by backend.
	first, apiRun, apiServe map[string][]time.Duration
}

// scenarioSamples are the samples of the three scenarios on one backend
// (or under one make peer).
type scenarioSamples struct {
	backend          string
	rerun, one, noop []time.Duration
}

// Scenarios of the bench.
const (
	scRerun = "csv rerun after a threshold change (2 stages)"
	scTrue  = "one stage running `true` with one input file"
	scNoop  = "nothing to do"
)

func benchPipeline(ctx context.Context, o pipelineOptions) (*benchReport, error) {
	var err error
	if o.agentBinary, err = cellboxBinary(o.agentBinary); err != nil {
		return nil, err
	}
	// Short, so that box socket paths under it stay within the limit.
	root, err := os.MkdirTemp("", "cbp-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(root)
	b := &pipelineBench{o: o, rep: newBenchReport("pipeline"), root: root, peers: map[string]scenarioSamples{},
		makeDirs: map[string]string{}, first: map[string][]time.Duration{}, apiRun: map[string][]time.Duration{}, apiServe: map[string][]time.Duration{}}
	b.rep.note("csv rerun: the stages of %s (keep, summarize) after the threshold cell (make: the threshold file) flips between 50 and 100, with memoization off (`cache: false`) so that every change reruns them, as under make. cellbox: `cellbox run`'s runtime, backend and sandbox service in this process, from Runtime.Set of the cell until Runtime.Wait returns (the results are in their cells); before each change the bench waits, untimed, until run's warm pool (which grows with use, to %d boxes) is full again, as when changes come slower than it refills.", o.example, server.RunPool)
	b.rep.note("one stage: an exec node running `true` with /workspace/in.txt bound to a cell; make: a rule from in.txt running `true` in the sandbox, then touching its target.")
	b.rep.note("nothing to do: `cellbox run PATTERN --once` over a data dir where the pattern is settled (a new process), against `make` with everything up to date.")
	b.rep.note("make + bwrap: bwrap with every namespace unshared, the host's /usr read-only and the folder bound at /workspace; make + docker run: `docker run --rm --network none --user` (this user) of %s with the host's /usr and the folder at /workspace. Each make is `make -s -C DIR` as a new process.", docker.HostImage)
	if err := b.writePatterns(); err != nil {
		return b.rep, err
	}
	peers := []string{peerPlain}
	if slices.Contains(o.backends, "local") {
		peers = append(peers, peerBwrap)
	}
	// make + docker run needs the host image, which the docker backend
	// imports on first use: measure cellbox first.
	for _, be := range o.backends {
		if err := b.cellbox(ctx, be); err != nil {
			return b.rep, fmt.Errorf("cellbox on the %s backend: %w", be, err)
		}
	}
	if slices.Contains(o.backends, "docker") {
		peers = append(peers, peerDocker)
		if err := b.rep.noteDocker(ctx); err != nil {
			return b.rep, err
		}
	}
	for _, peer := range peers {
		if err := b.makePeer(ctx, peer); err != nil {
			return b.rep, fmt.Errorf("%s: %w", peer, err)
		}
	}
	b.rows()
	// The cold path (issue 23): rows of their own, in interleaved rounds.
	b.rep.note("first full run: `cellbox run %s --once` (the example as shipped, memoization on: a fresh data dir holds no memo, so every stage runs, checked in its final cells) over a fresh data dir each round, a new process, until it exits; nothing may be left behind (box directories, mounts, containers of its instance); against `make` from clean (the three targets removed, untimed). Interleaved: each round runs every backend and every peer once.", b.o.example)
	b.rep.note("csv rerun through the HTTP API: the same change as the csv rerun, sent as `PUT /v1/cells/csv-pipeline/threshold` (server key) to a `cellbox serve --pool %d` process (the pattern loaded with `POST /v1/patterns`) and to a `cellbox run` process of the pattern, from the PUT until summarize's new result arrives on a watch (`GET /v1/watch`) opened before; interleaved rounds, each first waiting (untimed) until the warm pools of both processes are full (`/metrics`), so that neither's refill competes with the other's rerun.", servePool)
	if err := b.firstRuns(ctx, peers); err != nil {
		return b.rep, fmt.Errorf("first full run: %w", err)
	}
	b.firstRows(peers)
	for _, be := range o.backends {
		if err := b.serveRerun(ctx, be); err != nil {
			return b.rep, fmt.Errorf("csv rerun under cellbox serve on the %s backend: %w", be, err)
		}
	}
	b.serveRows()
	return b.rep, nil
}

// writePatterns writes the two patterns cellbox runs.
func (b *pipelineBench) writePatterns() error {
	b.csv, b.stage = filepath.Join(b.root, "csv"), filepath.Join(b.root, "stage")
	if err := copyExample(b.o.example, b.csv); err != nil {
		return err
	}
	yaml, err := os.ReadFile(filepath.Join(b.csv, patterns.FileName))
	if err != nil {
		return err
	}
	const execLine = "\n    exec:\n"
	if strings.Count(string(yaml), execLine) != 3 {
		return fmt.Errorf("%s: want the three exec stages of csv-pipeline (%q lines), found %d", filepath.Join(b.o.example, patterns.FileName), strings.TrimSpace(execLine), strings.Count(string(yaml), execLine))
	}
	yaml = []byte(strings.ReplaceAll(string(yaml), execLine, execLine+"      cache: false\n"))
	if err := os.WriteFile(filepath.Join(b.csv, patterns.FileName), yaml, 0o644); err != nil {
		return err
	}
	if err := os.Mkdir(b.stage, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(b.stage, patterns.FileName), []byte(`name: bench-stage
cells:
  x:
    value: "0"
nodes:
  stage:
    exec:
      command: "true"
      cache: false
      files:
        /workspace/in.txt: ${x}
`), 0o644)
}

// copyExample copies the files of the example's folder into dir.
func copyExample(src, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// cellbox measures the three scenarios under `cellbox run` on backend be.
func (b *pipelineBench) cellbox(ctx context.Context, be string) error {
	data := filepath.Join(b.root, "data-"+be)
	// The agent `cellbox run` would give its boxes: cellbox-agent beside
	// cellbox when it is of the same source (server.AgentBinary).
	agent := cmp.Or(server.AgentBeside(b.o.agentBinary, nil), b.o.agentBinary)
	r, err := server.Open(ctx, server.RunConfig(data, be, agent, benchLogger()))
	if err != nil {
		return fmt.Errorf("%w (pick the backends to measure with --backend)", err)
	}
	s := scenarioSamples{backend: be}
	err = func() error {
		defer r.Close()
		rt := r.Host.Runtime()
		// load loads a pattern folder and waits for its first run.
		load := func(dir string) (*patterns.Pattern, error) {
			p, err := patterns.Load(dir)
			if err != nil {
				return nil, err
			}
			if _, err := r.Host.API().Load(ctx, p, runapi.LoadOptions{Space: runapi.DefaultSpace, Name: p.Name, Source: dir}); err != nil {
				return nil, err
			}
			return p, rt.Wait(ctx)
		}
		// change sets a cell and waits until the runtime is idle again,
		// then checks that node produced a new value with no error.
		change := func(p *patterns.Pattern, cell string, v json.RawMessage, node string) (time.Duration, error) {
			addr := cells.Address{Space: runapi.DefaultSpace, Pattern: p.Name, Name: node}
			before, err := r.State.Cells.Get(ctx, addr)
			if err != nil {
				return 0, err
			}
			d, err := timed(func() error {
				if err := rt.Set(ctx, cells.Address{Space: runapi.DefaultSpace, Pattern: p.Name, Name: cell}, v); err != nil {
					return err
				}
				return rt.Wait(ctx)
			})
			if err != nil {
				return 0, err
			}
			after, err := r.State.Cells.Get(ctx, addr)
			switch {
			case err != nil:
				return 0, err
			case after.Error != "":
				return 0, fmt.Errorf("node %s failed: %s", node, after.Error)
			case after.Version == before.Version:
				return 0, fmt.Errorf("node %s did not run after %s = %s", node, cell, v)
			}
			return d, nil
		}
		// warm waits (untimed) until the run's warm pool, grown by the
		// runs so far, is full again, as in a run whose changes come
		// slower than its pool refills.
		warm := func() error {
			svc, _, err := r.Sandboxes.Get(ctx)
			if err != nil {
				return err
			}
			wctx, cancel := context.WithTimeout(ctx, benchPoolWait)
			defer cancel()
			for poolReady(svc) < server.RunPool {
				select {
				case <-wctx.Done():
					return fmt.Errorf("the warm pool did not fill to %d boxes in %s", server.RunPool, benchPoolWait)
				case <-time.After(5 * time.Millisecond):
				}
			}
			return nil
		}
		csv, err := load(b.csv)
		if err != nil {
			return fmt.Errorf("first run of the csv pipeline: %w", err)
		}
		if s.rerun, err = b.loop(ctx, func(i int) (time.Duration, error) {
			if err := warm(); err != nil {
				return 0, err
			}
			return change(csv, "threshold", thresholdOf(i), "summarize")
		}); err != nil {
			return fmt.Errorf("csv rerun: %w", err)
		}
		stage, err := load(b.stage)
		if err != nil {
			return fmt.Errorf("first run of the one-stage pattern: %w", err)
		}
		s.one, err = b.loop(ctx, func(i int) (time.Duration, error) {
			if err := warm(); err != nil {
				return 0, err
			}
			return change(stage, "x", json.RawMessage(strconv.Quote(strconv.Itoa(i+2))), "stage")
		})
		return err
	}()
	if err != nil {
		return err
	}
	// Nothing to do: a new `cellbox run --once` process over the settled
	// data dir.
	run := []string{b.o.agentBinary, "run", b.csv, "--once", "--data", data, "--backend", be}
	if s.noop, err = b.loop(ctx, func(int) (time.Duration, error) { return timedCmd(ctx, run...) }); err != nil {
		return fmt.Errorf("nothing to do: %w", err)
	}
	b.cellboxRuns = append(b.cellboxRuns, s)
	return nil
}

// poolReady is the number of warm boxes ready in svc.
func poolReady(svc *sandbox.Service) int {
	n := 0
	for _, c := range svc.Metrics().PoolReady {
		n += c.N
	}
	return n
}

// thresholdOf is the threshold of iteration i: 100 and 50 in turn (100
// for the warm-up, -1: the patterns start at 50), each a different set of
// kept rows.
func thresholdOf(i int) json.RawMessage {
	if i%2 != 0 {
		return json.RawMessage("100")
	}
	return json.RawMessage("50")
}

// loop runs a measurement once to warm up, then o.n times.
func (b *pipelineBench) loop(ctx context.Context, fn func(i int) (time.Duration, error)) ([]time.Duration, error) {
	if _, err := fn(-1); err != nil {
		return nil, err
	}
	return benchLoop(ctx, b.o.n, b.o.budget, fn)
}

// The make peers' Makefiles. RUN is the sandbox's command prefix, W the
// folder's path as the command sees it. make runs each command as a new
// process, as a user's Makefile would.
const (
	csvMakefile = `all: summary.json
clean.csv: raw.csv clean.py
	$(RUN) /usr/bin/python3 $(W)/clean.py $(W)/raw.csv $(W)/clean.csv
big.csv: clean.csv keep.py threshold
	$(RUN) /usr/bin/python3 $(W)/keep.py $(W)/clean.csv $(W)/big.csv --min $$(cat threshold)
summary.json: big.csv summarize.py
	$(RUN) /usr/bin/python3 $(W)/summarize.py $(W)/big.csv $(W)/summary.json
`
	stageMakefile = `out: in.txt
	$(RUN) true
	touch out
`
)

// peerPrefix is the RUN and W of a peer's Makefile for folder dir.
func peerPrefix(peer, dir string) (run, w string) {
	switch peer {
	case peerBwrap:
		return strings.Join(bwrapArgv("--bind", dir, "/workspace"), " ") + " --", "/workspace"
	case peerDocker:
		// As this user, who owns dir (the image's default user may not).
		user := fmt.Sprintf("%d:%d", os.Getuid(), os.Getgid())
		return "docker run --rm --network none --user " + user + " -v /usr:/usr:ro -v " + dir + ":/workspace " + docker.HostImage, "/workspace"
	}
	return "", dir
}

// makePeer measures the three scenarios under make with peer's sandbox.
func (b *pipelineBench) makePeer(ctx context.Context, peer string) error {
	slug := strings.NewReplacer(" ", "", ",", "-", "+", "-").Replace(peer)
	csvDir, stageDir := filepath.Join(b.root, "make-csv-"+slug), filepath.Join(b.root, "make-stage-"+slug)
	b.makeDirs[peer] = csvDir
	if err := copyExample(b.o.example, csvDir); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(csvDir, "data.csv"), filepath.Join(csvDir, "raw.csv")); err != nil {
		return err
	}
	if err := os.Mkdir(stageDir, 0o755); err != nil {
		return err
	}
	for dir, mk := range map[string]string{csvDir: csvMakefile, stageDir: stageMakefile} {
		run, w := peerPrefix(peer, dir)
		text := "RUN = " + run + "\nW = " + w + "\n" + mk
		if err := os.WriteFile(filepath.Join(dir, "Makefile"), []byte(text), 0o644); err != nil {
			return err
		}
	}
	write := func(path, text string) error { return os.WriteFile(path, []byte(text), 0o644) }
	if err := errors.Join(write(filepath.Join(csvDir, "threshold"), "50\n"), write(filepath.Join(stageDir, "in.txt"), "0")); err != nil {
		return err
	}
	mk := func(dir string) (time.Duration, error) { return timedCmd(ctx, "make", "-s", "-C", dir) }
	// change writes an input file and runs make, which must remake target.
	// It first waits (untimed) for the file clock to move on: file times
	// come from a coarse clock (a few ms), and an input written in the
	// same tick as the target was made looks no newer to make.
	change := func(dir, input, text, target string) (time.Duration, error) {
		before, err := os.Stat(filepath.Join(dir, target))
		if err != nil {
			return 0, err
		}
		time.Sleep(20 * time.Millisecond)
		if err := write(filepath.Join(dir, input), text); err != nil {
			return 0, err
		}
		d, err := mk(dir)
		if err != nil {
			return 0, err
		}
		after, err := os.Stat(filepath.Join(dir, target))
		if err == nil && !after.ModTime().After(before.ModTime()) {
			err = fmt.Errorf("make in %s did not remake %s after %s changed", dir, target, input)
		}
		return d, err
	}
	if _, err := mk(csvDir); err != nil { // the first, full runs
		return err
	}
	if _, err := mk(stageDir); err != nil {
		return err
	}
	rerun, err := b.loop(ctx, func(i int) (time.Duration, error) {
		return change(csvDir, "threshold", string(thresholdOf(i))+"\n", "summary.json")
	})
	if err != nil {
		return fmt.Errorf("csv rerun: %w", err)
	}
	one, err := b.loop(ctx, func(i int) (time.Duration, error) {
		return change(stageDir, "in.txt", strconv.Itoa(i+2), "out")
	})
	if err != nil {
		return fmt.Errorf("one stage: %w", err)
	}
	noop, err := b.loop(ctx, func(int) (time.Duration, error) { return mk(csvDir) })
	if err != nil {
		return fmt.Errorf("nothing to do: %w", err)
	}
	b.peers[peer] = scenarioSamples{backend: peer, rerun: rerun, one: one, noop: noop}
	return nil
}

// rows writes the report's rows: per backend, cellbox beside make with the
// backend's sandbox, and that make beside make with no sandbox.
func (b *pipelineBench) rows() {
	p50 := func(s []time.Duration) time.Duration { v, _, _ := percentiles(s); return v }
	plain := b.peers[peerPlain]
	for _, c := range b.cellboxRuns {
		peer := peerBwrap
		if c.backend == "docker" {
			peer = peerDocker
		}
		m := b.peers[peer]
		rerunTarget := time.Duration(targetRerunRatio[c.backend] * float64(p50(m.rerun)))
		b.rep.add(c.backend, scRerun+", `cellbox run`", c.rerun, peer, p50(m.rerun), rerunTarget)
		b.rep.add(c.backend, scRerun+", "+peer, m.rerun, peerPlain, p50(plain.rerun), 0)
		b.rep.add(c.backend, scTrue+", `cellbox run`", c.one, peer, p50(m.one), p50(plain.one)+targetStageOverhead[c.backend])
		b.rep.add(c.backend, scTrue+", "+peer, m.one, peerPlain, p50(plain.one), 0)
		b.rep.add(c.backend, scNoop+", `cellbox run --once`", c.noop, "`make`, "+scNoop, p50(plain.noop), targetNoop)
	}
}
