package builtins

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/runtime"
	"github.com/cellbox/cellbox/sandbox/api"
)

// Limits of a sandbox node's history and commands.
const (
	// HistoryLimit is how many commands the history keeps; older ones are
	// counted in a leading {"dropped": N} entry.
	HistoryLimit = 100
	// HistoryOutputLimit caps stdout and stderr of one history entry.
	HistoryOutputLimit = 64 << 10
	// DefaultRunTimeout bounds a command of the run stream that sets no
	// timeout_ms: a command that never ends would hold up the stream.
	DefaultRunTimeout = 10 * time.Minute
	// watchRetry is the pause before re-establishing a file watch that
	// ended while the box lives.
	watchRetry = time.Second
)

// Sandbox statuses.
const (
	StatusStarting  = "starting"
	StatusRunning   = "running"
	StatusDestroyed = "destroyed"
	StatusError     = "error"
)

// SandboxSpec describes a sandbox node.
type SandboxSpec struct {
	// Node is the node's output cell address; the box is named after it
	// (sandbox-<pattern>.<node>), so a restarted runner finds it again.
	Node cells.Address
	// Image is the box image; nil or "" is the sandbox service's default.
	// It is read when the box is created.
	Image Field
	// Env holds the environment of the commands, formatted with Text and
	// read at each command.
	Env map[string]Field
	// Files binds paths in the box, continuously while the box lives: an
	// input is rewritten whenever its value changes, an output updates
	// files[path] whenever the file changes.
	Files map[string]File
	// Ports are TCP ports in the box (1-65535) whose preview URLs the node
	// publishes in previews while the box runs.
	Ports []int
}

// Sandbox is the sandbox node kind, a runtime.Service: a box that lives
// while its pattern runs.
//
// Output: {pending, status, box, error?, history, files, previews?}. status is
// starting, running, destroyed or error (error says why). history lists
// the commands run, oldest first, each {command, stdout, stderr,
// exit_code, started, duration_ms} (plus timed_out, truncated, error when
// they apply); it keeps the last HistoryLimit commands, stdout and stderr
// each capped at HistoryOutputLimit, and older entries are compacted into
// a leading {"dropped": N}. files maps each output path to its value
// (text: a string; json: the parsed value; null: the file does not exist),
// kept up to date by a watch in the box (the agent's 10 ms debounce); a
// file that fails to read or parse keeps its last value and sets error.
// previews, present when the spec declares Ports, maps each port (as a
// string) to its preview URLs {url, host_url?} (see api.BrowseOutput):
// the sandbox service's browse tool, called for each port whenever the box
// is made or reattached, so a box made anew (destroy, then run) publishes
// its new URLs; previews is {} while there is no box. A URL answers as
// soon as a server listens on the port in the box (the proxy connects per
// request); a port whose URL could not be had is left out and sets error.
//
// Streams, handled one event at a time, in order:
//   - run: {"command": "...", "files": {path: value}, "timeout_ms": N}
//     writes files (optional; strings as they are, other values as JSON),
//     runs the command (timeout_ms defaults to DefaultRunTimeout) and
//     appends it to history; pending is true from the event's receipt
//     until its entry is in. A non-zero exit is history, not a failure.
//   - destroy: {} destroys the box; status becomes destroyed and stays so
//     across restarts. A later run event creates a fresh box (input files
//     written anew, history kept).
//
// Open creates the box, or reattaches to it when it exists (a restarted
// runner); Close destroys it when the pattern stops and leaves it for the
// next Open when the runtime shuts down.
type Sandbox struct {
	env  Env
	spec SandboxSpec
	box  string
	log  *slog.Logger

	mu        sync.Mutex // guards below; held while the box is made, destroyed or written
	h         runtime.Handle
	in        runtime.Inputs
	image     string // the image the box was made with
	alive     bool
	written   map[string][32]byte // input path -> hash of the content last written
	stopWatch context.CancelFunc
	watchers  sync.WaitGroup

	pmu        sync.Mutex        // guards the problems below, shown in error while running
	inputErr   string            // why input files could not be written
	previewErr string            // why preview URLs could not be had
	fileErrs   map[string]string // output path -> why its last read failed
}

var (
	_ runtime.Service       = (*Sandbox)(nil)
	_ runtime.EventAcceptor = (*Sandbox)(nil)
)

// NewSandbox returns the sandbox node kind for spec.
func NewSandbox(env Env, spec SandboxSpec) (*Sandbox, error) {
	if err := env.check(); err != nil {
		return nil, fmt.Errorf("sandbox node %s: %w", spec.Node.Name, err)
	}
	if err := checkFiles(spec.Files); err != nil {
		return nil, fmt.Errorf("sandbox node %s: %w", spec.Node.Name, err)
	}
	for _, p := range spec.Ports {
		if p < 1 || p > 65535 {
			return nil, fmt.Errorf("sandbox node %s: port %d is out of range 1-65535", spec.Node.Name, p)
		}
	}
	return &Sandbox{
		env: env, spec: spec,
		box: "sandbox-" + boxBase(spec.Node, 55),
		log: env.logger().With("node", spec.Node.String()),
	}, nil
}

// BoxName is the name of the node's box in its session.
func (s *Sandbox) BoxName() string { return s.box }

// sandboxOutput is the node's output cell.
type sandboxOutput struct {
	Pending bool                       `json:"pending"`
	Status  string                     `json:"status"`
	Box     string                     `json:"box"`
	Error   string                     `json:"error,omitempty"`
	History []json.RawMessage          `json:"history"`
	Files   map[string]json.RawMessage `json:"files"`
	// Previews is nil (left out) when the spec declares no ports.
	Previews map[string]Preview `json:"previews,omitzero"`
}

// Preview is where a browser on the runner's machine reaches a port of a
// sandbox's box: api.BrowseOutput's URLs.
type Preview struct {
	// URL is BASE/preview/ID/ (the app sees paths without the prefix, so
	// it must use relative URLs).
	URL string `json:"url"`
	// HostURL is http://ID.localhost:PORT/ (the app sees whole paths),
	// when the server's base URL is on the loopback address.
	HostURL string `json:"host_url,omitempty"`
}

// HistoryEntry is one command of a sandbox's history.
type HistoryEntry struct {
	Command    string    `json:"command"`
	Stdout     string    `json:"stdout"`
	Stderr     string    `json:"stderr"`
	ExitCode   int       `json:"exit_code"`
	Started    time.Time `json:"started"`
	DurationMs int64     `json:"duration_ms"`
	TimedOut   bool      `json:"timed_out,omitempty"`
	Truncated  bool      `json:"truncated,omitempty"`
	// Error says why the command could not run (no box, ...); ExitCode is
	// -1 then.
	Error string `json:"error,omitempty"`
}

// sandboxState is the node's durable state.
type sandboxState struct {
	Destroyed bool `json:"destroyed,omitempty"`
}

// runEvent is the payload of the run stream.
type runEvent struct {
	Command   string         `json:"command"`
	Files     map[string]any `json:"files,omitempty"`
	TimeoutMs int            `json:"timeout_ms,omitempty"`
}

func decodeRun(payload json.RawMessage) (runEvent, error) {
	var ev runEvent
	d := json.NewDecoder(bytes.NewReader(payload))
	d.DisallowUnknownFields()
	d.UseNumber()
	if err := d.Decode(&ev); err != nil {
		return ev, fmt.Errorf(`run event %s: %w (want {"command": "...", "files": {"/workspace/x": "..."}, "timeout_ms": 1000})`, payload, err)
	}
	if strings.TrimSpace(ev.Command) == "" {
		return ev, fmt.Errorf(`run event %s: no command (want {"command": "ls -la"})`, payload)
	}
	if ev.TimeoutMs < 0 {
		return ev, fmt.Errorf("run event: negative timeout_ms %d", ev.TimeoutMs)
	}
	for p := range ev.Files {
		if !path.IsAbs(p) || path.Clean(p) != p {
			return ev, fmt.Errorf("run event: file %q is not a clean absolute path in the box (e.g. %q)", p, path.Join("/workspace", p))
		}
	}
	return ev, nil
}

// edit decodes an output value, lets fn change it and returns it. A value
// that is not a sandbox output (written by something else, or by another
// version) is not silently replaced: it is kept whole as the first history
// entry, {"error": "...", "unreadable_output": VALUE}.
func (s *Sandbox) edit(cur json.RawMessage, fn func(o *sandboxOutput)) sandboxOutput {
	var o sandboxOutput
	var bad error
	if len(cur) > 0 && string(cur) != "null" {
		if bad = json.Unmarshal(cur, &o); bad != nil {
			lost, _ := json.Marshal(map[string]any{
				"error":             fmt.Sprintf("the node's output held a value that is not a sandbox output (%v); it is kept here", bad),
				"unreadable_output": cur,
			})
			o = sandboxOutput{History: []json.RawMessage{lost}}
			s.log.Warn("the output cell held a value that is not a sandbox output; kept as history[0]", "error", bad)
		}
	}
	if o.History == nil {
		o.History = []json.RawMessage{}
	}
	if o.Files == nil {
		o.Files = map[string]json.RawMessage{}
	}
	o.Box = s.box
	fn(&o)
	if o.Previews == nil && len(s.spec.Ports) > 0 {
		o.Previews = map[string]Preview{} // no box: no URLs
	}
	return o
}

// writeRetries are the pauses between attempts to write the output cell
// when the store refuses the write (a full disk): a command's history
// entry is not dropped on a passing failure.
var writeRetries = []time.Duration{10 * time.Millisecond, 100 * time.Millisecond, time.Second}

// modify changes the output cell, trying again while the store refuses
// the write; it returns (and logs) the last attempt's error.
func (s *Sandbox) modify(ctx context.Context, fn func(o *sandboxOutput)) error {
	for attempt := 0; ; attempt++ {
		err := s.h.Modify(ctx, func(cur json.RawMessage) (any, error) { return s.edit(cur, fn), nil })
		if err == nil {
			return nil
		}
		if attempt == len(writeRetries) || ctx.Err() != nil {
			s.log.Warn("write sandbox output", "error", err)
			return err
		}
		select {
		case <-time.After(writeRetries[attempt]):
		case <-ctx.Done():
		}
	}
}

// Open creates (or reattaches to) the box, unless a destroy event left it
// destroyed.
func (s *Sandbox) Open(ctx context.Context, h runtime.Handle, in runtime.Inputs) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.h, s.in = h, in
	var st sandboxState
	if raw, err := h.State(); err == nil && len(raw) > 0 {
		_ = json.Unmarshal(raw, &st)
	}
	if st.Destroyed {
		s.modify(ctx, func(o *sandboxOutput) { o.Status, o.Pending, o.Error, o.Previews = StatusDestroyed, false, "", nil })
		return nil
	}
	// A command in flight when the runner stopped is lost (events are
	// handled at most once): it is not pending any more.
	s.modify(ctx, func(o *sandboxOutput) { o.Pending = false })
	return s.up(ctx)
}

// up creates or reattaches to the box, writes the input files and starts
// watching the output files. Callers hold s.mu.
func (s *Sandbox) up(ctx context.Context) error {
	s.modify(ctx, func(o *sandboxOutput) { o.Status, o.Error, o.Previews = StatusStarting, "", nil })
	err := s.start(ctx)
	if err != nil {
		err = fmt.Errorf("start box %q: %w", s.box, err)
		s.modify(ctx, func(o *sandboxOutput) { o.Status, o.Error = StatusError, err.Error() })
		return err
	}
	if err := s.h.SaveState(nil); err != nil {
		s.log.Warn("save sandbox state", "error", err)
	}
	previews, err := s.browse(ctx)
	if err != nil {
		s.log.Warn("preview URLs", "box", s.box, "error", err)
	}
	s.pmu.Lock()
	defer s.pmu.Unlock()
	s.previewErr = ""
	if err != nil {
		s.previewErr = err.Error()
	}
	s.reportLocked(ctx, func(o *sandboxOutput) { o.Status, o.Previews = StatusRunning, previews })
	return nil
}

// browse asks the sandbox service for the preview URLs of the declared
// ports (nil when there are none); a port it cannot have is left out and
// named in the error.
func (s *Sandbox) browse(ctx context.Context) (map[string]Preview, error) {
	if len(s.spec.Ports) == 0 {
		return nil, nil
	}
	out := map[string]Preview{}
	var errs []error
	for _, port := range s.spec.Ports {
		var b api.BrowseOutput
		raw, err := s.env.Client.Tool(ctx, "browse", api.BrowseInput{Sandbox: s.box, Port: port})
		if err == nil {
			err = json.Unmarshal(raw, &b)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("preview URL of port %d: %w", port, err))
			continue
		}
		out[strconv.Itoa(port)] = Preview{URL: b.URL, HostURL: b.HostURL}
	}
	return out, errors.Join(errs...)
}

// setInputProblem records why input files could not be written (nil: they
// were) and reports it.
func (s *Sandbox) setInputProblem(ctx context.Context, err error) {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	s.inputErr = ""
	if err != nil {
		s.inputErr = err.Error()
	}
	s.reportLocked(ctx, nil)
}

// setFileProblems records the outcome of output file reads (path -> why
// it failed, "" when it worked) and writes the output with fn applied.
func (s *Sandbox) setFileProblems(ctx context.Context, errs map[string]string, fn func(o *sandboxOutput)) {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	for p, e := range errs {
		if e != "" {
			s.fileErrs[p] = e
		} else {
			delete(s.fileErrs, p)
		}
	}
	s.reportLocked(ctx, fn)
}

// reportLocked writes the output with fn applied and error set to the
// current problem, if the box runs. Callers hold s.pmu.
func (s *Sandbox) reportLocked(ctx context.Context, fn func(o *sandboxOutput)) {
	problem := s.inputErr
	if problem == "" {
		problem = s.previewErr
	}
	if problem == "" && len(s.fileErrs) > 0 {
		problem = s.fileErrs[slices.Sorted(maps.Keys(s.fileErrs))[0]]
	}
	s.modify(ctx, func(o *sandboxOutput) {
		if fn != nil {
			fn(o)
		}
		if o.Status == StatusRunning {
			o.Error = problem
		}
	})
}

func (s *Sandbox) start(ctx context.Context) error {
	image, err := evalImage(s.spec.Image, s.in)
	if err != nil {
		return err
	}
	out, err := s.env.Client.CreateBox(ctx, api.SandboxCreateInput{Sandbox: s.box, Image: image})
	if err != nil {
		return fmt.Errorf("create (image %s): %w", imageName(image), err)
	}
	s.log.Info("sandbox box up", "box", s.box, "created", out.Created, "id", out.ID)
	s.alive, s.image, s.written = true, image, map[string][32]byte{}
	s.pmu.Lock()
	s.inputErr, s.previewErr, s.fileErrs = "", "", map[string]string{}
	s.pmu.Unlock()
	if err := s.startWatches(ctx); err != nil {
		if derr := s.down(context.WithoutCancel(ctx)); derr != nil {
			s.log.Warn("destroy the box that failed to start", "box", s.box, "error", derr)
		}
		return err
	}
	// An input that cannot be written (an expression failing on its
	// inputs) does not stop the box: error says so until it is written.
	s.writeAndReport(ctx)
	return nil
}

// writeAndReport writes the changed input files and reports whether that
// worked. Callers hold s.mu.
func (s *Sandbox) writeAndReport(ctx context.Context) error {
	err := s.writeInputs(ctx)
	if err != nil {
		s.log.Warn("write input files", "box", s.box, "error", err)
	}
	s.setInputProblem(ctx, err)
	return err
}

// writeInputs writes the input files whose content changed since they
// were last written. Callers hold s.mu.
func (s *Sandbox) writeInputs(ctx context.Context) error {
	for _, p := range slices.Sorted(maps.Keys(s.spec.Files)) {
		f := s.spec.Files[p]
		if f.Input == nil {
			continue
		}
		content, err := evalText(f.Input, s.in, "file "+p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256([]byte(content))
		if prev, ok := s.written[p]; ok && prev == sum {
			continue
		}
		if err := upload(ctx, s.env.Client, s.box, p, content); err != nil {
			return err
		}
		s.written[p] = sum
	}
	return nil
}

// outputs returns the output paths, sorted.
func (s *Sandbox) outputs() []string {
	var out []string
	for _, p := range slices.Sorted(maps.Keys(s.spec.Files)) {
		if s.spec.Files[p].Input == nil {
			out = append(out, p)
		}
	}
	return out
}

// watchDirs groups output paths by the directories to watch: each output's
// parent, dropping directories inside another one (watches are recursive).
func watchDirs(outputs []string) map[string][]string {
	var dirs []string
	for _, p := range outputs {
		dirs = append(dirs, path.Dir(p))
	}
	slices.Sort(dirs)
	dirs = slices.Compact(dirs)
	var top []string
	for _, d := range dirs {
		if !slices.ContainsFunc(top, func(t string) bool { return within(d, t) }) {
			top = append(top, d)
		}
	}
	groups := map[string][]string{}
	for _, p := range outputs {
		for _, t := range top {
			if within(path.Dir(p), t) {
				groups[t] = append(groups[t], p)
				break
			}
		}
	}
	return groups
}

// within reports whether dir is root or inside it.
func within(dir, root string) bool {
	return dir == root || root == "/" || strings.HasPrefix(dir, root+"/")
}

// startWatches watches the output files' directories (made if missing)
// and reads the files once. Callers hold s.mu.
func (s *Sandbox) startWatches(ctx context.Context) error {
	groups := watchDirs(s.outputs())
	if len(groups) == 0 {
		return nil
	}
	// Every output's directory is made, so that commands can write there
	// and the watch has a tree to watch.
	var parents []string
	for _, p := range s.outputs() {
		parents = append(parents, path.Dir(p))
	}
	if r, err := s.env.Client.Exec(ctx, s.box, api.ExecRequest{Argv: append([]string{"mkdir", "-p", "--"}, parents...)}, nil); err != nil {
		return fmt.Errorf("make output directories: %w", err)
	} else if r.ExitCode != 0 {
		return fmt.Errorf("make output directories %s: %s", strings.Join(parents, " "), lastLine(r.Stderr))
	}
	dirs := slices.Sorted(maps.Keys(groups))
	wctx, cancel := context.WithCancel(context.Background())
	chans := map[string]<-chan []api.WatchEvent{}
	for _, d := range dirs {
		ch, err := s.env.Client.Watch(wctx, s.box, d)
		if err != nil {
			cancel()
			return fmt.Errorf("watch %s: %w", d, err)
		}
		chans[d] = ch
	}
	s.stopWatch = cancel
	for _, d := range dirs {
		s.watchers.Add(1)
		go s.follow(wctx, d, groups[d], chans[d])
	}
	return nil
}

// follow reads the outputs under dir now and whenever the watch reports a
// change to one of them, re-establishing the watch if it ends while the box
// lives.
func (s *Sandbox) follow(ctx context.Context, dir string, outs []string, ch <-chan []api.WatchEvent) {
	defer s.watchers.Done()
	for {
		s.readFiles(ctx, outs)
		for batch := range ch {
			var changed []string
			for _, ev := range batch {
				// Exact paths only: the agent's temp files
				// (.NAME.cellbox-*) and other files are not outputs.
				if slices.Contains(outs, ev.Path) && !slices.Contains(changed, ev.Path) {
					changed = append(changed, ev.Path)
				}
			}
			if len(changed) > 0 {
				s.readFiles(ctx, changed)
			}
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(watchRetry):
			}
			s.log.Info("file watch ended; watching again", "dir", dir)
			var err error
			mkdir := []string{"mkdir", "-p", "--"}
			for _, p := range outs {
				mkdir = append(mkdir, path.Dir(p))
			}
			if _, err = s.env.Client.Exec(ctx, s.box, api.ExecRequest{Argv: mkdir}, nil); err == nil {
				ch, err = s.env.Client.Watch(ctx, s.box, dir)
			}
			if err == nil {
				break
			}
			if ctx.Err() == nil {
				s.log.Warn("watch output files", "dir", dir, "error", err)
			}
		}
	}
}

// readFiles reads output files and writes what changed into files.
func (s *Sandbox) readFiles(ctx context.Context, paths []string) {
	type read struct {
		raw json.RawMessage
		err string
	}
	reads := map[string]read{}
	errs := map[string]string{}
	for _, p := range paths {
		v, found, err := readOutput(ctx, s.env.Client, s.box, p, s.spec.Files[p].Output)
		if ctx.Err() != nil {
			return // stopped: the box may be gone
		}
		var r read
		switch {
		case err != nil:
			r.err = err.Error()
			s.log.Warn("read output file", "path", p, "error", err)
		case found:
			if r.raw, err = json.Marshal(v); err != nil {
				r.err = fmt.Sprintf("output file %s: %v", p, err)
			}
		default:
			r.raw = json.RawMessage("null")
		}
		reads[p], errs[p] = r, r.err
	}
	s.setFileProblems(ctx, errs, func(o *sandboxOutput) {
		for p, r := range reads {
			if r.err == "" {
				o.Files[p] = r.raw
			}
		}
	})
}

// Update rewrites the input files whose value changed.
func (s *Sandbox) Update(ctx context.Context, in runtime.Inputs) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.in = in
	if !s.alive {
		return nil // written when the box is made
	}
	if image, err := evalImage(s.spec.Image, in); err == nil && image != s.image {
		s.log.Info("sandbox image changed: it applies when the box is made again (destroy, then run)", "box", s.box, "image", imageName(image), "current", imageName(s.image))
	}
	return s.writeAndReport(ctx)
}

// Accept marks the node pending in the transaction that takes a run or
// destroy event, refusing a malformed run event.
func (s *Sandbox) Accept(stream string, ev cells.Event, cur json.RawMessage) (any, error) {
	switch stream {
	case "run":
		if _, err := decodeRun(ev.Payload); err != nil {
			return nil, err
		}
	case "destroy":
	default:
		return nil, fmt.Errorf("sandbox node has no stream %q (streams: run, destroy)", stream)
	}
	return s.edit(cur, func(o *sandboxOutput) { o.Pending = true }), nil
}

// CheckEvent refuses a malformed event when it is sent, so the sender
// hears of it (runtime.EventChecker).
func (s *Sandbox) CheckEvent(stream string, payload json.RawMessage) error {
	switch stream {
	case "run":
		_, err := decodeRun(payload)
		return err
	case "destroy":
		return nil
	}
	return fmt.Errorf("sandbox node has no stream %q (streams: run, destroy)", stream)
}

// Event handles a run or destroy event.
func (s *Sandbox) Event(ctx context.Context, stream string, ev cells.Event) error {
	switch stream {
	case "run":
		return s.run(ctx, ev)
	case "destroy":
		s.mu.Lock()
		defer s.mu.Unlock()
		err := s.down(ctx)
		if serr := s.h.SaveState(sandboxState{Destroyed: true}); serr != nil {
			err = errors.Join(err, fmt.Errorf("save sandbox state: %w", serr))
		}
		s.modify(ctx, func(o *sandboxOutput) {
			o.Status, o.Pending, o.Error, o.Previews = StatusDestroyed, false, "", nil
			if err != nil {
				o.Error = err.Error()
			}
		})
		return err
	}
	return fmt.Errorf("sandbox node has no stream %q (streams: run, destroy)", stream)
}

func (s *Sandbox) run(ctx context.Context, ev cells.Event) error {
	p, err := decodeRun(ev.Payload)
	started := time.Now()
	var env map[string]string
	if err == nil {
		env, err = s.prepare(ctx, p)
	}
	entry := HistoryEntry{Command: p.Command, Started: started.UTC(), ExitCode: -1}
	if err == nil {
		timeout := DefaultRunTimeout
		if p.TimeoutMs > 0 {
			timeout = time.Duration(p.TimeoutMs) * time.Millisecond
		}
		var r api.ExecResult
		r, err = s.env.Client.Exec(ctx, s.box, api.ExecRequest{
			Command: p.Command, Env: env,
			TimeoutMs: int(timeout / time.Millisecond), MaxOutput: HistoryOutputLimit,
		}, nil)
		if err == nil {
			entry.Stdout, entry.Stderr, entry.ExitCode = r.Stdout, r.Stderr, r.ExitCode
			entry.TimedOut, entry.Truncated = r.TimedOut, r.Truncated
		}
	}
	entry.DurationMs = time.Since(started).Milliseconds()
	if err != nil {
		err = fmt.Errorf("run %q in box %q: %w", p.Command, s.box, err)
		entry.Error = err.Error()
	}
	entry.Stdout, entry.Truncated = capText(entry.Stdout, entry.Truncated)
	entry.Stderr, entry.Truncated = capText(entry.Stderr, entry.Truncated)
	raw, merr := json.Marshal(entry)
	if merr != nil {
		return errors.Join(err, merr)
	}
	// The event is acked already: a history entry the store refuses
	// fails the event (a failed status naming the command) after the
	// retries, rather than vanishing into the log.
	werr := s.modify(context.WithoutCancel(ctx), func(o *sandboxOutput) {
		o.History = compact(append(o.History, raw))
		o.Pending = false
	})
	if werr != nil {
		err = errors.Join(err, fmt.Errorf("record the result of %q in the history: %w", p.Command, werr))
	}
	return err
}

// prepare makes sure the box lives (a run after destroy makes a fresh one)
// and writes the event's files; it returns the env of the command.
func (s *Sandbox) prepare(ctx context.Context, p runEvent) (map[string]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.alive {
		if err := s.up(ctx); err != nil {
			return nil, err
		}
	}
	for _, fp := range slices.Sorted(maps.Keys(p.Files)) {
		content, err := Text(p.Files[fp])
		if err != nil {
			return nil, fmt.Errorf("file %s: %w", fp, err)
		}
		if err := upload(ctx, s.env.Client, s.box, fp, content); err != nil {
			return nil, err
		}
		delete(s.written, fp) // a bound input file overwritten: rewrite it on its next change
	}
	return evalEnv(s.spec.Env, s.in)
}

// capText cuts s to HistoryOutputLimit bytes, keeping the end.
func capText(s string, truncated bool) (string, bool) {
	if len(s) <= HistoryOutputLimit {
		return s, truncated
	}
	s = s[len(s)-HistoryOutputLimit:]
	for i := 0; i < 4 && i < len(s) && s[i]&0xC0 == 0x80; i++ {
		s = s[1:] // do not start inside a UTF-8 sequence
	}
	return s, true
}

// compact keeps the last HistoryLimit entries, counting older ones in a
// leading {"dropped": N}.
func compact(h []json.RawMessage) []json.RawMessage {
	dropped := 0
	if len(h) > 0 {
		var m struct {
			Dropped *int `json:"dropped"`
		}
		if json.Unmarshal(h[0], &m) == nil && m.Dropped != nil {
			dropped, h = *m.Dropped, h[1:]
		}
	}
	if over := len(h) - HistoryLimit; over > 0 {
		dropped += over
		h = h[over:]
	}
	if dropped == 0 {
		return h
	}
	marker, _ := json.Marshal(map[string]int{"dropped": dropped})
	return append([]json.RawMessage{marker}, h...)
}

// down stops the watches and destroys the box. Callers hold s.mu.
func (s *Sandbox) down(ctx context.Context) error {
	s.stopWatches()
	if !s.alive {
		return nil
	}
	s.alive = false
	if err := s.env.Client.DestroyBox(ctx, s.box); err != nil && !noSuchBox(err) {
		return fmt.Errorf("destroy box %q: %w", s.box, err)
	}
	return nil
}

// stopWatches ends the file watches and waits for their readers. Callers
// hold s.mu.
func (s *Sandbox) stopWatches() {
	if s.stopWatch == nil {
		return
	}
	s.stopWatch()
	s.stopWatch = nil
	s.watchers.Wait()
}

// Close destroys the box when the pattern stopped; on shutdown it keeps it
// for the next Open to reattach.
func (s *Sandbox) Close(ctx context.Context, reason runtime.CloseReason) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if reason != runtime.Stopped {
		s.stopWatches()
		return nil
	}
	err := s.down(context.WithoutCancel(ctx))
	s.modify(context.WithoutCancel(ctx), func(o *sandboxOutput) { o.Status, o.Pending, o.Previews = StatusDestroyed, false, nil })
	if serr := s.h.SaveState(nil); serr != nil {
		err = errors.Join(err, fmt.Errorf("save sandbox state: %w", serr))
	}
	return err
}
