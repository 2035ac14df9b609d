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
	"syscall"
	"time"

	"github.com/cellbox/cellbox/server"
	"github.com/cellbox/cellbox/server/runapi"
)

// Targets of the cold path (issue 23): the first full run as a share of
// make from clean with the backend's sandbox, and serve beside run on the
// same rerun.
var (
	targetFirstRatio = map[string]float64{"local": 1.5, "docker": 0.8}
	targetServeRatio = 1.0
)

// servePool is the warm pool of the `cellbox serve` the bench starts (the
// issue's `--pool 2`, as many as run's).
const servePool = server.RunPool

// Scenarios of the cold path.
const (
	scFirst = "first full run of the csv pipeline (3 stages)"
	scServe = "csv rerun after a threshold change (2 stages), through the HTTP API"
)

// firstRuns measures the first full run of the csv pipeline, interleaved:
// in each round `cellbox run --once` of the example as shipped over a
// fresh data dir on each backend (a new process), then make from clean
// (every target removed) under each peer. The make peers' folders are
// the ones makePeer wrote.
func (b *pipelineBench) firstRuns(ctx context.Context, peers []string) error {
	var fns []func(i int) (time.Duration, error)
	for _, be := range b.o.backends {
		fns = append(fns, func(i int) (time.Duration, error) { return b.firstRun(ctx, be, i) })
	}
	for _, peer := range peers {
		dir := b.makeDirs[peer]
		fns = append(fns, func(int) (time.Duration, error) {
			for _, t := range []string{"clean.csv", "big.csv", "summary.json"} {
				if err := os.Remove(filepath.Join(dir, t)); err != nil && !errors.Is(err, os.ErrNotExist) {
					return 0, err
				}
			}
			d, err := timedCmd(ctx, "make", "-s", "-C", dir)
			if err == nil {
				_, err = os.Stat(filepath.Join(dir, "summary.json"))
			}
			return d, err
		})
	}
	for _, fn := range fns { // once each, unmeasured: the page cache, the images
		if _, err := fn(-1); err != nil {
			return err
		}
	}
	samples, err := interleaved(ctx, b.o.n, b.o.budget, fns...)
	for k, be := range b.o.backends {
		b.first[be] = samples[k]
	}
	for k, peer := range peers {
		b.first[peer] = samples[len(b.o.backends)+k]
	}
	return err
}

// firstRun times `cellbox run --once` of the example over a fresh data
// dir on backend be, checks that every stage ran and that nothing was
// left behind (no box directory, no mount under the data dir, no Docker
// container of its instance), then removes the data dir (untimed).
func (b *pipelineBench) firstRun(ctx context.Context, be string, i int) (time.Duration, error) {
	data := filepath.Join(b.root, fmt.Sprintf("first-%s-%d", be, i+1))
	cmd := exec.CommandContext(ctx, b.o.agentBinary, "run", b.o.example, "--once", "--data", data, "--backend", be)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	d, err := timed(cmd.Run)
	if err != nil {
		return 0, fmt.Errorf("cellbox run --once on %s: %w: %s", be, err, lastBytes([]byte(errOut.String()), 500))
	}
	for _, want := range []string{"clean: kept", "keep: kept", "total", "report = "} {
		if !strings.Contains(out.String(), want) {
			return 0, fmt.Errorf("cellbox run --once on %s: no %q in its final cells (did every stage run?)", be, want)
		}
	}
	if err := leftBehind(ctx, data); err != nil {
		return 0, fmt.Errorf("after cellbox run --once on %s: %w", be, err)
	}
	return d, os.RemoveAll(data)
}

// lastBytes is the end of out, at most n bytes.
func lastBytes(out []byte, n int) string {
	if len(out) > n {
		out = append([]byte("…"), out[len(out)-n:]...)
	}
	return strings.TrimSpace(string(out))
}

// leftBehind fails if a run that exited left a box behind in data: a box
// directory, a mount under it, or a Docker container of its instance.
func leftBehind(ctx context.Context, data string) error {
	entries, err := os.ReadDir(filepath.Join(data, "boxes"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if len(entries) > 0 {
		return fmt.Errorf("%d box directories left in %s", len(entries), filepath.Join(data, "boxes"))
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	if strings.Contains(string(mounts), " "+data+"/") {
		return fmt.Errorf("a mount left under %s", data)
	}
	st, err := server.OpenState(data)
	if err != nil {
		return err
	}
	id, err := st.Sandbox.Instance(ctx)
	st.Close()
	if err != nil {
		return err
	}
	if _, err := exec.LookPath("docker"); err != nil {
		return nil
	}
	ids, err := exec.CommandContext(ctx, "docker", "ps", "-aq", "--filter", "label=cellbox.instance="+id).Output()
	if err != nil {
		return nil // no engine: no containers
	}
	if n := len(strings.Fields(string(ids))); n > 0 {
		return fmt.Errorf("%d containers of its instance %s left", n, id)
	}
	return nil
}

// apiServer is a `cellbox run` or `cellbox serve` process of the bench,
// driven through its HTTP API, with one watch of the csv pattern's cells
// open.
type apiServer struct {
	name    string
	cmd     *exec.Cmd
	exited  chan error
	data    string
	url     string
	key     string
	c       *runapi.Client
	pool    int // the warm boxes it keeps once used
	batches chan runapi.Batch
	// watchErr is why the watch ended, once batches is closed.
	watchErr error
	cancel   context.CancelFunc
}

// startAPIServer starts argv (a cellbox run or serve over data), waits
// until it serves its HTTP API and opens a watch of pattern's cells.
func (b *pipelineBench) startAPIServer(ctx context.Context, name, data string, argv []string, load string) (*apiServer, error) {
	logf, err := os.Create(filepath.Join(b.root, filepath.Base(data)+".out"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	s := &apiServer{name: name, data: data, exited: make(chan error, 1), batches: make(chan runapi.Batch, 64)}
	s.cmd = exec.Command(argv[0], argv[1:]...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { s.exited <- s.cmd.Wait() }()
	fail := func(err error) (*apiServer, error) {
		s.stop()
		out, _ := os.ReadFile(logf.Name())
		return nil, fmt.Errorf("%s: %w: %s", name, err, lastBytes(out, 500))
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for s.url == "" {
		// Written (not atomically) once it listens: read until whole.
		if u, err := os.ReadFile(filepath.Join(data, server.URLFile)); err == nil && strings.HasSuffix(string(u), "\n") {
			s.url = strings.TrimSpace(string(u))
			break
		}
		select {
		case err := <-s.exited:
			return fail(fmt.Errorf("exited: %v", err))
		case <-wctx.Done():
			return fail(fmt.Errorf("no %s after a minute", server.URLFile))
		case <-time.After(5 * time.Millisecond):
		}
	}
	if s.key = os.Getenv(server.KeyEnv); s.key == "" {
		if s.key, err = server.ReadKey(filepath.Join(data, server.KeyFile)); err != nil {
			return fail(err)
		}
	}
	s.c = runapi.NewClient(s.url).WithKey(s.key)
	if load != "" {
		if _, err := s.c.Load(wctx, load, "", ""); err != nil {
			return fail(err)
		}
	}
	var wctx2 context.Context
	wctx2, s.cancel = context.WithCancel(ctx)
	go func() {
		defer close(s.batches)
		// The full prefix: the watch may start before run has loaded the
		// pattern, when its bare name resolves to nothing.
		s.watchErr = s.c.Watch(wctx2, runapi.DefaultSpace+"/"+csvPattern, nil, func(bt runapi.Batch) error {
			select {
			case s.batches <- bt:
			case <-wctx2.Done():
			}
			return nil
		})
	}()
	// The first run: wait until summarize has a result.
	if _, err := s.waitNode(wctx, "summarize", 0); err != nil {
		return fail(fmt.Errorf("first run: %w", err))
	}
	return s, nil
}

// csvPattern is the csv-pipeline example's name, the prefix of its cells.
const csvPattern = "csv-pipeline"

// waitNode reads the watch until node has a settled value (not pending)
// of a version after since, and fails if it is an error.
func (s *apiServer) waitNode(ctx context.Context, node string, since uint64) (uint64, error) {
	addr := runapi.DefaultSpace + "/" + csvPattern + "/" + node
	for {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case bt, ok := <-s.batches:
			if !ok {
				return 0, fmt.Errorf("the watch ended: %v", s.watchErr)
			}
			for _, ch := range bt.Changes {
				c := ch.Cell
				if c.Address != addr || c.Version <= since {
					continue
				}
				var v struct {
					Pending bool            `json:"pending"`
					Result  json.RawMessage `json:"result"`
				}
				if json.Unmarshal(c.Value, &v) != nil || v.Pending || len(v.Result) == 0 || string(v.Result) == "null" {
					continue
				}
				if c.Error != "" {
					return 0, fmt.Errorf("node %s failed: %s", node, c.Error)
				}
				return c.Version, nil
			}
		}
	}
}

// rerun sets the threshold through the API and times it until summarize
// has its new result. Before, untimed, it waits until the warm pools of
// every process of the loop (all) are full again: a refill of one
// process's pool would otherwise compete with another's rerun.
func (s *apiServer) rerun(ctx context.Context, i int, all []*apiServer) (time.Duration, error) {
	for _, o := range all {
		if err := o.waitPool(ctx, o.pool); err != nil {
			return 0, err
		}
	}
	return timed(func() error {
		c, err := s.c.Set(ctx, csvPattern+"/threshold", thresholdOf(i))
		if err != nil {
			return err
		}
		_, err = s.waitNode(ctx, "summarize", c.Version)
		return err
	})
}

// waitPool waits until the server's warm pool holds want boxes.
func (s *apiServer) waitPool(ctx context.Context, want int) error {
	if err := waitPool(ctx, s.url, s.key, want); err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	return nil
}

// stop stops the pattern (its boxes destroyed), then the process (Ctrl-C),
// and waits for it.
func (s *apiServer) stop() error {
	var errs []error
	if s.c != nil {
		ctx, cancel := context.WithTimeout(context.Background(), benchCleanupLimit)
		errs = append(errs, s.c.Stop(ctx, csvPattern))
		cancel()
	}
	if s.cancel != nil {
		s.cancel()
	}
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-s.exited:
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.name, err))
		}
	case <-time.After(benchCleanupLimit):
		_ = s.cmd.Process.Kill()
		errs = append(errs, fmt.Errorf("%s did not stop in %s", s.name, benchCleanupLimit))
	}
	return errors.Join(errs...)
}

// serveRerun measures the csv rerun (memo off) through the HTTP API of a
// `cellbox serve --pool 2` process and of a `cellbox run` process on
// backend be, in interleaved rounds: the same client, the same change,
// the same wait for its result.
func (b *pipelineBench) serveRerun(ctx context.Context, be string) (err error) {
	runData, serveData := filepath.Join(b.root, "api-run-"+be), filepath.Join(b.root, "api-serve-"+be)
	run, err := b.startAPIServer(ctx, "cellbox run", runData,
		[]string{b.o.agentBinary, "run", b.csv, "--data", runData, "--backend", be, "--addr", "127.0.0.1:0"}, "")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, run.stop()) }()
	serve, err := b.startAPIServer(ctx, "cellbox serve", serveData,
		[]string{b.o.agentBinary, "serve", "--data", serveData, "--backend", be, "--addr", "127.0.0.1:0", "--pool", strconv.Itoa(servePool), "--agent-binary", b.o.agentBinary}, b.csv)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, serve.stop()) }()
	run.pool, serve.pool = server.RunPool, servePool
	all := []*apiServer{run, serve}
	fns := []func(i int) (time.Duration, error){
		func(i int) (time.Duration, error) { return run.rerun(ctx, i, all) },
		func(i int) (time.Duration, error) { return serve.rerun(ctx, i, all) },
	}
	if err := warmUp(fns...); err != nil {
		return err
	}
	samples, err := interleaved(ctx, b.o.n, b.o.budget, fns...)
	b.apiRun[be], b.apiServe[be] = samples[0], samples[1]
	return err
}

// peerOf is the make peer with backend be's sandbox.
func peerOf(be string) string {
	if be == "docker" {
		return peerDocker
	}
	return peerBwrap
}

// firstRows writes the first full runs' rows: cellbox on each backend
// beside make from clean with its sandbox, and each sandboxed make beside
// make alone.
func (b *pipelineBench) firstRows(peers []string) {
	p50 := func(s []time.Duration) time.Duration { v, _, _ := percentiles(s); return v }
	plain := p50(b.first[peerPlain])
	for _, be := range b.o.backends {
		peer := peerOf(be)
		m := p50(b.first[peer])
		b.rep.add(be, scFirst+", `cellbox run --once`, fresh data dir", b.first[be], peer+" from clean", m, time.Duration(targetFirstRatio[be]*float64(m)))
		b.rep.add(be, scFirst+", "+peer+" from clean", b.first[peer], peerPlain+" from clean", plain, 0)
	}
}

// serveRows writes the rows of the csv rerun through the HTTP API: serve
// beside run in the same loop, and run beside make with the backend's
// sandbox.
func (b *pipelineBench) serveRows() {
	p50 := func(s []time.Duration) time.Duration { v, _, _ := percentiles(s); return v }
	for _, be := range b.o.backends {
		run := p50(b.apiRun[be])
		peer := peerOf(be)
		b.rep.add(be, scServe+", `cellbox serve --pool "+strconv.Itoa(servePool)+"`", b.apiServe[be], "`cellbox run`, same loop", run, time.Duration(targetServeRatio*float64(run)))
		b.rep.add(be, scServe+", `cellbox run`", b.apiRun[be], peer, p50(b.peers[peer].rerun), 0)
	}
}
