package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"

	"github.com/fsnotify/fsnotify"
	bolt "go.etcd.io/bbolt"

	"github.com/cellbox/cellbox/builtins"
	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/internal/jsonschema"
	"github.com/cellbox/cellbox/patterns"
	"github.com/cellbox/cellbox/runtime"
	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/state"
	"github.com/cellbox/cellbox/server/runapi"
)

func init() {
	register(command{
		name:  "run",
		usage: "PATTERN [--data DIR] [--once] [--backend auto|docker|docker-remote|local] [--addr 127.0.0.1:PORT]  run a pattern and show its cells and nodes (and its boxes' preview URLs) as they change",
		run:   runRun,
	})
}

// Files of the data directory the runtime uses. The sandbox service keeps
// its own state in cellbox.db beside them: bbolt locks a file for one
// process, so the two stores are separate files.
const (
	runSocketFile = "run.sock" // the runtime API of the process that holds DATA/cellbox.db
	runLogFile    = "run.log"  // the log of `cellbox run`
)

func runRun(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	data := fs.String("data", defaultDataDir(), "data directory: cell store, box state and directories (a restarted run over it resumes)")
	once := fs.Bool("once", false, "run until nothing is left to do, print the final cells and exit (non-zero if a node failed)")
	backendName := addBackendFlag(fs, "box backend `name`: docker, docker-remote (an engine on another machine, DOCKER_HOST), local (bubblewrap), or auto (docker if an engine answers, else local)")
	addr := fs.String("addr", "127.0.0.1:0", "serve preview URLs, the tool API and the runtime API over HTTP on this address (port 0: a free one)")
	httpOpts := addHTTPFlags(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("want one PATTERN (a folder holding %s, or a .yaml file), got %d arguments", patterns.FileName, len(pos))
	}
	source, err := filepath.Abs(pos[0])
	if err != nil {
		return err
	}
	if err := patternsUnder("run", pos[0], source); err != nil {
		return err
	}
	dataDir, err := filepath.Abs(*data)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	rememberSchemas(dataDir) // before the pattern's cell schemas compile
	p, err := patterns.Load(source)
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(dataDir, runLogFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open log: %w", err)
	}
	defer logf.Close()
	log := slog.New(slog.NewTextHandler(logf, nil))
	slog.SetDefault(log) // openBackend and the sandbox log there too, not over the view
	r, err := openRun(ctx, runConfig{dataDir: dataDir, backend: *backendName, log: log})
	if err != nil {
		return err
	}
	defer r.close()
	host, store := r.host, r.state.cells
	host.opts = *httpOpts

	tty := isTerminal(os.Stdout)
	progress := io.Writer(os.Stdout)
	if *once && !tty {
		progress = os.Stderr // stdout is for the final cells
	}
	v := newView(host.rt, store, p, progress, tty)
	finishView := v.start()

	// The base URL of previews is set before the pattern's sandbox nodes
	// open and ask for theirs.
	base, key, created, stopped, err := host.serveHTTP(*addr)
	if err != nil {
		finishView()
		return err
	}
	inst, err := host.api.Load(ctx, p, runapi.LoadOptions{Space: runapi.DefaultSpace, Name: p.Name, Source: source})
	if err != nil {
		finishView()
		return err
	}
	sock, err := host.serve()
	if err != nil {
		finishView()
		return err
	}
	pageKey := key
	if *once { // its output goes to CI logs, and the page lives seconds
		where := keyPathOf(host)
		if os.Getenv(keyEnv) != "" {
			where = "$" + keyEnv
		}
		pageKey = "KEY (the server key, in " + where + ")"
	}
	fmt.Fprintf(os.Stderr, "cellbox run: %s/%s from %s (backend %s, data %s)\n  page: %s/#token=%s · API: %s (server key needed) · runtime API: unix:%s · log: %s\n",
		inst.Space, inst.Name, source, *backendName, dataDir, base, pageKey, base, sock, filepath.Join(dataDir, runLogFile))
	if created {
		fmt.Fprintf(os.Stderr, "  made a server key (kept 0600 in %s; clients of this data dir read it there)\n", keyPathOf(host))
	}
	if !*once {
		fmt.Fprintf(os.Stderr, "  change a cell: cellbox cell set%s NAME JSON · stop: Ctrl-C (boxes sleep, a new run resumes them) · throw the boxes away: cellbox stop %s%s\n", dataFlag(*data), inst.Name, dataFlag(*data))
	}
	v.loaded() // the live view starts drawing below these lines
	if !*once {
		go watchPattern(ctx, patternFile(source), log, func() { reloadPattern(ctx, host.api, v, source, inst.Name) })
	}

	if *once {
		err := host.rt.Wait(ctx)
		finishView()
		if ctx.Err() != nil {
			return errors.New("interrupted before the pattern settled; a new run over the same data dir resumes it")
		}
		if err != nil {
			return err
		}
		serversErr := waitServers(ctx, store, p, inst, serverReadyTimeout)
		if ctx.Err() != nil {
			finishView()
			return errors.New("interrupted before the pattern's servers were up; a new run over the same data dir resumes it")
		}
		return errors.Join(printFinal(os.Stdout, store, host.rt, p, inst, pos[0], *data), serversErr)
	}
	select {
	case <-ctx.Done():
	case err := <-stopped:
		finishView()
		return fmt.Errorf("serve %s: %w", base, err)
	}
	signal.Reset(os.Interrupt, syscall.SIGTERM) // a second Ctrl-C quits at once
	finishView()
	fmt.Fprintln(os.Stderr, "cellbox run: stopping (Ctrl-C again to quit at once)")
	return nil
}

// patternFile is the file a pattern is read from: source itself, or its
// pattern.yaml.
func patternFile(source string) string {
	if st, err := os.Stat(source); err == nil && st.IsDir() {
		return filepath.Join(source, patterns.FileName)
	}
	return source
}

// reloadDebounce is how long a pattern file must be still after a change
// before it is read again: an editor's save is several events.
const reloadDebounce = 150 * time.Millisecond

// watchPattern calls reload whenever file changes, until ctx ends, as a
// dev server (air, nodemon, Vite) reloads on a save: its directory is
// watched, so that an editor's save by rename counts too.
func watchPattern(ctx context.Context, file string, log *slog.Logger, reload func()) {
	w, err := fsnotify.NewWatcher()
	if err == nil {
		err = w.Add(filepath.Dir(file))
	}
	if err != nil {
		log.Warn("cannot watch the pattern file: an edit will not reload it", "file", file, "err", err)
		fmt.Fprintf(os.Stderr, "cellbox run: cannot watch %s (%v): edits take effect at the next run\n", file, err)
		if w != nil {
			w.Close()
		}
		return
	}
	defer w.Close()
	var settle <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if filepath.Clean(ev.Name) == file && ev.Op&(fsnotify.Write|fsnotify.Create|fsnotify.Rename) != 0 {
				settle = time.After(reloadDebounce)
			}
		case err, ok := <-w.Errors:
			if ok {
				log.Warn("watching the pattern file", "file", file, "err", err)
			}
		case <-settle:
			settle = nil
			reload()
		}
	}
}

// reloadPattern reads the pattern at source again and reloads instance
// name with it (runapi.Server.Reload), saying in the view what came of
// it: a version that does not load leaves the running one as it is.
func reloadPattern(ctx context.Context, api *runapi.Server, v *view, source, name string) {
	p, err := patterns.Load(source)
	if err != nil {
		v.reloaded(nil, fmt.Sprintf("%s changed, but it does not load; the pattern runs on as it was: %v", patternFile(source), oneLine(err.Error())))
		return
	}
	if _, err := api.Reload(ctx, name, p); err != nil {
		v.reloaded(nil, fmt.Sprintf("%s changed, but it does not load; the pattern runs on as it was: %v", patternFile(source), oneLine(err.Error())))
		return
	}
	// The cells the new version started anew come as reset lines.
	v.reloaded(p, fmt.Sprintf("reloaded %s (edited)", patternFile(source)))
}

// serverReadyTimeout bounds how long `run --once` waits for a sandbox
// node's start: server to come up.
const serverReadyTimeout = 2 * time.Minute

// serverSettle is how long a server that declares no readiness (no port,
// no ready command) must run before `run --once` counts it as up.
const serverSettle = time.Second

// waitServers waits, for `run --once`, until the start: server of every
// sandbox node of p is up — ready (its port or ready command answered), or
// running when it declares no readiness — and fails naming each that
// exited before it was (a server that crash-loops: the run used to exit 0
// at once) or was not up within timeout, with the tail of its output.
func waitServers(ctx context.Context, store cells.Store, p *patterns.Pattern, inst runapi.Instance, timeout time.Duration) error {
	var names []string
	for _, n := range p.Nodes {
		if n.Sandbox != nil && n.Sandbox.Start != nil {
			names = append(names, n.Name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		var failed, waiting []string
		for _, name := range names {
			var o struct {
				Status string                 `json:"status"`
				Error  string                 `json:"error"`
				Server *builtins.ServerStatus `json:"server"`
			}
			c, err := store.Get(ctx, cells.Address{Space: inst.Space, Pattern: inst.Name, Name: name})
			if err == nil {
				err = json.Unmarshal(c.Value, &o)
			}
			sv := o.Server
			switch {
			case err != nil:
				failed = append(failed, fmt.Sprintf("node %s: read its server's state: %v", name, err))
			case o.Error != "" && sv == nil:
				failed = append(failed, fmt.Sprintf("node %s (sandbox): %s", name, oneLine(o.Error)))
			case sv == nil || sv.State == builtins.ServerStarting:
				waiting = append(waiting, name)
			case sv.State == builtins.ServerReady:
			case sv.State == builtins.ServerRunning && sv.Restarts == 0:
				// Nothing says when it is ready: it counts as up once it
				// has run a moment without exiting.
				if sv.Started == nil || time.Since(*sv.Started) < serverSettle {
					waiting = append(waiting, name)
				}
			default: // exited, in backoff, stopped, or running again after an exit
				why := sv.State
				if sv.ExitCode != nil {
					why = fmt.Sprintf("exited with %d", *sv.ExitCode)
				}
				if sv.Error != "" {
					why += ": " + oneLine(sv.Error)
				}
				msg := fmt.Sprintf("node %s: its server (%s) did not come up: %s, %d restarts", name, oneLine(sv.Command), why, sv.Restarts)
				if tail := strings.TrimSpace(sv.Output); tail != "" {
					msg += "; its output ends: " + oneLine(tail[max(len(tail)-500, 0):])
				}
				failed = append(failed, msg)
			}
		}
		if len(failed) > 0 || len(waiting) == 0 {
			if len(failed) == 0 {
				return nil
			}
			return errors.New(strings.Join(failed, "\n  "))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the start: server of %s was not up within %s", strings.Join(waiting, ", "), timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// runPool is the most warm boxes `cellbox run` keeps.
const runPool = 2

// runConfig says how openRun sets up a run.
type runConfig struct {
	dataDir     string
	backend     string // docker, local or auto
	agentBinary string // "": this executable
	log         *slog.Logger
}

// runParts are what `cellbox run` (and `cellbox bench pipeline`, which
// measures it) runs a pattern on: the data directory's state, the
// sandboxes (the backend and the sandbox service, opened on first need)
// and the runtime host.
type runParts struct {
	state *dataState
	boxes *sandboxes
	host  *runtimeHost
}

// openRun opens the data directory's state (first: it is the lock that
// says this process owns the directory) and a runtime host over it whose
// backend and sandbox service open when a node first needs a box.
func openRun(ctx context.Context, cfg runConfig) (_ *runParts, err error) {
	r := &runParts{}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	if r.state, err = openState(cfg.dataDir); err != nil {
		return nil, err
	}
	r.boxes = lazySandboxes(r.state.cells, cfg.log, func(ctx context.Context) (*sandbox.Service, error) {
		be, err := openBackend(ctx, cfg.backend, cfg.dataDir)
		if err != nil {
			return nil, err
		}
		// Exec stages take fresh boxes from a warm pool of the default
		// image whose size follows their use: none until a stage runs, at
		// most runPool, shrinking again when the run is idle.
		return sandbox.New(ctx, sandbox.Config{Backend: be, DataDir: cfg.dataDir, State: r.state.sandbox,
			AgentBinary: cfg.agentBinary, Pool: map[string]int{backend.DefaultImage: runPool}, PoolFollowsUse: true, OneShot: builtins.IsExecBox,
			Logger: cfg.log})
	})
	if r.host, err = newRuntimeHost(cfg.dataDir, r.state.cells, r.boxes, cfg.log, false); err != nil {
		return nil, err
	}
	return r, nil
}

// close closes what openRun opened, in reverse order.
func (r *runParts) close() error {
	var errs []error
	if r.host != nil {
		errs = append(errs, r.host.close())
	}
	if r.boxes != nil {
		errs = append(errs, r.boxes.close())
	}
	if r.state != nil {
		errs = append(errs, r.state.Close())
	}
	return errors.Join(errs...)
}

// patternsUnder checks a folder given as PATTERN: one without a
// pattern.yaml (as `cellbox run examples`) is an error listing the
// patterns in its subfolders, each as the command that runs it.
func patternsUnder(command, arg, dir string) error {
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return nil // patterns.Load says what is wrong with it
	}
	if _, err := os.Stat(filepath.Join(dir, patterns.FileName)); err == nil {
		return nil
	}
	subs, _ := filepath.Glob(filepath.Join(dir, "*", patterns.FileName))
	if len(subs) == 0 {
		return fmt.Errorf("%s holds no %s, nor do its subfolders: give a pattern folder or a .yaml file", arg, patterns.FileName)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s is not a pattern (it holds no %s); the patterns in it:", arg, patterns.FileName)
	for _, f := range subs {
		fmt.Fprintf(&b, "\n  cellbox %s %s", command, filepath.Join(arg, filepath.Base(filepath.Dir(f))))
	}
	return errors.New(b.String())
}

// dataFlag is the --data flag to repeat in a hint, "" for the default.
func dataFlag(data string) string {
	if data == defaultDataDir() {
		return ""
	}
	return " --data " + data
}

// dataState is a data directory's one bbolt file (DATA/cellbox.db), open:
// the cell store lives in it, and the sandbox service keeps its sessions,
// boxes and snapshot records in it too (sandbox.Config.State).
type dataState struct {
	db      *bolt.DB
	cells   cells.Store
	sandbox state.Store
}

// openState opens (creating) DATA/cellbox.db; a file another process holds
// is a clear error: it is the lock that says which process owns the data
// directory.
func openState(dataDir string) (*dataState, error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	rememberSchemas(dataDir)
	path := filepath.Join(dataDir, sandbox.StateFile)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("data dir %s is in use: another cellbox run or serve holds %s (stop it, or use another --data)", dataDir, path)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	store, err := cells.OpenBoltDB(db, cells.Options{})
	if err != nil {
		db.Close()
		return nil, err
	}
	sandboxState, err := state.OpenBolt(context.Background(), db)
	if err != nil {
		store.Close()
		db.Close()
		return nil, err
	}
	return &dataState{db: db, cells: store, sandbox: sandboxState}, nil
}

// schemaCacheFile, in the data dir, names the cell schemas that passed the
// JSON Schema metaschema, so that the next process over the directory
// compiles them without that check (jsonschema.RememberValid).
const schemaCacheFile = "schemas.valid"

// rememberSchemas makes the schema cache of dataDir the process's.
func rememberSchemas(dataDir string) {
	jsonschema.RememberValid(filepath.Join(dataDir, schemaCacheFile))
}

// Close closes the stores, then the file.
func (d *dataState) Close() error {
	return errors.Join(d.sandbox.Close(), d.cells.Close(), d.db.Close())
}

// runtimeHost is a runtime over a cell store, its API, and the servers
// that serve the API (the unix socket DATA/run.sock; serveHTTP: an HTTP
// address, with the sandbox service).
type runtimeHost struct {
	dataDir  string
	rt       *runtime.Runtime
	api      *runapi.Server
	boxes    *sandboxes // the sandbox service and the runtime's session in it
	servers  []*http.Server
	sockPath string
	urlPath  string      // DATA/server.url, written by serveHTTP
	opts     httpOptions // of the HTTP server and its limits
	// teardowns are exec boxes being destroyed after their runs.
	teardowns *builtins.Teardowns
	// reqs is the context of every request of the servers, ended by
	// endReqs when close's grace runs out.
	reqs    context.Context
	endReqs context.CancelCauseFunc
	gone    sync.WaitGroup // removeBox calls
}

// errShuttingDown ends the requests still in flight when a stop's grace
// has run out: a tool call's command is killed and the call answered
// with this, rather than its connection cut with no answer.
var errShuttingDown = errors.New("the server is shutting down: the call was ended, its command stopped; call again once the server is back")

// newRuntimeHost starts a runtime over store whose exec and sandbox nodes
// drive boxes of boxes' session (kept in the store so that a restart
// finds its boxes again). persist: the API records loaded patterns for
// runapi.Server.Resume (cellbox serve).
func newRuntimeHost(dataDir string, store cells.Store, boxes *sandboxes, log *slog.Logger, persist bool) (*runtimeHost, error) {
	env := builtins.Env{Client: boxes.client(), Logger: log, Teardowns: &builtins.Teardowns{}}
	memoLimit, err := envSize(memoLimitEnv)
	if err != nil {
		return nil, err
	}
	h := &runtimeHost{dataDir: dataDir, boxes: boxes, teardowns: env.Teardowns}
	h.reqs, h.endReqs = context.WithCancelCause(context.Background())
	h.rt = runtime.New(store, runtime.Options{Logger: log, MemoLimit: memoLimit, OnGone: func(node cells.Address, builtin string) {
		if builtin == string(patterns.KindSandbox) {
			h.removeBox(env, log, node)
		}
	}})
	h.api = runapi.New(runapi.Config{Runtime: h.rt, Store: store, Env: env, Logger: log, Persist: persist})
	return h, nil
}

// removeBox destroys the box of a sandbox node its pattern no longer has
// (runtime.Options.OnGone), off the runtime's lock; close waits for it (a
// run --once may end right after the load that removed the node).
func (h *runtimeHost) removeBox(env builtins.Env, log *slog.Logger, node cells.Address) {
	h.gone.Add(1)
	go func() {
		defer h.gone.Done()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := builtins.SandboxGone(ctx, env, node); err != nil {
			log.Warn("remove a removed node's box", "node", node.String(), "error", err)
			return
		}
		log.Info("removed the box of a sandbox node the pattern no longer has", "node", node.String())
	}()
}

// memoLimitEnv caps the exec memo cache of run and serve (bytes, or with a
// unit: 512MiB, 2GiB); unset: runtime.DefaultMemoLimit.
const memoLimitEnv = "CELLBOX_MEMO_LIMIT"

// envSize reads a size from an environment variable (0 when unset).
func envSize(name string) (int64, error) {
	v := strings.TrimSpace(os.Getenv(name))
	if v == "" {
		return 0, nil
	}
	n, err := parseSize(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: %w", name, v, err)
	}
	return n, nil
}

// parseSize reads "1048576", "512KiB", "256MiB", "2GiB" (also KB, MB, GB
// as powers of 1000).
func parseSize(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return 0, errors.New("want a positive size in bytes, or with a unit: 512MiB, 2GiB")
	}
	return n * mult, nil
}

// runtimeSession returns the sandbox session the runtime's boxes live in:
// the one recorded in the store if the service still has it, else a new
// one, recorded.
func runtimeSession(ctx context.Context, store cells.Store, svc *sandbox.Service) (string, error) {
	const bucket, key = "cmd.cellbox", "sandbox.session"
	type rec struct{ ID, Token string }
	var r rec
	err := store.View(ctx, func(tx cells.Tx) error {
		if b, ok := tx.Meta(bucket).Get(key); ok {
			return json.Unmarshal(b, &r)
		}
		return nil
	})
	if err == nil && r.ID != "" {
		if _, err := svc.Authenticate(r.ID, r.Token); err == nil {
			return r.ID, nil
		}
	}
	r.ID, r.Token, err = svc.NewSession(ctx)
	if err != nil {
		return "", fmt.Errorf("create the runtime's sandbox session: %w", err)
	}
	b, _ := json.Marshal(r)
	err = store.Update(ctx, func(tx cells.Tx) error { return tx.Meta(bucket).Put(key, b) })
	if err != nil {
		return "", fmt.Errorf("record the runtime's sandbox session: %w", err)
	}
	return r.ID, nil
}

// serve serves the API on DATA/run.sock (replacing a socket a killed run
// left behind: this process holds the cell store, so no one else serves
// it). It returns the socket's path.
func (h *runtimeHost) serve() (string, error) {
	h.sockPath = filepath.Join(h.dataDir, runSocketFile)
	if err := os.Remove(h.sockPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("remove stale socket: %w", err)
	}
	ln, err := net.Listen("unix", h.sockPath)
	if err != nil {
		return "", fmt.Errorf("listen on %s: %w", h.sockPath, err)
	}
	if err := os.Chmod(h.sockPath, 0o600); err != nil {
		ln.Close()
		return "", err
	}
	h.start(ln, withBodyPace(h.opts.pace(), h.api)) // the socket's file mode is its guard
	return h.sockPath, nil
}

// endGrace bounds the answers of the requests a stop ended.
const endGrace = 3 * time.Second

// close stops the API servers (ending watches, letting other requests
// finish for up to --shutdown-grace, then ending them) and shuts the runtime down: runs in
// flight are cancelled and resume on the next start; patterns are not
// stopped, so sandbox boxes are kept, put to sleep (files kept, processes
// ended, disks unmounted) — every box, the tool API's sessions' too — and
// found again by the next start. Stopping a pattern (DELETE
// /v1/patterns/NAME, `cellbox stop NAME`) is what destroys its boxes.
func (h *runtimeHost) close() error {
	grace := cmp.Or(h.opts.shutdownGrace, defaultShutdownGrace)
	sctx, scancel := context.WithTimeout(context.Background(), grace)
	defer scancel()
	var left []*http.Server
	for _, srv := range h.servers {
		if srv.Shutdown(sctx) != nil {
			left = append(left, srv)
		}
	}
	if len(left) > 0 {
		// The grace is over: the calls still running are ended, and
		// answered so (a tool call's error result), before their
		// connections are closed.
		h.endReqs(errShuttingDown)
		ectx, ecancel := context.WithTimeout(context.Background(), endGrace)
		defer ecancel()
		for _, srv := range left {
			if srv.Shutdown(ectx) != nil {
				srv.Close()
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, p := range []string{h.sockPath, h.urlPath} {
		if p != "" {
			os.Remove(p)
		}
	}
	rterr := h.rt.Close(ctx)
	h.gone.Wait()
	twerr := h.teardowns.Wait(ctx)
	// The boxes get their own bound: a runtime slow to close does not
	// leave them running.
	bctx, bcancel := context.WithTimeout(context.Background(), sleepGrace)
	defer bcancel()
	return errors.Join(rterr, twerr, h.boxes.sleep(bctx))
}

// sleepGrace bounds putting the boxes to sleep at shutdown; a box not
// stopped by then is logged and left to the next start's reconcile.
const sleepGrace = 30 * time.Second

// printFinal prints an instance's cells (inputs, then node outputs, in
// declaration order; streams left out) and fails naming the nodes that
// stand failed, with their errors and how to run them again: those that
// failed in this run, and those whose failure an earlier run stored (a
// restarted runtime reports it, and runs the node again only when its
// inputs change).
func printFinal(w io.Writer, store cells.Store, rt *runtime.Runtime, p *patterns.Pattern, inst runapi.Instance, pattern, data string) error {
	prefix := inst.Space + "/" + inst.Name + "/"
	var names []string
	for _, c := range p.Cells {
		names = append(names, c.Name)
	}
	for _, n := range p.Nodes {
		names = append(names, n.Name)
	}
	for _, name := range names {
		c, err := store.Get(context.Background(), cells.Address{Space: inst.Space, Pattern: inst.Name, Name: name})
		if err != nil {
			return fmt.Errorf("read final value of %s: %w", name, err)
		}
		line := name + " = " + string(c.Value)
		if c.Error != "" {
			line += "  # error: " + oneLine(c.Error)
		}
		fmt.Fprintln(w, line)
	}
	infos := map[string]runtime.NodeInfo{}
	for _, n := range rt.Nodes() {
		if n.Addr.Prefix() == prefix {
			infos[n.Addr.Name] = n
		}
	}
	var failed, retry []string
	for _, n := range p.Nodes {
		info := infos[n.Name]
		if info.State != runtime.Error {
			continue
		}
		failed = append(failed, fmt.Sprintf("node %s (%s) failed: %s", n.Name, n.Kind, oneLine(info.Err)))
		if info.Shape == "async" {
			retry = append(retry, "cellbox retry "+n.Name+dataFlag(data))
		}
	}
	if len(failed) == 0 {
		return nil
	}
	if len(retry) > 0 {
		// An async node runs again only when its inputs change, or when
		// retried in a running process.
		failed = append(failed, fmt.Sprintf("to run it again as it stands: cellbox run %s%s (without --once), and while that runs: %s",
			pattern, dataFlag(data), strings.Join(retry, "; ")))
	}
	return errors.New(strings.Join(failed, "\n  "))
}

// oneLine is s on one line, its whitespace runs as single spaces and its
// control characters shown (printable): an error often quotes a box's
// output.
func oneLine(s string) string { return printable(strings.Join(strings.Fields(s), " ")) }

// printable shows the control characters of s (C0, DEL, C1) as escapes
// (\x1b): text from a box goes to the operator's terminal, where an
// escape sequence could clear the screen, retitle the window, fake lines
// or set the clipboard (OSC 52).
func printable(s string) string { return shown(s, unicode.IsControl) }

// printableLines is printable keeping line breaks and tabs: a model's text
// and a tool's result in `cellbox chat` (a prompt-injected model, or a
// box's output in a result, could send escape sequences too).
func printableLines(s string) string {
	return shown(s, func(r rune) bool { return r != '\n' && r != '\t' && unicode.IsControl(r) })
}

// shown replaces the runes of s that hide reports true for with \xNN.
func shown(s string, hide func(rune) bool) string {
	if !strings.ContainsFunc(s, hide) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if hide(r) {
			fmt.Fprintf(&b, "\\x%02x", r)
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// parseArgs parses flags anywhere among the arguments (`run PAT --once`)
// and returns the others. A negative number is an argument (`cell set x
// -1`); after "--" everything is.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			pos = append(pos, a)
			continue
		}
		if _, err := strconv.ParseFloat(a, 64); err == nil {
			pos = append(pos, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			continue // fs.Parse reports it
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !(ok && b.IsBoolFlag()) && i+1 < len(args) {
			flags = append(flags, args[i+1])
			i++
		}
	}
	if err := fs.Parse(flags); err != nil {
		return nil, err
	}
	return pos, nil
}
