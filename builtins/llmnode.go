package builtins

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/cellbox/cellbox/builtins/llm"
	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/runtime"
	"github.com/cellbox/cellbox/sandboxclient"
)

// DefaultLLMTimeout bounds one llm run (all its turns and tool calls) when
// the node sets no timeout.
const DefaultLLMTimeout = 10 * time.Minute

// DefaultProviderEnv names the variable holding the provider of llm nodes
// that set none.
const DefaultProviderEnv = "CELLBOX_LLM_PROVIDER"

// LLMEnv is where llm nodes find their providers: the environment (keys
// and base URLs, see llm.New) and the HTTP client. Never cells: a key must
// not land in the store, a log or the live view.
type LLMEnv struct {
	// Getenv defaults to os.Getenv.
	Getenv llm.Getenv
	// HTTP defaults to http.DefaultClient.
	HTTP *http.Client
}

// LLMSpec describes an llm node.
type LLMSpec struct {
	Node cells.Address
	// Provider is "anthropic" or "openai" (any OpenAI-compatible server);
	// "" is the runner's default, CELLBOX_LLM_PROVIDER.
	Provider string
	// Model names the model (required). System is the system prompt.
	Model, System Field
	// Prompt is the user's message (text); Messages a whole conversation,
	// a list of {role, content} (content a string or a list of blocks).
	// One of the two.
	Prompt, Messages Field
	// MaxTokens, Temperature and MaxTurns are numbers; nil leaves the
	// default (llm.DefaultMaxTokens, the provider's, llm.DefaultMaxTurns).
	MaxTokens, Temperature, MaxTurns Field
	// Tools, if set, gives the model a sandbox node's tools.
	Tools *LLMTools
	// NoCache turns the memo cache off.
	NoCache bool
	// Timeout bounds one run: a duration ("5m") or a number of seconds;
	// nil is DefaultLLMTimeout. It is not part of the memo key.
	Timeout Field
}

// LLMTools binds the registry's tools to a sandbox node's box.
type LLMTools struct {
	// Sandbox is the node whose box the tools act on and whose history
	// records each call.
	Sandbox *Sandbox
	// Allow lists the tools the model gets (by registry name); empty is
	// the default set (BoxTools).
	Allow []string
}

// LLM is the llm node kind, a runtime.Async: it calls a chat model and,
// when given tools, runs the tool loop until the model answers without
// asking for one (or max_turns). Its result is an LLMResult; a failed
// run keeps the conversation so far beside the error.
//
// The memo key hashes the request (provider, model, system, messages,
// tool definitions, parameters), the box and allow-list, never a key or
// a URL: a restart or a revert does not repeat a finished call.
type LLM struct {
	env  Env
	spec LLMSpec
	log  *slog.Logger
}

var _ runtime.Async = (*LLM)(nil)

// LLMResult is an llm node's result.
type LLMResult = llm.LoopResult

// LLMError is a failed run with the conversation so far.
type LLMError struct {
	Result LLMResult
	Err    error
}

func (e *LLMError) Error() string      { return e.Err.Error() }
func (e *LLMError) Unwrap() error      { return e.Err }
func (e *LLMError) PartialResult() any { return e.Result }

// NewLLM returns the llm node kind for spec.
func NewLLM(env Env, spec LLMSpec) (*LLM, error) {
	if spec.Model == nil {
		return nil, fmt.Errorf("llm node %s: no model", spec.Node.Name)
	}
	if (spec.Prompt == nil) == (spec.Messages == nil) {
		return nil, fmt.Errorf("llm node %s: give prompt or messages (one of the two)", spec.Node.Name)
	}
	if spec.Provider != "" && !slices.Contains(llm.Providers, spec.Provider) {
		_, err := llm.New(spec.Provider, func(string) string { return "" }, nil)
		return nil, fmt.Errorf("llm node %s: %w", spec.Node.Name, err)
	}
	if spec.Tools != nil {
		if spec.Tools.Sandbox == nil {
			return nil, fmt.Errorf("llm node %s: tools name no sandbox node", spec.Node.Name)
		}
		if err := env.check(); err != nil {
			return nil, fmt.Errorf("llm node %s: %w", spec.Node.Name, err)
		}
		if _, ok := env.Client.(sandboxclient.ToolLister); !ok {
			return nil, fmt.Errorf("llm node %s: the sandbox client cannot list tools", spec.Node.Name)
		}
	}
	if env.LLM.Getenv == nil {
		env.LLM.Getenv = os.Getenv
	}
	return &LLM{env: env, spec: spec, log: env.logger().With("node", spec.Node.String())}, nil
}

// llmJob is one run resolved from the inputs; its JSON is the memo key's.
type llmJob struct {
	Provider string      `json:"provider"`
	Request  llm.Request `json:"request"`
	MaxTurns int         `json:"max_turns"`
	Box      string      `json:"box,omitempty"`
	// Timeout bounds the run; a different bound asks for the same answer.
	Timeout time.Duration `json:"-"`
}

func (l *LLM) resolve(in runtime.Inputs) (llmJob, error) {
	job := llmJob{Provider: l.spec.Provider}
	if job.Provider == "" {
		if job.Provider = l.env.LLM.Getenv(DefaultProviderEnv); job.Provider == "" {
			return job, fmt.Errorf("no provider: set provider in the node (%s) or %s in the runner's environment", strings.Join(llm.Providers, ", "), DefaultProviderEnv)
		}
	}
	var err error
	if job.Request.Model, err = evalText(l.spec.Model, in, "model"); err != nil {
		return job, err
	}
	if strings.TrimSpace(job.Request.Model) == "" {
		return job, errors.New("model is empty: name the model (e.g. claude-sonnet-4-5, gpt-4o, llama3.1)")
	}
	if l.spec.System != nil {
		if job.Request.System, err = evalText(l.spec.System, in, "system"); err != nil {
			return job, err
		}
	}
	if l.spec.Prompt != nil {
		p, err := evalText(l.spec.Prompt, in, "prompt")
		if err != nil {
			return job, err
		}
		if strings.TrimSpace(p) == "" {
			return job, errors.New("prompt is empty")
		}
		job.Request.Messages = []llm.Message{llm.Text("user", p)}
	} else {
		v, err := l.spec.Messages(in)
		if err != nil {
			return job, fmt.Errorf("messages: %w", err)
		}
		if job.Request.Messages, err = toMessages(v); err != nil {
			return job, err
		}
	}
	num := func(f Field, what string) (float64, bool, error) {
		if f == nil {
			return 0, false, nil
		}
		v, err := f(in)
		if err != nil || v == nil {
			return 0, false, err
		}
		switch x := v.(type) {
		case int:
			return float64(x), true, nil
		case float64:
			return x, true, nil
		}
		return 0, false, fmt.Errorf("%s is %v, not a number", what, v)
	}
	if n, ok, err := num(l.spec.MaxTokens, "max_tokens"); err != nil {
		return job, err
	} else if ok {
		if n != math.Trunc(n) {
			return job, fmt.Errorf("max_tokens is %v: give a whole number", n)
		}
		job.Request.MaxTokens = int(n)
	}
	if n, ok, err := num(l.spec.Temperature, "temperature"); err != nil {
		return job, err
	} else if ok {
		job.Request.Temperature = &n
	}
	if n, ok, err := num(l.spec.MaxTurns, "max_turns"); err != nil {
		return job, err
	} else if ok {
		if n < 1 || n != math.Trunc(n) {
			return job, fmt.Errorf("max_turns is %v: give a whole number, at least 1", n)
		}
		job.MaxTurns = int(n)
	}
	if job.MaxTurns == 0 {
		job.MaxTurns = llm.DefaultMaxTurns
	}
	if job.Timeout, err = evalTimeout(l.spec.Timeout, in); err != nil {
		return job, err
	}
	if l.spec.Tools != nil {
		job.Box = l.spec.Tools.Sandbox.BoxName()
		// The names only: the definitions are listed at run time, and
		// the registry's are fixed per binary.
		for _, n := range l.spec.Tools.Allow {
			job.Request.Tools = append(job.Request.Tools, llm.Tool{Name: n})
		}
	}
	return job, nil
}

// evalTimeout reads a timeout: a duration string or a number of seconds.
func evalTimeout(f Field, in runtime.Inputs) (time.Duration, error) {
	if f == nil {
		return DefaultLLMTimeout, nil
	}
	v, err := f(in)
	if err != nil {
		return 0, fmt.Errorf("timeout: %w", err)
	}
	var d time.Duration
	switch x := v.(type) {
	case nil:
		return DefaultLLMTimeout, nil
	case string:
		d, err = time.ParseDuration(x)
	case int:
		d = time.Duration(x) * time.Second
	case float64:
		d = time.Duration(x * float64(time.Second))
	default:
		err = errors.New("not a duration")
	}
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("timeout is %v: want a positive duration such as 30s or 5m, or a number of seconds", v)
	}
	return d, nil
}

// toMessages reads a messages value: a list of {role, content}, content a
// string or a list of blocks as llm.Block.
func toMessages(v any) ([]llm.Message, error) {
	items, ok := v.([]any)
	if !ok || len(items) == 0 {
		return nil, fmt.Errorf(`messages is %v: want a list like [{"role": "user", "content": "..."}]`, v)
	}
	var out []llm.Message
	for i, it := range items {
		m, ok := it.(map[string]any)
		role, _ := m["role"].(string)
		if !ok || (role != "user" && role != "assistant") {
			return nil, fmt.Errorf(`messages[%d]: want {"role": "user"|"assistant", "content": ...}`, i)
		}
		switch c := m["content"].(type) {
		case string:
			out = append(out, llm.Text(role, c))
		default:
			raw, _ := json.Marshal(c)
			var blocks []llm.Block
			if err := json.Unmarshal(raw, &blocks); err != nil || len(blocks) == 0 {
				return nil, fmt.Errorf("messages[%d].content: want a string or a list of blocks", i)
			}
			out = append(out, llm.Message{Role: role, Content: blocks})
		}
	}
	return out, nil
}

// Key is the memo key of the call the inputs ask for. A provider that
// cannot be set up (no key in the environment) fails the node at once.
func (l *LLM) Key(in runtime.Inputs) (string, bool, error) {
	job, err := l.resolve(in)
	if err != nil {
		return "", false, err
	}
	if _, err := llm.New(job.Provider, l.env.LLM.Getenv, l.env.LLM.HTTP); err != nil {
		return "", false, err
	}
	return memoKey("llm/v1", job, !l.spec.NoCache)
}

// Run calls the model and runs the tool loop.
func (l *LLM) Run(ctx context.Context, in runtime.Inputs) (any, error) {
	job, err := l.resolve(in)
	if err != nil {
		return nil, err
	}
	p, err := llm.New(job.Provider, l.env.LLM.Getenv, l.env.LLM.HTTP)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, job.Timeout)
	defer cancel()
	var run llm.ToolRunner
	hooks := l.progress(ctx)
	if l.spec.Tools != nil {
		ts, err := BoxTools(ctx, l.env.Client, l.spec.Tools.Allow)
		if err != nil {
			return nil, err
		}
		job.Request.Tools, hooks.Unknown = ts.Tools, ts.Unknown
		run = l.runTool(ts, job.Box)
	}
	p, run = resumable(job, p, run)
	res, err := llm.Loop(ctx, p, job.Request, run, job.MaxTurns, hooks)
	if err != nil {
		if ctx.Err() == context.DeadlineExceeded {
			err = fmt.Errorf("timed out after %s (timeout): %w", job.Timeout, err)
		}
		return nil, &LLMError{Result: res, Err: err}
	}
	return res, nil
}

// resumable makes a run skip the steps an earlier run of the same job
// finished (runtime.RecallStep): a runner killed mid-loop, started again,
// resumes after the last completed model call and tool call instead of
// calling the model — and running the tools in the box — again. A model
// call is keyed by its whole request; a tool call by its place in the run
// (the calls before it came from remembered answers, so the same calls
// come in the same order); both belong to the job (the inputs), so a
// changed input starts afresh.
func resumable(job llmJob, p llm.Provider, run llm.ToolRunner) (llm.Provider, llm.ToolRunner) {
	jobKey, err := hashJSON(job)
	if err != nil {
		return p, run // a job that cannot be hashed is not resumed
	}
	p = stepProvider{p, jobKey}
	if run == nil {
		return p, nil
	}
	seq := 0
	return p, func(ctx context.Context, call llm.ToolCall) (string, bool) {
		seq++
		h, err := hashJSON([]any{jobKey, seq, call})
		if err != nil {
			return run(ctx, call)
		}
		key := "llm-tool/v1:" + h
		var done struct {
			Result  string `json:"result"`
			IsError bool   `json:"is_error"`
		}
		if raw, ok := runtime.RecallStep(ctx, key); ok && json.Unmarshal(raw, &done) == nil {
			return done.Result, done.IsError
		}
		done.Result, done.IsError = run(ctx, call)
		if ctx.Err() == nil {
			_ = runtime.RememberStep(ctx, key, done)
		}
		return done.Result, done.IsError
	}
}

// stepProvider remembers each finished model call of a job.
type stepProvider struct {
	llm.Provider
	job string
}

func (s stepProvider) Stream(ctx context.Context, req llm.Request, onText func(string)) (llm.Response, error) {
	h, err := hashJSON([]any{s.job, req})
	if err != nil {
		return s.Provider.Stream(ctx, req, onText)
	}
	key := "llm-call/v1:" + h
	var r llm.Response
	if raw, ok := runtime.RecallStep(ctx, key); ok && json.Unmarshal(raw, &r) == nil {
		if onText != nil && r.Text != "" {
			onText(r.Text)
		}
		return r, nil
	}
	r, err = s.Provider.Stream(ctx, req, onText)
	if err == nil {
		_ = runtime.RememberStep(ctx, key, r)
	}
	return r, err
}

// progressEvery throttles the partial results an answer publishes as it
// streams: each is a store write and a change for the cell's readers.
const progressEvery = 100 * time.Millisecond

// progress publishes the run's partial result while it runs: the text of
// the turn in flight as it streams, the tool calls so far, the turn.
func (l *LLM) progress(ctx context.Context) llm.LoopHooks {
	var part LLMResult
	var last time.Time
	publish := func(force bool) {
		if !force && time.Since(last) < progressEvery {
			return
		}
		last = time.Now()
		if err := runtime.Progress(ctx, part); err != nil {
			l.log.Warn("publish the answer so far", "error", err)
		}
	}
	return llm.LoopHooks{
		Text: func(turn int, piece string) {
			if turn != part.Turns {
				part.Turns, part.Text = turn, ""
			}
			part.Text += piece
			publish(false)
		},
		ToolCall: func(call llm.ToolCall) {
			part.ToolCalls = append(part.ToolCalls, call)
			publish(true)
		},
	}
}

// BoxToolSet is what a model bound to one box gets (an llm node's tools,
// cellbox chat): the tools it is offered and the rules its calls are
// checked against. It is the one place those rules live.
type BoxToolSet struct {
	// Tools are the offered tools, without their sandbox parameter.
	Tools []llm.Tool
	// allow is the allow list as given (nil: the default set).
	allow []string
	// all names every tool of the registry.
	all []string
}

// withheldTools are the box tools a model gets only when its allow list
// names them: they make, remove or re-make boxes, or change a box's
// network. sandbox_destroy then sandbox_create {"network": true} would
// give the model's box the full network (network_set, an allow list);
// re-made boxes lose the pattern's limits; fork and branch make boxes
// the pattern does not know. The other tools not about one box
// (sandbox_list, transfer, snapshot_list, snapshot_delete) are left out
// of the default set too.
var withheldTools = []string{"sandbox_create", "sandbox_destroy", "fork", "branch", "network_set"}

// BoxTools returns the tool set of a model bound to one box: the
// registry's tools that allow names, or when allow is empty every tool
// about one box except withheldTools. A model that may not call
// network_set may not give a box a network another way either: allow
// naming branch (whose box takes the network of the snapshot's box)
// without network_set is an error, and sandbox_create's network field is
// refused at the call (Runner).
func BoxTools(ctx context.Context, c sandboxclient.Client, allow []string) (*BoxToolSet, error) {
	lister, ok := c.(sandboxclient.ToolLister)
	if !ok {
		return nil, errors.New("the sandbox client cannot list tools")
	}
	infos, err := lister.Tools(ctx)
	if err != nil {
		return nil, fmt.Errorf("list the sandbox tools: %w", err)
	}
	ts := &BoxToolSet{allow: allow}
	for _, ti := range infos {
		ts.all = append(ts.all, ti.Name)
		if len(allow) > 0 && !slices.Contains(allow, ti.Name) {
			continue
		}
		schema, bound, err := unbindSandbox(ti.InputSchema)
		if err != nil {
			return nil, fmt.Errorf("tool %s: %w", ti.Name, err)
		}
		if len(allow) == 0 && (!bound || slices.Contains(withheldTools, ti.Name)) {
			continue
		}
		ts.Tools = append(ts.Tools, llm.Tool{Name: ti.Name, Description: ti.Description, InputSchema: schema})
	}
	for _, a := range allow {
		if !slices.Contains(ts.all, a) {
			return nil, fmt.Errorf("allow names tool %q, which the sandbox service does not have (tools: %s)", a, strings.Join(ts.all, ", "))
		}
	}
	if ts.offers("branch") && !ts.offers("network_set") {
		return nil, errors.New("allow names branch but not network_set: branch gives its new box the network of the snapshot's box, which may be another box's full network; name network_set too, or leave branch out")
	}
	return ts, nil
}

func (ts *BoxToolSet) offers(name string) bool {
	return slices.ContainsFunc(ts.Tools, func(t llm.Tool) bool { return t.Name == name })
}

func (ts *BoxToolSet) names() string {
	var out []string
	for _, t := range ts.Tools {
		out = append(out, t.Name)
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

// Unknown is the tool error of a call of a tool the set does not offer
// (llm.LoopHooks.Unknown): it says why, and which allow list would offer it.
func (ts *BoxToolSet) Unknown(name string) string {
	switch {
	case !slices.Contains(ts.all, name):
		return fmt.Sprintf("unknown tool %q: the tools you may call are %s", name, ts.names())
	case len(ts.allow) > 0:
		return fmt.Sprintf("tool %q is not in this model's allow list (%s): the tools you may call are %s", name, strings.Join(ts.allow, ", "), ts.names())
	case slices.Contains(withheldTools, name):
		return fmt.Sprintf("tool %q is withheld from this model: it makes, removes or re-makes boxes or changes a box's network, so a model gets it only when its allow list names it (the llm node's tools.allow, cellbox chat --allow); the tools you may call are %s", name, ts.names())
	}
	return fmt.Sprintf("tool %q is not about this model's one box, so a model gets it only when its allow list names it (the llm node's tools.allow, cellbox chat --allow); the tools you may call are %s", name, ts.names())
}

// refuse says why call may not run, "" if it may: a tool the set does not
// offer; a network for a new box without network_set; a box shared
// across sessions, which is the pattern's to attach, never a model's.
func (ts *BoxToolSet) refuse(call llm.ToolCall, input map[string]any) string {
	if !ts.offers(call.Name) {
		return ts.Unknown(call.Name)
	}
	if call.Name != "sandbox_create" {
		return ""
	}
	if v := input["network"]; v != nil && v != false && !ts.offers("network_set") {
		return "sandbox_create with network is refused: this model may not change a box's network (its allow list does not name network_set); leave network out"
	}
	if id, _ := input["box_id"].(string); id != "" || input["share_across_sessions"] == true {
		return "sandbox_create with box_id or share_across_sessions is refused: a model cannot attach its box to a box shared across sessions; leave them out"
	}
	return ""
}

// Runner runs a model's tool calls in box through the registry: a call
// the set refuses goes back as a tool error, the sandbox field is set to
// box (whatever the model put there), a tool error goes back as the
// result text with isError.
func (ts *BoxToolSet) Runner(c sandboxclient.Client, box string) llm.ToolRunner {
	return func(ctx context.Context, call llm.ToolCall) (string, bool) {
		var input map[string]any
		if err := json.Unmarshal(call.Input, &input); err != nil || input == nil {
			return fmt.Sprintf("the input of %s is not a JSON object: %s", call.Name, call.Input), true
		}
		if why := ts.refuse(call, input); why != "" {
			return why, true
		}
		input["sandbox"] = box
		res, err := c.Tool(ctx, call.Name, input)
		if err != nil {
			var te *sandboxclient.ToolError
			if errors.As(err, &te) && len(res) > 0 {
				return string(res), true
			}
			return err.Error(), true
		}
		return string(res), false
	}
}

// unbindSandbox removes the sandbox property from a tool's input schema;
// bound says the tool had one.
func unbindSandbox(schema json.RawMessage) (json.RawMessage, bool, error) {
	var s map[string]any
	if err := json.Unmarshal(schema, &s); err != nil {
		return nil, false, err
	}
	props, _ := s["properties"].(map[string]any)
	if _, ok := props["sandbox"]; !ok {
		return schema, false, nil
	}
	delete(props, "sandbox")
	if req, ok := s["required"].([]any); ok {
		s["required"] = slices.DeleteFunc(slices.Clone(req), func(v any) bool { return v == "sandbox" })
	}
	raw, err := json.Marshal(s)
	return raw, true, err
}

// madeBoxes are the boxes a successful fork or branch made (from its
// result), which go with the sandbox node's box.
func madeBoxes(tool, result string, isErr bool) []string {
	if isErr {
		return nil
	}
	var r struct {
		Sandboxes []string `json:"sandboxes"` // fork
		Sandbox   string   `json:"sandbox"`   // branch
	}
	switch tool {
	case "fork":
		if json.Unmarshal([]byte(result), &r) == nil {
			return r.Sandboxes
		}
	case "branch":
		if json.Unmarshal([]byte(result), &r) == nil && r.Sandbox != "" {
			return []string{r.Sandbox}
		}
	}
	return nil
}

// runTool is ts's Runner recording each call in the sandbox node's
// history.
func (l *LLM) runTool(ts *BoxToolSet, box string) llm.ToolRunner {
	inner := ts.Runner(l.env.Client, box)
	return func(ctx context.Context, call llm.ToolCall) (string, bool) {
		started := time.Now()
		out, isErr := inner(ctx, call)
		entry := HistoryEntry{
			Command: call.Name + " " + string(call.Input), Tool: call.Name, By: l.spec.Node.Name,
			Stdout: out, Started: started.UTC(), DurationMs: time.Since(started).Milliseconds(),
		}
		if isErr {
			entry.ExitCode, entry.Error = -1, out
		}
		if ctx.Err() == nil {
			if err := l.spec.Tools.Sandbox.Record(ctx, entry); err != nil {
				l.log.Warn("record a tool call in the sandbox history", "tool", call.Name, "error", err)
			}
		}
		if made := madeBoxes(call.Name, out, isErr); len(made) > 0 {
			if err := l.spec.Tools.Sandbox.Adopt(ctx, made); err != nil {
				l.log.Warn("record the boxes a model made", "tool", call.Name, "boxes", made, "error", err)
			}
		}
		return out, isErr
	}
}
