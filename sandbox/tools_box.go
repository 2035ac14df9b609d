package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"strings"
	"syscall"
	"time"

	"github.com/distribution/reference"

	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/tools"
)

// Tool result caps.
const (
	shellOutputCap   = 64 << 10 // per stream
	shellTimeoutMs   = 30000
	processLogsCap   = 64 << 10
	killGrace        = 2 * time.Second
	fileToolMaxBytes = 2 << 20
)

// allTools is the registry, in the order tools are listed.
func allTools() []*tools.Tool {
	return append([]*tools.Tool{
		tools.Define("shell", tools.Meta{Title: "Run a shell command", Destructive: true, OpenWorld: true},
			"Run a shell command in a sandbox and return its stdout, stderr and exit code (each stream capped at 64 KiB; truncated says so). The command is killed with its whole process group after timeout_ms. Every process the command leaves running (`cmd &`, nohup, setsid) is ended when the call returns: start servers and long jobs with background: true and follow them with the process tool. If the sandbox is out of processes (a fork bomb), leftovers and then every other process are ended so the command can run; a notice says so.",
			shellTool),
		tools.Define("process", tools.Meta{Title: "Manage background processes", Destructive: true},
			"Manage background processes of a sandbox: list them, read a process's output from an offset (logs), or kill it (and its process group); kill_all ends every process of the sandbox but its agent.",
			processTool),
		tools.Define("read_file", tools.Meta{Title: "Read a file", ReadOnly: true, Idempotent: true},
			"Read a text file, a window of lines at a time (at most 2000 lines / 256 KiB per call; next_offset continues). A line longer than 2000 characters is cut, marked \"… [line truncated]\" (read a minified file with grep, or shell with head -c / cut). Binary files come back base64-encoded, 256 KiB at a time; their offset and next_offset count bytes.",
			readFileTool),
		tools.Define("write_file", tools.Meta{Title: "Write a file", Destructive: true},
			"Write (or append to) a file (at most 2 MiB). Parent directories are created; an existing file keeps its mode.",
			writeFileTool),
		tools.Define("edit", tools.Meta{Title: "Edit a file", Destructive: true},
			"Apply several replacements to a file at once. Each oldText must occur exactly once in the ORIGINAL file; edits must not overlap. Line endings and BOM are kept; small whitespace differences are tolerated. Returns a unified diff.",
			editTool),
		tools.Define("str_replace", tools.Meta{Title: "Replace text in a file", Destructive: true},
			"Replace old_str by new_str in a file. old_str must occur exactly once unless replace_all is set. Returns a unified diff.",
			strReplaceTool),
		tools.Define("grep", tools.Meta{Title: "Search file contents", ReadOnly: true, Idempotent: true},
			"Search file contents under a path (literal text, or a regular expression with regex: true). Returns matching lines with path and line number; truncated says the hit cap was reached — refine the query.",
			grepTool),
		tools.Define("glob", tools.Meta{Title: "Find files by pattern", ReadOnly: true, Idempotent: true},
			"List files matching a glob pattern (** matches across directories), sorted.",
			globTool),
		tools.Define("ls", tools.Meta{Title: "List a directory", ReadOnly: true, Idempotent: true},
			"List a directory two levels deep as a tree.",
			lsTool),
		tools.Define("transfer", tools.Meta{Title: "Copy between sandboxes", Destructive: true, Idempotent: true},
			"Copy a file, or with recursive a directory tree, from one sandbox of this session to another (or within one, though not a directory into itself). Binary-safe and streamed; an existing directory as the destination receives the copy inside it, as cp does.",
			transferTool),
		tools.Define("browse", tools.Meta{Title: "Open a box's server in a browser"},
			"Return a URL (http://ID.localhost:PORT/, an origin of its own on this server) that proxies to a TCP port inside a sandbox (works although sandboxes have no network). Start the server first (shell with background: true).",
			browseTool),
		tools.Define("wait_port", tools.Meta{Title: "Wait for a server's port", ReadOnly: true, Idempotent: true},
			"Wait until a TCP port inside a sandbox accepts connections (a server started in the background is up), at most timeout_ms. listening says whether it does.",
			waitPortTool),
		tools.Define("run_code", tools.Meta{Title: "Run code", Destructive: true, OpenWorld: true},
			"Run Python, JavaScript (node) or bash code in a sandbox and return stdout, stderr, the value of the last expression (repr / util.inspect), an exception with its traceback (bash: exit_code), and rich outputs (matplotlib plots as PNG; display(...) of HTML, SVG, JSON, images). Top-level await works in Python and JavaScript. Stateless by default (a fresh interpreter per call); pass context (from code_context_create) to keep variables, imports and definitions between calls. timeout_ms interrupts the code (a context survives). Images: python has matplotlib and numpy, node has node, host uses the host's /usr (python3).",
			runCodeTool),
		tools.Define("code_context_create", tools.Meta{Title: "Create a code context"},
			fmt.Sprintf("Start a code context: a long-running python, javascript (node) or bash interpreter in a sandbox whose variables, imports, definitions (and for bash cwd and shell variables) persist between run_code calls that name it. At most %d per sandbox; a context ends when its sandbox stops (restart or idle sleep).", agent.MaxCodeContexts),
			codeContextCreateTool),
		tools.Define("code_context_list", tools.Meta{Title: "List code contexts", ReadOnly: true, Idempotent: true},
			"List the code contexts of a sandbox with their language, number of calls and whether one is running.",
			codeContextListTool),
		tools.Define("code_context_delete", tools.Meta{Title: "Delete a code context", Destructive: true},
			"End a code context: its interpreter (and what it started) is killed and its state is gone.",
			codeContextDeleteTool),
		tools.Define("sandbox_create", tools.Meta{Title: "Create a sandbox", Idempotent: true},
			"Create a named sandbox with an image, environment, limits and network access; a no-op if it exists. Tools create sandboxes on first use anyway; use this to choose their settings.",
			sandboxCreateTool),
		tools.Define("network_set", tools.Meta{Title: "Set a sandbox's network allow list", Destructive: true, Idempotent: true},
			"Replace the network allow list of a sandbox, also a running one (the next connection obeys it): the destinations it may reach through the host's egress proxy, and headers (API keys) the proxy adds to its http:// requests so the key never enters the box. An empty list closes the network. Not for a sandbox created with network: true (full network).",
			networkSetTool),
		tools.Define("sandbox_list", tools.Meta{Title: "List sandboxes", ReadOnly: true, Idempotent: true},
			"List the sandboxes of this session with image, status (running; sleeping; dead: died and could not be restarted, retried on next use; lost: gone from the backend, recreated empty on next use), creation and last-use times.",
			sandboxListTool),
		tools.Define("sandbox_destroy", tools.Meta{Title: "Destroy a sandbox", Destructive: true, Idempotent: true},
			"Destroy a sandbox of this session and delete its files.",
			sandboxDestroyTool),
	}, snapshotTools()...)
}

// ShellBackground is the result of shell with background: true.
type shellBackground struct {
	ProcessID string `json:"process_id"`
	PID       int    `json:"pid"`
	Running   bool   `json:"running"`
	Hint      string `json:"hint"`
}

func shellTool(ctx context.Context, c *call, in api.ShellInput) (any, error) {
	if !in.Background {
		return runShell(ctx, c, in, shellOutputCap, false)
	}
	l, req, err := shellRequest(ctx, c, in, 0)
	if err != nil {
		return nil, err
	}
	p, err := l.client.Start(ctx, req)
	if err != nil {
		return nil, err
	}
	return shellBackground{ProcessID: p.ID, PID: p.PID, Running: p.Running,
		Hint: fmt.Sprintf(`started in the background; read its output with process {"action":"logs","id":%q}, stop it with process {"action":"kill","id":%q}`, p.ID, p.ID)}, nil
}

// shellRequest checks a command against the session's allowed_commands
// and leases its box.
func shellRequest(ctx context.Context, c *call, in api.ShellInput, maxOutput int) (*lease, agent.ExecRequest, error) {
	if strings.TrimSpace(in.Command) == "" {
		return nil, agent.ExecRequest{}, api.WithCode(api.CodeInvalidInput, errors.New("command is empty"))
	}
	if err := c.sess.allowed.check(in.Command, in.Env); err != nil {
		return nil, agent.ExecRequest{}, err
	}
	l, err := c.box(ctx, in.Sandbox)
	if err != nil {
		return nil, agent.ExecRequest{}, err
	}
	return l, agent.ExecRequest{
		Command:   in.Command,
		Cwd:       in.WorkingDir,
		Env:       mergeEnv(l.b.rec.Env, in.Env),
		TimeoutMs: in.TimeoutMs,
		MaxOutput: maxOutput,
	}, nil
}

// runShell runs a command in the foreground, keeping at most maxOutput
// bytes of each stream: the shell tool's handler, which the profiles'
// command tools (exec, bash) call with their own caps.
func runShell(ctx context.Context, c *call, in api.ShellInput, maxOutput int, keepLeftovers bool) (api.ShellOutput, error) {
	l, req, err := shellRequest(ctx, c, in, maxOutput)
	if err != nil {
		return api.ShellOutput{}, err
	}
	req.KeepLeftovers = keepLeftovers
	if req.TimeoutMs <= 0 {
		req.TimeoutMs = shellTimeoutMs
	}
	res, err := l.client.Exec(ctx, req, toolOutput(ctx)) // output as it comes to MCP progress (mcp.go)
	if err != nil {
		return api.ShellOutput{}, err
	}
	for _, n := range res.Notices {
		c.notice(n)
	}
	out := api.ShellOutput{
		Stdout:     res.Stdout,
		Stderr:     res.Stderr,
		ExitCode:   res.ExitCode,
		Truncated:  res.Truncated,
		TimedOut:   res.TimedOut,
		DurationMs: res.DurationMs,
	}
	if res.TimedOut {
		out.ProcessID = res.ProcessID
		out.Hint = fmt.Sprintf("the command was still running after %d ms and was killed with its process group; the output so far is above. Run servers and long jobs with background: true (then use the process tool), or raise timeout_ms.", req.TimeoutMs)
	} else if res.Truncated {
		out.Hint = fmt.Sprintf("output was cut at %d KiB per stream; redirect it to a file and read that with read_file or grep", maxOutput>>10)
	}
	return out, nil
}

// mergeEnv returns base overlaid with extra.
func mergeEnv(base, extra map[string]string) map[string]string {
	if len(base) == 0 {
		return extra
	}
	m := maps.Clone(base)
	maps.Copy(m, extra)
	return m
}

func processTool(ctx context.Context, c *call, in api.ProcessInput) (api.ProcessOutput, error) {
	var out api.ProcessOutput
	if in.Action != "list" && in.Action != "kill_all" && in.ID == "" {
		return out, api.WithCode(api.CodeInvalidInput, fmt.Errorf("process %s needs the id of a process (see process {\"action\":\"list\"})", in.Action))
	}
	l, err := c.box(ctx, in.Sandbox)
	if err != nil {
		return out, err
	}
	switch in.Action {
	case "list":
		ps, err := l.client.Processes(ctx)
		if err != nil {
			return out, err
		}
		out.Processes = []api.Process{}
		for _, p := range ps {
			out.Processes = append(out.Processes, api.Process(p))
		}
	case "logs":
		w := &capWriter{max: processLogsCap}
		// The output starts where the agent read from: past in.Offset
		// when its ring had dropped the bytes there.
		start, next, err := l.client.LogsFrom(ctx, in.ID, in.Offset, false, w)
		if err != nil {
			return out, err
		}
		out.Output = w.buf.String()
		out.NextOffset = next
		if start > in.Offset {
			out.Dropped = start - in.Offset
		}
		if w.dropped > 0 {
			out.Truncated = true
			out.NextOffset = start + int64(w.buf.Len())
		}
		p, err := findProcess(ctx, l.client, in.ID)
		if err != nil {
			return out, err
		}
		out.Running, out.ExitCode = &p.Running, p.ExitCode
	case "kill":
		p, err := killProcess(ctx, l.client, in.ID)
		if err != nil {
			return out, err
		}
		out.OK = true
		out.Running, out.ExitCode = &p.Running, p.ExitCode
	case "kill_all":
		n, err := l.client.KillAll(ctx)
		if err != nil {
			return out, err
		}
		out.OK, out.Ended = true, &n
	}
	return out, nil
}

func findProcess(ctx context.Context, cl *agent.Client, id string) (agent.Process, error) {
	ps, err := cl.Processes(ctx)
	if err != nil {
		return agent.Process{}, err
	}
	var ids []string
	for _, p := range ps {
		if p.ID == id {
			return p, nil
		}
		ids = append(ids, p.ID)
	}
	return agent.Process{}, api.WithCode(api.CodeNotFound, fmt.Errorf("no process %q in this sandbox (processes: %s)", id, listOrNone(ids)))
}

// killProcess sends SIGTERM to the process group, then SIGKILL if it has
// not ended after killGrace. Killing an ended process is not an error.
func killProcess(ctx context.Context, cl *agent.Client, id string) (agent.Process, error) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		p, err := findProcess(ctx, cl, id)
		if err != nil || !p.Running {
			return p, err
		}
		if err := cl.Signal(ctx, id, sig); err != nil && !agent.IsCode(err, agent.CodeInvalid) {
			return p, err // CodeInvalid: it ended meanwhile
		}
		wctx, cancel := context.WithTimeout(ctx, killGrace)
		p, err = cl.Wait(wctx, id)
		cancel()
		if err == nil && !p.Running {
			return p, nil
		}
	}
	return findProcess(ctx, cl, id)
}

// capWriter keeps the first max bytes written and counts the rest.
type capWriter struct {
	buf     strings.Builder
	max     int
	dropped int64
}

func (w *capWriter) Write(p []byte) (int, error) {
	n := len(p)
	if room := w.max - w.buf.Len(); room < len(p) {
		w.dropped += int64(len(p) - max(room, 0))
		p = p[:max(room, 0)]
	}
	w.buf.Write(p)
	return n, nil
}

var _ io.Writer = (*capWriter)(nil)

func sandboxCreateTool(ctx context.Context, c *call, in api.SandboxCreateInput) (api.SandboxCreateOutput, error) {
	name := in.Sandbox
	if name == "" {
		name = api.DefaultBox
	}
	out := api.SandboxCreateOutput{Sandbox: name}
	if err := CheckName(name); err != nil {
		return out, err
	}
	if len(c.sess.allowed) > 0 {
		if len(in.Env) > 0 {
			return out, c.sess.allowed.check("", in.Env)
		}
		if in.BoxID != "" {
			return out, api.WithCode(api.CodeRefused, fmt.Errorf("box_id refused: this session runs only allowed_commands %q, and a box shared with other sessions may be set up to run other code; use a box of this session", []string(c.sess.allowed)))
		}
	}
	if err := backend.ValidWorkDir(in.WorkspaceDir); err != nil {
		return out, api.WithCode(api.CodeInvalidInput, err)
	}
	if err := validImage(in.Image); err != nil {
		return out, api.WithCode(api.CodeInvalidInput, err)
	}
	spec := boxSpec{Image: in.Image, Env: in.Env, SleepAfterMs: in.SleepAfterMs,
		WorkspaceDir: in.WorkspaceDir, DestroyOnClose: in.DestroyOnClose}
	if n := in.Network; n != nil && n.Full {
		spec.Network = true
	} else if n != nil {
		pol, err := c.compileNetwork(&n.NetworkRules)
		if err != nil {
			return out, err
		}
		rules := n.NetworkRules
		spec.Egress, spec.policy = &rules, pol
	}
	if in.Limits != nil {
		spec.Limits = *in.Limits
	}
	// Checked here, not only by the backend: a box from the warm pool gets
	// its env per command and never meets the backend's check, and an
	// existing name must not hide a bad input behind created: false.
	if err := backend.ValidEnv(spec.Env); err != nil {
		return out, api.WithCode(api.CodeInvalidInput, err)
	}
	if err := toBackendLimits(spec.Limits).Validate(c.s.caps.MaxCPUs); err != nil {
		return out, api.WithCode(api.CodeInvalidInput, err)
	}
	s, sess := c.s, c.sess
	switch {
	case in.BoxID != "" && !in.ShareAcrossSessions:
		return out, api.WithCode(api.CodeInvalidInput, fmt.Errorf("box_id %q attaches this session to a box that every session naming it shares: what one session writes, the others read. Set share_across_sessions: true if that is intended, or omit box_id for a box private to this session", in.BoxID))
	case in.BoxID == "" && in.ShareAcrossSessions:
		return out, api.WithCode(api.CodeInvalidInput, errors.New("share_across_sessions needs box_id, the id of the shared box"))
	case in.BoxID != "":
		if len(in.BoxID) > maxNameLen || !boxIDRE.MatchString(in.BoxID) || strings.HasPrefix(in.BoxID, "cb-") {
			return out, api.WithCode(api.CodeInvalidInput, fmt.Errorf("invalid box_id %q: use 1-63 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit, and not with \"cb-\" (reserved for private boxes)", in.BoxID))
		}
		if n := len(socketPath(s.cfg.DataDir, in.BoxID)); n > maxSocketPath {
			return out, api.WithCode(api.CodeInvalidInput, fmt.Errorf("box_id %q is too long for this server's data dir (its agent socket path would have %d bytes, at most %d); use a shorter id", in.BoxID, n, maxSocketPath))
		}
		spec.ID, spec.Shared = in.BoxID, true
	}
	s.mu.Lock()
	if sess.deleted {
		s.mu.Unlock()
		return out, fmt.Errorf("session %s: %w", sess.ID, ErrNoSession)
	}
	b := sess.boxes[name]
	created := false
	switch {
	case b != nil && spec.Shared && b.rec.ID != spec.ID:
		s.mu.Unlock()
		return out, api.WithCode(api.CodeExists, fmt.Errorf("this session already has a sandbox named %q (%s); destroy it first or pick another name", name, b.rec.ID))
	case b != nil:
		if b.state == stateNew {
			created = true // being made by a concurrent call
		}
	case spec.Shared:
		b = s.boxes[spec.ID]
		if b != nil && !b.rec.Shared {
			s.mu.Unlock()
			return out, api.WithCode(api.CodeExists, fmt.Errorf("box_id %q is in use by a private box; pick another id", spec.ID))
		}
		if err := s.checkCapsLocked(sess, 1); err != nil {
			s.mu.Unlock()
			return out, fmt.Errorf("create sandbox %q: %w", name, err)
		}
		if b == nil {
			b = s.newBoxLocked(sess, spec)
			s.boxes[spec.ID] = b
			created = true
		}
		sess.boxes[name] = b
		s.log.Warn("session attaches a box shared across sessions", "session", sess.ID, "name", name, "box", spec.ID)
	default:
		if err := s.checkCapsLocked(sess, 1); err != nil {
			s.mu.Unlock()
			return out, fmt.Errorf("create sandbox %q: %w", name, err)
		}
		spec.OneShot = s.oneShot(name)
		b = s.newBoxLocked(sess, spec)
		sess.boxes[name] = b
		created = true
	}
	s.mu.Unlock()
	l, err := s.use(ctx, sess, name, b, c.notice)
	if err != nil {
		return out, err
	}
	c.leases = append(c.leases, l)
	if spec.Shared && !created {
		// Record the new binding of an existing shared box.
		s.mu.Lock()
		srec := s.sessionRecordLocked(sess)
		s.mu.Unlock()
		if err := s.st.apply(change{session: &srec}); err != nil {
			return out, err
		}
	}
	if !created && in.Image != "" && in.Image != b.rec.Image {
		c.notice(fmt.Sprintf("sandbox %q already exists with image %s; it was left as it is (destroy it first to change its image)", name, b.rec.Image))
	}
	if !created && in.Network != nil {
		c.notice(fmt.Sprintf("sandbox %q already exists; its network was left as it is (change an allow list with network_set)", name))
	}
	if have := cmp.Or(b.rec.WorkspaceDir, backend.Workspace); !created && in.WorkspaceDir != "" && in.WorkspaceDir != have {
		c.notice(fmt.Sprintf("sandbox %q already exists with workspace_dir %s; it was left as it is (destroy it first to change its workspace_dir)", name, have))
	}
	if !created && in.Limits != nil && *in.Limits != b.rec.Limits {
		c.notice(fmt.Sprintf("sandbox %q already exists; its limits were left as they are (destroy it first to change them)", name))
	}
	if !created && len(in.Env) > 0 && !maps.Equal(in.Env, b.rec.Env) {
		c.notice(fmt.Sprintf("sandbox %q already exists; its env was left as it is (destroy it first to change it, or pass env to each shell call)", name))
	}
	out.Created, out.ID = created, b.rec.ID
	return out, nil
}

func sandboxListTool(ctx context.Context, c *call, in api.SandboxListInput) (api.SandboxListOutput, error) {
	s, sess := c.s, c.sess
	out := api.SandboxListOutput{Sandboxes: []api.SandboxInfo{}}
	// Check the running boxes first, so that the list tells the truth
	// about boxes that died behind the server's back (they are restarted,
	// and the notice says so). Boxes busy with a transition are skipped.
	s.mu.Lock()
	boxes := maps.Clone(sess.boxes)
	s.mu.Unlock()
	for _, name := range sortedNames(boxes) {
		b := boxes[name]
		if b.life.TryLock() {
			if b.state == stateRunning {
				if err := s.check(ctx, sess, name, b, c.notice); err != nil {
					c.notice(err.Error())
				}
			}
			b.life.Unlock()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, name := range sortedNames(sess.boxes) {
		b := sess.boxes[name]
		if b.state == stateNew || b.state == stateRemoved {
			continue
		}
		status := b.state.String()
		out.Sandboxes = append(out.Sandboxes, api.SandboxInfo{
			Name: name, ID: b.rec.ID, Image: b.rec.Image, Status: status, Shared: b.rec.Shared, Network: networkInfo(b.rec),
			WorkspaceDir: cmp.Or(b.rec.WorkspaceDir, backend.Workspace), DestroyOnClose: b.rec.DestroyOnClose,
			Created: b.rec.Created, LastUsed: time.Unix(0, b.lastUsed.Load()).UTC(),
		})
	}
	return out, nil
}

func sandboxDestroyTool(ctx context.Context, c *call, in api.SandboxDestroyInput) (api.OKOutput, error) {
	if err := c.s.destroyBox(ctx, c.sess, in.Sandbox); err != nil {
		return api.OKOutput{}, err
	}
	return api.OKOutput{OK: true}, nil
}

// allowList is a session's allowed_commands (seed 003's allowedCommands):
// the prefixes every command line of the session must start with. Empty
// allows everything. It is checked on the host, before a command reaches
// a box, and it is set only when the session is made (by whoever holds the
// server key), so the agent using the session cannot widen it.
type allowList []string

// shellControl are the characters that would let a command line that
// starts with an allowed prefix run something else: chaining (; & |), a
// substitution ($ `), a redirection or process substitution (< > ( )), a
// second line. A session with an allow-list refuses them outright, even
// quoted, rather than parse shell.
const shellControl = ";&|`$<>()\n\r"

func newAllowList(prefixes []string) (allowList, error) {
	var out allowList
	for _, p := range prefixes {
		p = strings.TrimSpace(p)
		if p == "" {
			return nil, errors.New("allowed_commands: an empty prefix would allow every command; leave allowed_commands out for that")
		}
		if i := strings.IndexAny(p, shellControl); i >= 0 {
			return nil, fmt.Errorf("allowed_commands: prefix %q holds %q; give plain command prefixes such as \"git status\" or \"ls\"", p, p[i:i+1])
		}
		out = append(out, p)
	}
	return out, nil
}

// check refuses a command line (and extra environment) the list does not
// allow, saying what is allowed; the error has the code refused.
func (a allowList) check(command string, env map[string]string) error {
	return api.WithCode(api.CodeRefused, a.refusal(command, env))
}

func (a allowList) refusal(command string, env map[string]string) error {
	if len(a) == 0 {
		return nil
	}
	cmd := strings.TrimSpace(command)
	allowed := fmt.Sprintf("%q", []string(a))
	if i := strings.IndexAny(cmd, shellControl); i >= 0 {
		return fmt.Errorf("command %q refused: this session runs only commands starting with one of %s (allowed_commands), and %q could run another command; run one allowed command per call, without ; & | ` $ < > ( ) or line breaks", cmd, allowed, cmd[i:i+1])
	}
	if len(env) > 0 {
		return fmt.Errorf("env refused: this session runs only allowed_commands %s, and variables such as BASH_ENV or LD_PRELOAD could run other code; leave env out", allowed)
	}
	for _, p := range a {
		if rest, ok := strings.CutPrefix(cmd, p); ok && (rest == "" || rest[0] == ' ' || rest[0] == '\t') {
			return nil
		}
	}
	return fmt.Errorf("command %q is not allowed in this session: a command must start with one of %s (allowed_commands, set when the session was made)", cmd, allowed)
}

// validImage checks an image name: "" or the default, or a Docker
// reference (cellbox/python, registry.example/x:tag), as both backends
// name images.
func validImage(img string) error {
	if img == "" || img == backend.DefaultImage {
		return nil
	}
	if _, err := reference.ParseNormalizedNamed(img); err != nil {
		return fmt.Errorf("image %q: %v; give an image such as cellbox/python (built with `cellbox image build python`) or %q", img, err, backend.DefaultImage)
	}
	return nil
}
