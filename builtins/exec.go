package builtins

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/runtime"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandboxclient"
)

// DefaultExecTimeout bounds one exec run (all its commands) when the node
// sets no timeout.
const DefaultExecTimeout = 10 * time.Minute

// ExecSpec describes an exec node.
type ExecSpec struct {
	// Node is the node's output cell address; it names the node's boxes
	// (exec-<pattern>.<node>-<n>) and its log lines.
	Node cells.Address
	// Command holds the commands, run in order in one box, stopping at the
	// first that fails. Each Field gives a string or a list of strings
	// (spliced in); other values are formatted with Text.
	Command []Field
	// Image is the box image; nil or "" is the sandbox service's default.
	Image Field
	// Env holds the commands' environment variables, formatted with Text.
	Env map[string]Field
	// Files binds paths in the box: inputs are written before the first
	// command, outputs read back into result.files after the last.
	Files map[string]File
	// NoCache turns the memo cache off (commands with side effects).
	NoCache bool
	// Timeout bounds one run, commands and files; 0 is DefaultExecTimeout.
	Timeout time.Duration
	// Network is each run's box network, as sandbox_create's (nil:
	// closed). It is part of the memo key: what a run may reach is part
	// of what it computes.
	Network *api.Network
}

// Exec is the exec node kind, a runtime.Async: each run creates a fresh box
// (named exec-<pattern>.<node>-<n>), writes the input files, runs the
// commands in order, reads the output files back and destroys the box —
// also when the run is aborted or times out.
//
// Its result is an ExecResult: {stdout, stderr, exit_code, files}, stdout
// and stderr of all commands run, in order; exit_code of the last one run.
// A command exiting non-zero (or timing out) stops the list and fails the
// run with an *ExitError ("command 2 of 3 exited with 1: <last stderr
// line>") that carries the result as well. An output file the commands did
// not write fails a successful run; a "json" output that does not parse
// fails it naming the file.
//
// The memo key is a SHA-256 over the image name and its digest (the build
// the sandbox service would run, see imageDigest: an image rebuilt under
// the same name runs again), the commands, the env, the input files'
// content and the output declarations.
type Exec struct {
	env  Env
	spec ExecSpec
	log  *slog.Logger
	base string        // box name part: pattern.node
	runs atomic.Uint64 // numbers this process's boxes
}

var _ runtime.Async = (*Exec)(nil)

// ExecResult is the result of an exec run.
type ExecResult struct {
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	ExitCode int    `json:"exit_code"`
	// Truncated says a command printed more than the box keeps per stream
	// (1 MiB); the rest was dropped. Write big outputs to an output file.
	Truncated bool `json:"truncated,omitempty"`
	// Files maps each output path to its value: a string (text), the parsed
	// value (json), or null when a failed run did not write it.
	Files map[string]any `json:"files"`
}

// ExitError is a run whose command failed: it exited non-zero or timed
// out. Result is what the run produced up to and including that command.
type ExitError struct {
	Result ExecResult
	Msg    string
}

func (e *ExitError) Error() string { return e.Msg }

// PartialResult is the result to keep alongside the error.
func (e *ExitError) PartialResult() any { return e.Result }

// NewExec returns the exec node kind for spec.
func NewExec(env Env, spec ExecSpec) (*Exec, error) {
	if err := env.check(); err != nil {
		return nil, fmt.Errorf("exec node %s: %w", spec.Node.Name, err)
	}
	if len(spec.Command) == 0 {
		return nil, fmt.Errorf("exec node %s: no command", spec.Node.Name)
	}
	if err := checkFiles(spec.Files); err != nil {
		return nil, fmt.Errorf("exec node %s: %w", spec.Node.Name, err)
	}
	if spec.Timeout <= 0 {
		spec.Timeout = DefaultExecTimeout
	}
	return &Exec{env: env, spec: spec, log: env.logger().With("node", spec.Node.String()), base: boxBase(spec.Node, 40)}, nil
}

// execJob is one run, resolved from the inputs; its JSON is hashed into the
// memo key.
type execJob struct {
	Image string `json:"image"`
	// ImageDigest is the build of Image the service would run, "" when it
	// cannot tell (the key is then the name's, as it was before digests).
	ImageDigest string            `json:"image_digest,omitempty"`
	Commands    []string          `json:"commands"`
	Env         map[string]string `json:"env,omitempty"`
	Inputs      map[string]string `json:"inputs,omitempty"`  // path -> content
	Outputs     map[string]string `json:"outputs,omitempty"` // path -> format
	Network     *api.Network      `json:"network,omitempty"`
	// Timeout is the run's bound when it is not the default: a run that
	// timed out runs again once the pattern gives it more time.
	Timeout string `json:"timeout,omitempty"`
}

func (x *Exec) resolve(in runtime.Inputs) (execJob, error) {
	job := execJob{Network: x.spec.Network}
	if x.spec.Timeout != DefaultExecTimeout {
		job.Timeout = x.spec.Timeout.String()
	}
	var err error
	if job.Image, err = evalImage(x.spec.Image, in); err != nil {
		return job, err
	}
	for i, f := range x.spec.Command {
		v, err := f(in)
		if err != nil {
			return job, fmt.Errorf("command[%d]: %w", i, err)
		}
		items, ok := v.([]any)
		if !ok {
			items = []any{v}
		}
		for _, item := range items {
			s, err := Text(item)
			if err != nil {
				return job, fmt.Errorf("command[%d]: %w", i, err)
			}
			if strings.TrimSpace(s) == "" {
				return job, fmt.Errorf("command[%d] is empty (it evaluated to %q)", i, s)
			}
			job.Commands = append(job.Commands, s)
		}
	}
	if len(job.Commands) == 0 {
		return job, errors.New("no command to run: the command list evaluated to an empty list")
	}
	if job.Env, err = evalEnv(x.spec.Env, in); err != nil {
		return job, err
	}
	for p, f := range x.spec.Files {
		if f.Input == nil {
			if job.Outputs == nil {
				job.Outputs = map[string]string{}
			}
			job.Outputs[p] = f.Output
			continue
		}
		content, err := evalText(f.Input, in, "file "+p)
		if err != nil {
			return job, err
		}
		if job.Inputs == nil {
			job.Inputs = map[string]string{}
		}
		job.Inputs[p] = content
	}
	return job, nil
}

// Key is the memo key of the run the inputs ask for.
func (x *Exec) Key(in runtime.Inputs) (string, bool, error) {
	job, err := x.resolve(in)
	if err != nil {
		return "", false, err
	}
	job.ImageDigest = x.imageDigest(job.Image)
	return memoKey("exec/v1", job, !x.spec.NoCache)
}

// digestTimeout bounds asking the service for an image's digest: Key runs
// inside the runtime's batch.
const digestTimeout = 2 * time.Second

// imageDigest is the digest of the build of image a run would get, from
// the client (sandboxclient.ImageDigester), "" when it cannot say. It is
// cheap: the backend checks a stamp (a local rootfs's marker, one stat) or
// caches the engine's answer for at most a second (Docker), so a rebuild
// is seen at the next decision (Docker: within a second). An image that is
// not there has no digest: the key is the name's, and the run fails
// saying the image is missing (failures are not memoized). A failure to
// ask (the engine does not answer) falls back to the name too.
func (x *Exec) imageDigest(image string) string {
	d, ok := x.env.Client.(sandboxclient.ImageDigester)
	if !ok {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), digestTimeout)
	defer cancel()
	digest, err := d.ImageDigest(ctx, image)
	if err != nil {
		x.log.Warn("could not read the image's digest; the memo key holds its name alone", "image", imageName(image), "err", err)
		return ""
	}
	return digest
}

// memoKey is the memo key of an async node's resolved job: kind's prefix
// and a SHA-256 of the job's JSON; use says whether the node caches.
func memoKey(kind string, job any, use bool) (string, bool, error) {
	h, err := hashJSON(job)
	if err != nil {
		return "", false, fmt.Errorf("hash the %s job: %w", kind, err)
	}
	return kind + ":" + h, use, nil
}

// hashJSON is the SHA-256 (hex) of v's JSON.
func hashJSON(v any) (string, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:]), nil
}

// execGrace is how long a run may outlive its timeout: the agent kills a
// command at the timeout and reports it; the context ends after the grace,
// in case the agent does not answer.
const execGrace = 5 * time.Second

// Run runs the commands in a fresh box.
func (x *Exec) Run(ctx context.Context, in runtime.Inputs) (any, error) {
	job, err := x.resolve(in)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	deadline := start.Add(x.spec.Timeout)
	rctx, cancel := context.WithDeadline(ctx, deadline.Add(execGrace))
	defer cancel()
	// timedOut turns a failure caused by the run's own deadline into a
	// timeout error; an abort (ctx cancelled) stays what it is.
	timedOut := func(err error) error {
		if ctx.Err() == nil && rctx.Err() != nil {
			return fmt.Errorf("run timed out after %s (timeout %s): %w", time.Since(start).Round(time.Millisecond), x.spec.Timeout, err)
		}
		return err
	}
	box, err := x.createBox(rctx, job.Image, job.Network)
	if err != nil {
		return nil, timedOut(err)
	}
	created := time.Now()
	// The box goes once the run is over; with Env.Teardowns, after the
	// result is published.
	defer x.env.Teardowns.do(func() { destroyQuietly(ctx, x.env, box) })
	for _, p := range slices.Sorted(maps.Keys(job.Inputs)) {
		if err := upload(rctx, x.env.Client, box, p, job.Inputs[p]); err != nil {
			return nil, timedOut(err)
		}
	}
	uploaded := time.Now()
	res := ExecResult{Files: map[string]any{}}
	var stdout, stderr strings.Builder
	var failure string
	for i, cmd := range job.Commands {
		which := "command"
		if len(job.Commands) > 1 {
			which = fmt.Sprintf("command %d of %d", i+1, len(job.Commands))
		}
		left := time.Until(deadline)
		if left <= 0 {
			failure = fmt.Sprintf("%s did not start: the run timed out after %s (timeout %s) before it (the timeout counts from the run's start: making its box and writing its files too)", which, time.Since(start).Round(time.Millisecond), x.spec.Timeout)
			break
		}
		r, err := x.env.Client.Exec(rctx, box, api.ExecRequest{
			Command:   cmd,
			Env:       job.Env,
			TimeoutMs: int((left + time.Millisecond - 1) / time.Millisecond),
		}, nil)
		if err != nil {
			return nil, timedOut(fmt.Errorf("%s in box %q: %w", which, box, err))
		}
		stdout.WriteString(r.Stdout)
		stderr.WriteString(r.Stderr)
		res.ExitCode = r.ExitCode
		res.Truncated = res.Truncated || r.Truncated
		switch {
		case r.TimedOut:
			failure = fmt.Sprintf("%s timed out after %s (timeout %s)", which, time.Since(start).Round(time.Millisecond), x.spec.Timeout)
		case r.ExitCode != 0:
			failure = fmt.Sprintf("%s exited with %d", which, r.ExitCode)
			if l := lastLine(r.Stderr); l != "" {
				failure += ": " + l
			} else if l := lastLine(r.Stdout); l != "" {
				failure += ": " + l
			}
		}
		if failure != "" {
			break
		}
	}
	res.Stdout, res.Stderr = stdout.String(), stderr.String()
	ran := time.Now()
	defer func() {
		// Where a run's time goes (CELLBOX_BENCH_LOG=debug shows it).
		x.log.Debug("exec run", "box", box, "create", created.Sub(start), "upload", uploaded.Sub(created),
			"commands", ran.Sub(uploaded), "outputs", time.Since(ran))
	}()
	for _, p := range slices.Sorted(maps.Keys(job.Outputs)) {
		v, found, err := readOutput(rctx, x.env.Client, box, p, job.Outputs[p])
		switch {
		case err != nil && failure == "":
			return nil, timedOut(err)
		case err == nil && !found && failure == "":
			return nil, fmt.Errorf("output file %s (%s) was not written by the command", p, job.Outputs[p])
		}
		res.Files[p] = v // nil when missing or unreadable after a failure
	}
	if failure != "" {
		return nil, &ExitError{Result: res, Msg: failure}
	}
	return res, nil
}

// createBox creates this run's fresh box.
func (x *Exec) createBox(ctx context.Context, image string, network *api.Network) (string, error) {
	name := fmt.Sprintf("%s%s-%d", execBoxPrefix, x.base, x.runs.Add(1))
	for attempt := 0; ; attempt++ {
		out, err := x.env.Client.CreateBox(ctx, api.SandboxCreateInput{Sandbox: name, Image: image, Network: network})
		if err != nil {
			if ctx.Err() != nil {
				// Aborted while the box was being made: it may exist.
				destroyQuietly(ctx, x.env, name)
			}
			return "", fmt.Errorf("create box %q (image %s): %w", name, imageName(image), err)
		}
		if out.Created {
			return name, nil
		}
		// A box of that name is left over from an earlier process (one
		// that died mid-run): it is not fresh, so replace it.
		if attempt > 0 {
			return "", fmt.Errorf("create box %q: a box of that name exists and survived being destroyed", name)
		}
		x.log.Info("replacing a leftover box", "box", name)
		if err := x.env.Client.DestroyBox(ctx, name); err != nil {
			return "", fmt.Errorf("destroy leftover box %q: %w", name, err)
		}
	}
}

// execBoxPrefix starts the name of every exec box, and of no other box.
const execBoxPrefix = "exec-"

// IsExecBox says whether a box name is an exec run's (a fresh box that
// lives as long as one run).
func IsExecBox(name string) bool { return strings.HasPrefix(name, execBoxPrefix) }

// RemoveLeftoverExecBoxes destroys the exec boxes of env's session. Call
// it at start, before any pattern loads: an exec box lives only as long as
// its run, so one that exists then belongs to no live node — it is left
// over from a process that died mid-run (kill -9), whose deferred destroy
// never ran. Box names are numbered per process, so a restart does not
// reuse (and replace) them; without this they would stay forever, put to
// sleep with the session. It returns the names it removed.
func RemoveLeftoverExecBoxes(ctx context.Context, env Env) ([]string, error) {
	if err := env.check(); err != nil {
		return nil, err
	}
	raw, err := env.Client.Tool(ctx, "sandbox_list", api.SandboxListInput{})
	if err != nil {
		return nil, fmt.Errorf("list boxes to remove leftover exec boxes: %w", err)
	}
	var list api.SandboxListOutput
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("list boxes to remove leftover exec boxes: %w", err)
	}
	var removed []string
	var errs []error
	for _, b := range list.Sandboxes {
		if !IsExecBox(b.Name) {
			continue
		}
		if err := env.Client.DestroyBox(ctx, b.Name); err != nil && !noSuchBox(err) {
			errs = append(errs, fmt.Errorf("destroy leftover exec box %q: %w", b.Name, err))
			continue
		}
		env.logger().Info("removed a leftover exec box", "box", b.Name)
		removed = append(removed, b.Name)
	}
	return removed, errors.Join(errs...)
}

func imageName(image string) string {
	if image == "" {
		return "default"
	}
	return image
}
