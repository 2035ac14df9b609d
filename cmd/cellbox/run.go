package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/fsnotify/fsnotify"

	"github.com/cellbox/cellbox/builtins"
	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/patterns"
	"github.com/cellbox/cellbox/runtime"
	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/server"
	"github.com/cellbox/cellbox/server/runapi"
)

func init() {
	register(command{
		name:  "run",
		usage: "PATTERN [--data DIR] [--once] [--backend auto|docker|docker-remote|kubernetes|local] [--addr 127.0.0.1:PORT]  run a pattern and show its cells and nodes (and its boxes' preview URLs) as they change",
		run:   runRun,
	})
}

// runLogFile, in the data directory, is the log of `cellbox run`.
const runLogFile = "run.log"

func runRun(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	data := fs.String("data", server.DefaultDataDir(), "data directory: cell store, box state and directories (a restarted run over it resumes)")
	once := fs.Bool("once", false, "run until nothing is left to do, print the final cells and exit (non-zero if a node failed)")
	backendName := addBackendFlag(fs, "box backend `name`: docker, docker-remote (an engine on another machine, DOCKER_HOST), kubernetes (pods of a cluster, KUBECONFIG; docs/kubernetes.md), local (bubblewrap), or auto (docker if an engine answers, else local)")
	addr := fs.String("addr", "127.0.0.1:0", "serve preview URLs, the tool API and the runtime API over HTTP on this address (port 0: a free one)")
	httpOpts := server.AddHTTPFlags(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := needCluster(*backendName, false); err != nil {
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
	// A new data dir: the first run runs every stage (expectExecBoxes).
	_, statErr := os.Stat(filepath.Join(dataDir, sandbox.StateFile))
	fresh := errors.Is(statErr, os.ErrNotExist)
	server.RememberSchemas(dataDir) // before the pattern's cell schemas compile
	p, err := patterns.Load(source)
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(dataDir, runLogFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open log: %w", err)
	}
	defer logf.Close()
	log := slog.New(slog.NewTextHandler(logf, &slog.HandlerOptions{Level: logLevel()}))
	slog.SetDefault(log) // the backend and the sandbox log there too, not over the view
	cfg := server.RunConfig(dataDir, *backendName, "", log)
	cfg.HTTP = *httpOpts
	// --once exits when the run is done: its pool makes the boxes of the
	// stages it expects (expectExecBoxes) and no refill after them.
	cfg.Sandbox.PoolBurstsOnly = *once
	r, err := server.Open(ctx, cfg)
	if err != nil {
		return err
	}
	defer r.Close()
	host, store := r.Host, r.State.Cells
	expectExecBoxes(ctx, host.Sandboxes(), p, fresh)

	tty := isTerminal(os.Stdout)
	progress := io.Writer(os.Stdout)
	if *once && !tty {
		progress = os.Stderr // stdout is for the final cells
	}
	v := newView(host.Runtime(), store, p, progress, tty)
	finishView := v.start()

	// The base URL of previews is set before the pattern's sandbox nodes
	// open and ask for theirs.
	ep, err := host.ServeTCP(*addr)
	if err != nil {
		finishView()
		return err
	}
	base := ep.URL
	inst, err := host.API().Load(ctx, p, runapi.LoadOptions{Space: runapi.DefaultSpace, Name: p.Name, Source: source})
	if err != nil {
		finishView()
		return err
	}
	sock, err := host.ServeUnix()
	if err != nil {
		finishView()
		return err
	}
	pageKey := ep.Key
	if *once { // its output goes to CI logs, and the page lives seconds
		where := host.KeyPath()
		if os.Getenv(server.KeyEnv) != "" {
			where = "$" + server.KeyEnv
		}
		pageKey = "KEY (the server key, in " + where + ")"
	}
	fmt.Fprintf(os.Stderr, "cellbox run: %s/%s from %s (backend %s, data %s)\n  page: %s/#token=%s · API: %s (server key needed) · runtime API: unix:%s · log: %s\n",
		inst.Space, inst.Name, source, *backendName, dataDir, base, pageKey, base, sock, filepath.Join(dataDir, runLogFile))
	if ep.KeyCreated {
		fmt.Fprintf(os.Stderr, "  made a server key (kept 0600 in %s; clients of this data dir read it there)\n", host.KeyPath())
	}
	if !*once {
		fmt.Fprintf(os.Stderr, "  change a cell: cellbox cell set%s NAME JSON · stop: Ctrl-C (boxes sleep, a new run resumes them) · throw the boxes away: cellbox stop %s%s\n", dataFlag(*data), inst.Name, dataFlag(*data))
	}
	v.loaded() // the live view starts drawing below these lines
	if !*once {
		go watchPattern(ctx, patternFile(source), log, func() { reloadPattern(ctx, host.API(), v, source, inst.Name) })
	}

	if *once {
		err := host.Runtime().Wait(ctx)
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
		return errors.Join(printFinal(os.Stdout, store, host.Runtime(), p, inst, pos[0], *data), serversErr)
	}
	select {
	case <-ctx.Done():
	case err := <-ep.Stopped:
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

// expectExecBoxes tells the sandbox service how many exec boxes of each
// image the pattern's first run may take, one stage after another: when
// the first stage takes its box, the boxes of the later ones are made
// beside its run rather than each after the stage before it. A run with
// nothing to do takes none, and nothing is made. Over a fresh data dir
// every stage runs: the boxes are begun at once, the first made while the
// pattern loads (a pattern whose stages all wait on cells nobody set
// makes them for nothing).
func expectExecBoxes(ctx context.Context, boxes *server.Sandboxes, p *patterns.Pattern, fresh bool) {
	n := map[string]int{}
	for _, nd := range p.Nodes {
		x := nd.Exec
		if x == nil || x.Network != nil || !(x.Image.IsZero() || x.Image.Kind == patterns.ValueLiteral) {
			continue // a box with a network, or an image known only when it runs, is never pooled
		}
		n[x.Image.Text]++
	}
	for image, k := range n {
		boxes.ExpectBoxes(image, k)
	}
	if fresh && len(n) > 0 {
		boxes.BeginBoxes(ctx)
	}
}

// logLevelEnv sets the level of run.log: debug adds where each exec
// run's time goes (create, upload, commands, outputs).
const logLevelEnv = "CELLBOX_LOG_LEVEL"

func logLevel() slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(os.Getenv(logLevelEnv))); err != nil {
		return slog.LevelInfo
	}
	return l
}

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
	if data == server.DefaultDataDir() {
		return ""
	}
	return " --data " + data
}

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
