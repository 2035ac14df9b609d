package builtins

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/cellbox/cellbox/internal/safe"
	"github.com/cellbox/cellbox/sandbox/api"
)

// A sandbox node's supervised server (start:): a command kept running in
// the box while the box is up, restarted with backoff when it exits, its
// state and the tail of its output shown in the node's output (server).
//
// The command runs as one streaming exec that lasts as long as the
// process: its end is the exit event (no polling), its output arrives as
// it is written, and the exec holds the box awake (the pool does not put a
// box with a call in flight to sleep). Cancelling the exec kills the
// process group in the box, which is how Close, destroy and a changed
// command stop it. When the box dies the exec fails; the next attempt
// acquires the box again, and the pool heals or remakes it on the way.

// StartSpec is a sandbox node's supervised server.
type StartSpec struct {
	// Command is the server's shell command, formatted with Text; a new
	// value (an input changed) restarts the server.
	Command Field
	// Port, if not 0, is the TCP port in the box whose accepting
	// connections makes the server ready.
	Port int
	// Ready, if not nil, is a command run in the box (with backoff) until
	// it exits 0, which makes the server ready.
	Ready Field
}

// Server states (ServerStatus.State).
const (
	ServerStarting = "starting" // launched; not ready yet (a port or ready probe is declared)
	ServerRunning  = "running"  // launched; no readiness declared, so running is all that is known
	ServerReady    = "ready"    // the port accepts connections, or the ready command exited 0
	ServerExited   = "exited"   // the command ended (exit_code); a restart follows
	ServerBackoff  = "backoff"  // waiting retry_ms before the next start
	ServerStopped  = "stopped"  // the box is down or destroyed
)

// Supervision bounds.
var (
	// serverBackoffMin and serverBackoffMax bound the pause before a
	// restart: it starts at the minimum and doubles at each exit in a row.
	serverBackoffMin = 500 * time.Millisecond
	serverBackoffMax = 30 * time.Second
	// serverResetAfter: a server that ran this long before exiting is
	// restarted after the minimum pause again.
	serverResetAfter = 10 * time.Second
	// serverFlushEvery is the most often output alone rewrites the cell.
	serverFlushEvery = 250 * time.Millisecond
	// readyProbeMax caps the pause between two readiness probes.
	readyProbeMax = time.Second
)

// ServerOutputLimit caps the tail of the server's output kept in the
// node's output (stdout and stderr interleaved, as written).
const ServerOutputLimit = 16 << 10

// ServerStatus is the server field of a sandbox node's output.
type ServerStatus struct {
	Command  string     `json:"command"`
	State    string     `json:"state"`
	ExitCode *int       `json:"exit_code,omitempty"` // of the last exit
	Restarts int        `json:"restarts"`            // starts after the first
	Started  *time.Time `json:"started,omitempty"`   // of the current (or last) run
	RetryMs  int64      `json:"retry_ms,omitempty"`  // backoff: the pause before the next start
	Error    string     `json:"error,omitempty"`     // why the last run could not start or ended
	Output   string     `json:"output"`              // the tail of its output
}

// server is one supervision of one command; a new command is a new server.
type server struct {
	s       *Sandbox
	command string
	env     map[string]string
	ready   string // the ready command, evaluated at start ("" with a port, or none)
	cancel  context.CancelFunc
	done    chan struct{}

	mu     sync.Mutex // guards below
	status ServerStatus
	tail   []byte
	dirty  bool // output not yet written to the cell
}

// startServer starts supervising the spec's command, or restarts it when
// the command or the env changed; callers hold s.mu and the box is up.
func (s *Sandbox) startServer(ctx context.Context) {
	if s.spec.Start == nil {
		return
	}
	command, err := evalText(s.spec.Start.Command, s.in, "start command")
	var env map[string]string
	if err == nil {
		env, err = evalEnv(s.spec.Env, s.in)
	}
	var ready string
	if err == nil && s.spec.Start.Ready != nil {
		ready, err = evalText(s.spec.Start.Ready, s.in, "ready command")
	}
	if err != nil {
		s.stopServer(ctx, true)
		s.modify(ctx, func(o *sandboxOutput) {
			o.Server = &ServerStatus{State: ServerStopped, Error: err.Error(), Output: ""}
		})
		return
	}
	if sv := s.server; sv != nil && sv.command == command && maps.Equal(sv.env, env) && sv.ready == ready {
		return
	}
	s.stopServer(ctx, true)
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	sv := &server{s: s, command: command, env: env, ready: ready, cancel: cancel, done: make(chan struct{}),
		status: ServerStatus{Command: command, State: ServerStarting}}
	s.server = sv
	go sv.supervise(sctx)
}

// stopServer stops the server and waits for its supervisor; callers hold
// s.mu. Its exec is cancelled, which has the agent kill the process; with
// reap (the box lives on) it also waits until the process has ended in
// the box, so that a server started next finds its port free.
func (s *Sandbox) stopServer(ctx context.Context, reap bool) {
	sv := s.server
	if sv == nil {
		return
	}
	s.server = nil
	sv.cancel()
	<-sv.done
	if reap {
		sv.reap(context.WithoutCancel(ctx))
	}
}

// reap kills every process of the box still running the server's command
// (an earlier run whose kill is under way, or one a killed runner left
// behind) and waits until each has ended: one instance at a time.
func (sv *server) reap(ctx context.Context) {
	c := sv.s.env.Client
	raw, err := c.Tool(ctx, "process", api.ProcessInput{Sandbox: sv.s.box, Action: "list"})
	var list api.ProcessOutput
	if err == nil {
		err = json.Unmarshal(raw, &list)
	}
	if err != nil {
		sv.s.log.Warn("list the box's processes to stop an earlier server", "box", sv.s.box, "error", err)
		return
	}
	for _, p := range list.Processes {
		if p.Running && p.Command == sv.command {
			if _, err := c.Tool(ctx, "process", api.ProcessInput{Sandbox: sv.s.box, Action: "kill", ID: p.ID}); err != nil {
				sv.s.log.Warn("stop an earlier server", "box", sv.s.box, "process", p.ID, "error", err)
			}
		}
	}
}

// supervise runs the command until ctx ends, restarting it with backoff.
func (sv *server) supervise(ctx context.Context) {
	defer close(sv.done)
	defer safe.Recover(sv.s.log, "supervise server of "+sv.s.box, nil)
	defer sv.update(context.Background(), func(st *ServerStatus) { st.State, st.RetryMs = ServerStopped, 0 })
	sv.reap(ctx)
	backoff := serverBackoffMin
	for run := 0; ctx.Err() == nil; run++ {
		started := time.Now().UTC()
		state := ServerRunning
		if sv.s.spec.Start.Port != 0 || sv.s.spec.Start.Ready != nil {
			state = ServerStarting
		}
		sv.update(ctx, func(st *ServerStatus) {
			st.State, st.Started, st.RetryMs, st.Error, st.Restarts = state, &started, 0, "", run
		})
		rctx, stopProbe := context.WithCancel(ctx)
		probed := make(chan struct{})
		go func() {
			defer close(probed)
			if sv.probe(rctx) {
				sv.update(rctx, func(st *ServerStatus) { st.State = ServerReady })
			}
		}()
		flushed := make(chan struct{})
		go func() { defer close(flushed); sv.flushOutput(rctx) }()
		res, err := sv.s.env.Client.Exec(ctx, sv.s.box, api.ExecRequest{
			Command: sv.command, Env: sv.env, Follow: true, // all the output, streamed: sv.output keeps its tail
		}, sv.output)
		stopProbe()
		<-probed
		<-flushed
		if ctx.Err() != nil {
			return
		}
		ran := time.Since(started)
		if ran >= serverResetAfter {
			backoff = serverBackoffMin
		}
		sv.update(ctx, func(st *ServerStatus) {
			st.State = ServerExited
			if err != nil {
				st.ExitCode, st.Error = nil, fmt.Sprintf("start %q in box %q: %v", sv.command, sv.s.box, err)
			} else {
				code := res.ExitCode
				st.ExitCode, st.Error = &code, ""
			}
		})
		sv.s.log.Info("server exited; restarting after backoff", "box", sv.s.box, "command", sv.command, "exit_code", res.ExitCode, "error", err, "backoff", backoff)
		sv.update(ctx, func(st *ServerStatus) { st.State, st.RetryMs = ServerBackoff, backoff.Milliseconds() })
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return
		}
		backoff = min(backoff*2, serverBackoffMax)
	}
}

// probe waits until the server is ready (true), with growing pauses
// between probes; without a port or ready command there is nothing to
// wait for (false).
func (sv *server) probe(ctx context.Context) bool {
	if sv.s.spec.Start.Port == 0 && sv.s.spec.Start.Ready == nil {
		return false
	}
	pause := 20 * time.Millisecond
	for {
		if ok := sv.readyOnce(ctx); ok {
			return true
		}
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return false
		}
		pause = min(pause*2, readyProbeMax)
	}
}

// readyOnce probes once: the port accepts a connection within a minute
// (the service's wait_port tool, which dials it through the agent, the
// waiting done next to the box), or the ready command exits 0.
func (sv *server) readyOnce(ctx context.Context) bool {
	if sv.s.spec.Start.Ready != nil {
		res, err := sv.s.env.Client.Exec(ctx, sv.s.box, api.ExecRequest{Command: sv.ready, Env: sv.env, TimeoutMs: 10000, MaxOutput: 1}, nil)
		return err == nil && res.ExitCode == 0
	}
	raw, err := sv.s.env.Client.Tool(ctx, "wait_port", api.WaitPortInput{Sandbox: sv.s.box, Port: sv.s.spec.Start.Port, TimeoutMs: 60000})
	var w api.WaitPortOutput
	return err == nil && json.Unmarshal(raw, &w) == nil && w.Listening
}

// output keeps the tail of the server's output.
func (sv *server) output(_ string, data []byte) {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	sv.tail = append(sv.tail, data...)
	if over := len(sv.tail) - ServerOutputLimit; over > 0 {
		sv.tail = append(sv.tail[:0], sv.tail[over:]...)
	}
	sv.dirty = true
}

// flushOutput writes new output to the cell at most every
// serverFlushEvery, until ctx ends (then once more).
func (sv *server) flushOutput(ctx context.Context) {
	t := time.NewTicker(serverFlushEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			sv.update(context.WithoutCancel(ctx), nil)
			return
		}
		sv.mu.Lock()
		dirty := sv.dirty
		sv.mu.Unlock()
		if dirty {
			sv.update(ctx, nil)
		}
	}
}

// update changes the status with fn (nil: only the output) and writes it,
// with the output's tail, to the node's output.
func (sv *server) update(ctx context.Context, fn func(st *ServerStatus)) {
	sv.mu.Lock()
	if fn != nil {
		fn(&sv.status)
	}
	sv.status.Output = strings.ToValidUTF8(string(sv.tail), "")
	sv.dirty = false
	st := sv.status
	sv.mu.Unlock()
	// No other server writes meanwhile: a new one starts only once this
	// one's supervisor has returned (stopServer).
	sv.s.modify(context.WithoutCancel(ctx), func(o *sandboxOutput) { o.Server = &st })
}
