package builtins

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
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

// sandboxBox is the name of a sandbox node's box in the runner's session.
func sandboxBox(node cells.Address) string { return "sandbox-" + boxBase(node, 55) }

// SandboxGone destroys the box of a sandbox node that a loaded pattern no
// longer has (a runtime.Gone status: the node was removed, or made a node
// of another kind, while the runner was down): the box outlived the node's
// cells and state, with its files, which nothing would ever remove (and
// which a node of that name added later must not find; Open makes it a box
// of its own anyway).
func SandboxGone(ctx context.Context, env Env, node cells.Address) error {
	if err := env.Client.DestroyBox(ctx, sandboxBox(node)); err != nil && !noSuchBox(err) {
		return fmt.Errorf("destroy the box of the removed sandbox node %s: %w", node, err)
	}
	return nil
}

// Sandbox statuses.
const (
	StatusStarting  = "starting"
	StatusRunning   = "running"
	StatusAsleep    = "asleep" // the runner shut down: the box sleeps, its files kept, until the next runner
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
	// Start, if set, is a server kept running in the box (see StartSpec).
	Start *StartSpec
	// Network is the box's network, as sandbox_create's (nil: closed).
	// An allow list is applied to a box that already exists too.
	Network *api.Network
	// Snapshot, if set, is the id of a snapshot of the session whose
	// workspace a newly made box starts with (the restore tool), before
	// the input files are written. Read when the box is made.
	Snapshot Field
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
// kept up to date by a watch in the box (the agent's: after 10 ms still); a
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
//   - snapshot: {"label": "..."} (label optional) saves the box's
//     workspace as a snapshot of the session (the snapshot tool) and
//     appends it to history: command "snapshot LABEL", tool "snapshot",
//     snapshot the id (what a sandbox node's snapshot field, restore or
//     branch take), stdout the snapshot's description.
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
	fresh     bool                // opened with no state: a box of its name is not its own (start)
	reopen    bool                // opening a node that had a box: a new box gets its output files back (start)
	written   map[string][32]byte // input path -> hash of the content last written
	stopWatch context.CancelFunc
	watchers  sync.WaitGroup
	server    *server // the supervised server (spec.Start) while the box is up

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
		box: sandboxBox(spec.Node),
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
	// Server is the supervised server's state, when the spec has one.
	Server *ServerStatus `json:"server,omitempty"`
	// Made are the boxes an llm node's model made from this box (fork,
	// branch): they go with it (destroyMade).
	Made []string `json:"made,omitempty"`
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

// sandboxState is the node's durable state.
type sandboxState struct {
	Destroyed bool `json:"destroyed,omitempty"`
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
	raw, err := h.State()
	if err == nil && len(raw) > 0 {
		_ = json.Unmarshal(raw, &st)
	}
	// No state: the node is new to the store (or was removed from the
	// pattern and is back), so a box of its name is an earlier node's.
	s.fresh = err == nil && len(raw) == 0
	if st.Destroyed {
		s.modify(ctx, func(o *sandboxOutput) { o.Status, o.Pending, o.Error, o.Previews = StatusDestroyed, false, "", nil })
		return nil
	}
	// A command in flight when the runner stopped is lost (events are
	// handled at most once): it is not pending any more.
	s.modify(ctx, func(o *sandboxOutput) { o.Pending = false })
	// A box made now, for a node that had one, replaces a box that was
	// lost (not destroyed: a destroyed node does not come up here), and
	// gets the node's output files back (start).
	s.reopen = !s.fresh
	defer func() { s.reopen = false }()
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
	s.previewErr = ""
	if err != nil {
		s.previewErr = err.Error()
	}
	s.reportLocked(ctx, func(o *sandboxOutput) { o.Status, o.Previews = StatusRunning, previews })
	s.pmu.Unlock()
	s.startServer(ctx)
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

// reportLocked writes the output with fn applied and error set to the
// current problem, if the box runs. Callers hold s.pmu.
func (s *Sandbox) reportLocked(ctx context.Context, fn func(o *sandboxOutput)) {
	problem := s.inputErr
	if problem == "" {
		problem = s.previewErr
	}
	if problem == "" && len(s.fileErrs) > 0 {
		// Every broken output, each of which keeps its last value.
		var all []string
		for _, p := range slices.Sorted(maps.Keys(s.fileErrs)) {
			all = append(all, s.fileErrs[p])
		}
		problem = strings.Join(all, "; ")
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
	create := api.SandboxCreateInput{Sandbox: s.box, Image: image, Network: s.spec.Network}
	out, err := s.env.Client.CreateBox(ctx, create)
	if err == nil && !out.Created && s.fresh {
		// A node of this name that was removed from the pattern (its
		// state with it) left its box: its files are not this node's to
		// find, and it starts from a box of its own.
		s.log.Info("removing the box an earlier node of this name left", "box", s.box, "id", out.ID)
		if err = s.env.Client.DestroyBox(ctx, s.box); err == nil || noSuchBox(err) {
			out, err = s.env.Client.CreateBox(ctx, create)
		}
	}
	if err != nil {
		return fmt.Errorf("create (image %s): %w", imageName(image), err)
	}
	s.fresh = false
	if nw := s.spec.Network; !out.Created && nw != nil && !nw.Full {
		// The box outlived a change of the pattern's allow list.
		if _, err := s.env.Client.Tool(ctx, "network_set", api.NetworkSetInput{Sandbox: s.box, NetworkRules: nw.NetworkRules}); err != nil {
			return fmt.Errorf("set the network of box %s: %w", s.box, err)
		}
	}
	s.log.Info("sandbox box up", "box", s.box, "created", out.Created, "id", out.ID)
	if out.Created && s.spec.Snapshot != nil {
		if err := s.restore(ctx); err != nil {
			if derr := s.env.Client.DestroyBox(context.WithoutCancel(ctx), s.box); derr != nil {
				s.log.Warn("destroy the box that failed to start", "box", s.box, "error", derr)
			}
			return err
		}
	}
	if out.Created && s.reopen && s.spec.Snapshot == nil {
		// The node had a box, and this one is new (its box was lost: its
		// server died with a one-machine backend, or the box was gone):
		// the output files it synced out go back in.
		if err := s.restoreOutputs(ctx); err != nil {
			s.log.Warn("put the node's output files back into its new box", "box", s.box, "error", err)
		}
	}
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

// down stops the watches and destroys the box. Callers hold s.mu.
func (s *Sandbox) down(ctx context.Context) error {
	s.stopServer(ctx, false) // the box goes with it
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

// Adopt records boxes a model made from this node's box (fork, branch),
// so that they are destroyed with it.
func (s *Sandbox) Adopt(ctx context.Context, boxes []string) error {
	s.mu.Lock()
	open := s.h != nil
	s.mu.Unlock()
	if !open {
		return fmt.Errorf("sandbox node %s is not open: boxes made from its box cannot be recorded", s.spec.Node.Name)
	}
	return s.modify(context.WithoutCancel(ctx), func(o *sandboxOutput) {
		for _, b := range boxes {
			if !slices.Contains(o.Made, b) {
				o.Made = append(o.Made, b)
			}
		}
	})
}

// destroyMade destroys the boxes a model made from this node's box
// (Adopt); those that could not be destroyed stay listed. Callers hold
// s.mu.
func (s *Sandbox) destroyMade(ctx context.Context) error {
	var made []string
	s.modify(ctx, func(o *sandboxOutput) { made = o.Made })
	var errs []error
	var left []string
	for _, b := range made {
		if err := s.env.Client.DestroyBox(ctx, b); err != nil && !noSuchBox(err) {
			errs = append(errs, fmt.Errorf("destroy box %q (made by a model from box %q): %w", b, s.box, err))
			left = append(left, b)
		}
	}
	if len(made) > 0 {
		s.log.Info("destroyed the boxes a model made from the node's box", "boxes", made, "left", left)
		s.modify(ctx, func(o *sandboxOutput) { o.Made = left })
	}
	return errors.Join(errs...)
}

// Close destroys the box when the pattern stopped; on shutdown it keeps it
// for the next Open to reattach.
func (s *Sandbox) Close(ctx context.Context, reason runtime.CloseReason) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if reason != runtime.Stopped {
		// The server is stopped with the runtime (its process killed): the
		// next Open starts it again, rather than meet a stale one.
		s.stopServer(ctx, true)
		s.stopWatches()
		// The box is put to sleep with the runner: its cell, read while
		// no runner runs (cellbox cell ls), says so, not "running".
		s.modify(context.WithoutCancel(ctx), func(o *sandboxOutput) {
			if o.Status == StatusRunning {
				o.Status = StatusAsleep
			}
		})
		return nil
	}
	err := errors.Join(s.down(context.WithoutCancel(ctx)), s.destroyMade(context.WithoutCancel(ctx)))
	s.modify(context.WithoutCancel(ctx), func(o *sandboxOutput) { o.Status, o.Pending, o.Previews = StatusDestroyed, false, nil })
	if serr := s.h.SaveState(nil); serr != nil {
		err = errors.Join(err, fmt.Errorf("save sandbox state: %w", serr))
	}
	return err
}
