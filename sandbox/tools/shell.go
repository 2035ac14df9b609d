package tools

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"strings"
	"syscall"
	"time"

	"github.com/cellbox/cellbox/internal/suggest"
	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/api"
)

// Tool result caps.
const (
	// ShellOutputCap is what the shell tool keeps of each stream.
	ShellOutputCap = 64 << 10
	// ShellTimeoutMs is the shell tool's timeout when the call gives none.
	ShellTimeoutMs = 30000
	processLogsCap = 64 << 10
	killGrace      = 2 * time.Second
)

// ShellBackground is the result of shell with background: true.
type ShellBackground struct {
	ProcessID string `json:"process_id"`
	PID       int    `json:"pid"`
	Running   bool   `json:"running"`
	Hint      string `json:"hint"`
}

func shellTool(ctx context.Context, c Call, in api.ShellInput) (any, error) {
	if !in.Background {
		return RunShell(ctx, c, in, ShellOutputCap, false)
	}
	l, req, err := shellRequest(ctx, c, in, 0)
	if err != nil {
		return nil, err
	}
	p, err := l.Client.Start(ctx, req)
	if err != nil {
		return nil, err
	}
	return ShellBackground{ProcessID: p.ID, PID: p.PID, Running: p.Running,
		Hint: fmt.Sprintf(`started in the background; read its output with process {"action":"logs","id":%q}, stop it with process {"action":"kill","id":%q}`, p.ID, p.ID)}, nil
}

// shellRequest checks a command against the session's allowed_commands
// and leases its box.
func shellRequest(ctx context.Context, c Call, in api.ShellInput, maxOutput int) (Box, agent.ExecRequest, error) {
	if strings.TrimSpace(in.Command) == "" {
		return Box{}, agent.ExecRequest{}, api.WithCode(api.CodeInvalidInput, errors.New("command is empty"))
	}
	if err := c.Allowed().Check(in.Command, in.Env); err != nil {
		return Box{}, agent.ExecRequest{}, err
	}
	l, err := c.Box(ctx, in.Sandbox)
	if err != nil {
		return Box{}, agent.ExecRequest{}, err
	}
	return l, agent.ExecRequest{
		Command:   in.Command,
		Cwd:       in.WorkingDir,
		Env:       MergeEnv(l.Env, in.Env),
		TimeoutMs: in.TimeoutMs,
		MaxOutput: maxOutput,
	}, nil
}

// RunShell runs a command in the foreground, keeping at most maxOutput
// bytes of each stream (what a command leaves running is ended unless
// keepLeftovers): the shell tool's handler, which the profiles' command
// tools (exec, bash) call with their own caps.
func RunShell(ctx context.Context, c Call, in api.ShellInput, maxOutput int, keepLeftovers bool) (api.ShellOutput, error) {
	l, req, err := shellRequest(ctx, c, in, maxOutput)
	if err != nil {
		return api.ShellOutput{}, err
	}
	req.KeepLeftovers = keepLeftovers
	if req.TimeoutMs <= 0 {
		req.TimeoutMs = ShellTimeoutMs
	}
	res, err := l.Client.Exec(ctx, req, Output(ctx)) // output as it comes to MCP progress (mcp.go)
	if err != nil {
		return api.ShellOutput{}, err
	}
	for _, n := range res.Notices {
		c.Notice(n)
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

// MergeEnv returns base overlaid with extra.
func MergeEnv(base, extra map[string]string) map[string]string {
	if len(base) == 0 {
		return extra
	}
	m := maps.Clone(base)
	maps.Copy(m, extra)
	return m
}

func processTool(ctx context.Context, c Call, in api.ProcessInput) (api.ProcessOutput, error) {
	var out api.ProcessOutput
	if in.Action != "list" && in.Action != "kill_all" && in.ID == "" {
		return out, api.WithCode(api.CodeInvalidInput, fmt.Errorf("process %s needs the id of a process (see process {\"action\":\"list\"})", in.Action))
	}
	l, err := c.Box(ctx, in.Sandbox)
	if err != nil {
		return out, err
	}
	switch in.Action {
	case "list":
		ps, err := l.Client.Processes(ctx)
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
		start, next, err := l.Client.LogsFrom(ctx, in.ID, in.Offset, false, w)
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
		p, err := findProcess(ctx, l.Client, in.ID)
		if err != nil {
			return out, err
		}
		out.Running, out.ExitCode = &p.Running, p.ExitCode
	case "kill":
		p, err := killProcess(ctx, l.Client, in.ID)
		if err != nil {
			return out, err
		}
		out.OK = true
		out.Running, out.ExitCode = &p.Running, p.ExitCode
	case "kill_all":
		n, err := l.Client.KillAll(ctx)
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
	return agent.Process{}, api.WithCode(api.CodeNotFound, fmt.Errorf("no process %q in this sandbox (processes: %s)", id, suggest.ListOrNone(ids)))
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
