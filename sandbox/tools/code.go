package tools

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/api"
)

// The handlers of the code interpreter tools (run_code and code contexts,
// registered in allTools). A context is a long-running interpreter inside
// the box, kept by the box's agent (sandbox/agent/code.go); these handlers
// only check input and translate.

// refuseCode refuses arbitrary code in a session limited to
// allowed_commands: the list is about command lines, and code can run any.
func refuseCode(c Call, tool string) error {
	allowed := c.Allowed()
	if len(allowed) == 0 {
		return nil
	}
	return api.WithCode(api.CodeRefused, fmt.Errorf("%s refused: this session runs only commands starting with one of %q (allowed_commands), and code could run any command; use the shell tool with an allowed command", tool, []string(allowed)))
}

// codeErr gives agent errors about code contexts the code a caller acts on.
func codeErr(err error) error {
	if agent.IsCode(err, agent.CodeTooLarge) {
		return api.WithCode(api.CodeLimit, err)
	}
	return err
}

func codeContextCreateTool(ctx context.Context, c Call, in api.CodeContextCreateInput) (api.CodeContextCreateOutput, error) {
	if err := refuseCode(c, "code_context_create"); err != nil {
		return api.CodeContextCreateOutput{}, err
	}
	l, err := c.Box(ctx, in.Sandbox)
	if err != nil {
		return api.CodeContextCreateOutput{}, err
	}
	cc, err := l.Client.CodeCreate(ctx, agent.CodeContextRequest{Language: in.Language, Cwd: in.WorkingDir, Env: MergeEnv(l.Env, in.Env)})
	if err != nil {
		return api.CodeContextCreateOutput{}, codeErr(err)
	}
	return api.CodeContextCreateOutput{ID: cc.ID, Language: cc.Language,
		Hint: fmt.Sprintf(`run code in it with run_code {"context":%q,"code":...}; delete it with code_context_delete when done`, cc.ID)}, nil
}

func codeContextListTool(ctx context.Context, c Call, in api.CodeContextListInput) (api.CodeContextListOutput, error) {
	l, err := c.Box(ctx, in.Sandbox)
	if err != nil {
		return api.CodeContextListOutput{}, err
	}
	list, err := l.Client.CodeContexts(ctx)
	if err != nil {
		return api.CodeContextListOutput{}, err
	}
	out := api.CodeContextListOutput{Contexts: make([]api.CodeContext, len(list))}
	for i, cc := range list {
		out.Contexts[i] = api.CodeContext(cc)
	}
	return out, nil
}

func codeContextDeleteTool(ctx context.Context, c Call, in api.CodeContextDeleteInput) (api.OKOutput, error) {
	if strings.TrimSpace(in.ID) == "" {
		return api.OKOutput{}, api.WithCode(api.CodeInvalidInput, errors.New("code_context_delete needs the id of a context (see code_context_list)"))
	}
	l, err := c.Box(ctx, in.Sandbox)
	if err != nil {
		return api.OKOutput{}, err
	}
	if err := l.Client.CodeDelete(ctx, in.ID); err != nil {
		return api.OKOutput{}, err
	}
	return api.OKOutput{OK: true}, nil
}

func runCodeTool(ctx context.Context, c Call, in api.RunCodeInput) (api.RunCodeOutput, error) {
	var out api.RunCodeOutput
	if err := refuseCode(c, "run_code"); err != nil {
		return out, err
	}
	if in.Context == "" && in.Language == "" {
		return out, api.WithCode(api.CodeInvalidInput, fmt.Errorf("run_code needs a language (%s) or the id of a code context", strings.Join(agent.CodeLanguages, ", ")))
	}
	if in.Context != "" && in.Language != "" && !strings.HasPrefix(in.Context, in.Language+"-") {
		return out, api.WithCode(api.CodeInvalidInput, fmt.Errorf("context %s is not a %s context; leave language out or use a %s context", in.Context, in.Language, in.Language))
	}
	l, err := c.Box(ctx, in.Sandbox)
	if err != nil {
		return out, err
	}
	id := in.Context
	if id == "" {
		cc, err := l.Client.CodeCreate(ctx, agent.CodeContextRequest{Language: in.Language, Env: l.Env})
		if err != nil {
			if agent.IsCode(err, agent.CodeTooLarge) {
				err = fmt.Errorf("a run without context needs an interpreter of its own, and %w (code_context_list shows them)", err)
			}
			return out, codeErr(err)
		}
		id = cc.ID
		defer func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			l.Client.CodeDelete(dctx, id) // it may have ended already
		}()
	}
	timeout := in.TimeoutMs
	if timeout <= 0 {
		timeout = ShellTimeoutMs
	}
	res, err := l.Client.CodeRun(ctx, id, agent.CodeRunRequest{Code: in.Code, TimeoutMs: timeout, MaxOutput: ShellOutputCap})
	if err != nil {
		return out, err
	}
	out = api.RunCodeOutput{Stdout: res.Stdout, Stderr: res.Stderr, Value: res.Value, ExitCode: res.ExitCode,
		Truncated: res.Truncated, TimedOut: res.TimedOut, Context: in.Context, DurationMs: res.DurationMs}
	for _, o := range res.Outputs {
		out.Outputs = append(out.Outputs, api.CodeOutput(o))
	}
	if res.Error != nil {
		e := api.CodeException(*res.Error)
		out.Exception = &e
	}
	switch {
	case res.Ended != "" && in.Context != "":
		msg := fmt.Sprintf("code context %s ended: %s; its state is lost, create a new one with code_context_create", id, res.Ended)
		out.Exception = &api.CodeException{Name: "ContextEnded", Message: msg}
		out.Hint = msg
	case res.Ended != "":
		out.Exception = &api.CodeException{Name: "Killed", Message: "the interpreter ended: " + res.Ended}
	case res.TimedOut && in.Context != "":
		out.Hint = fmt.Sprintf("the code was interrupted after %d ms; the context keeps its state (what ran before the interrupt stays done). Raise timeout_ms for longer work.", timeout)
	case res.TimedOut:
		out.Hint = fmt.Sprintf("the code was interrupted after %d ms; raise timeout_ms for longer work, or run it in the background with the shell tool.", timeout)
	case res.Truncated:
		out.Hint = fmt.Sprintf("output was cut at %d KiB (each of stdout, stderr and value); write big output to a file and read it with read_file or grep", ShellOutputCap>>10)
	}
	return out, nil
}
