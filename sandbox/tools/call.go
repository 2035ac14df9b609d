package tools

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/api"
)

// Call is what the handler of a box tool (shell, the file tools, code,
// wait_port) gets for one call: the session's boxes by name, a place for
// notices, and the session's allowed_commands. The sandbox service's
// per-call value implements it; a box it hands out stays leased (awake,
// not removed) until the call ends.
type Call interface {
	// Box returns the session's box called name ("" is the default box),
	// made on first use, woken if asleep, restarted if it died.
	Box(ctx context.Context, name string) (Box, error)
	// Notice adds n to the result's notice: something the caller should
	// know that is not an error.
	Notice(n string)
	// Allowed is the session's allowed_commands (empty: any command).
	Allowed() AllowList
}

// Box is a box leased for a call.
type Box struct {
	// ID is the box's id (the same box has one id under every name).
	ID string
	// Client is the box's agent.
	Client *agent.Client
	// Env is the box's environment (given when it was made), under which
	// its commands run.
	Env map[string]string
}

// outputKey carries the output callback of a tool call (WithOutput).
type outputKey struct{}

// WithOutput returns ctx under which a tool that runs a command (shell)
// hands its output to fn as it comes: the MCP face turns it into progress
// and log notifications.
func WithOutput(ctx context.Context, fn func(stream string, data []byte)) context.Context {
	return context.WithValue(ctx, outputKey{}, fn)
}

// Output is the output callback of ctx, nil if none.
func Output(ctx context.Context) func(stream string, data []byte) {
	fn, _ := ctx.Value(outputKey{}).(func(stream string, data []byte))
	return fn
}

// AllowList is a session's allowed_commands (seed 003's allowedCommands):
// the prefixes every command line of the session must start with. Empty
// allows everything. It is checked on the host, before a command reaches
// a box, and it is set only when the session is made (by whoever holds the
// server key), so the agent using the session cannot widen it.
type AllowList []string

// shellControl are the characters that would let a command line that
// starts with an allowed prefix run something else: chaining (; & |), a
// substitution ($ `), a redirection or process substitution (< > ( )), a
// second line. A session with an allow-list refuses them outright, even
// quoted, rather than parse shell.
const shellControl = ";&|`$<>()\n\r"

// NewAllowList checks and makes the list of prefixes a session was given.
func NewAllowList(prefixes []string) (AllowList, error) {
	var out AllowList
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

// Check refuses a command line (and extra environment) the list does not
// allow, saying what is allowed; the error has the code refused.
func (a AllowList) Check(command string, env map[string]string) error {
	return api.WithCode(api.CodeRefused, a.Refusal(command, env))
}

// Refusal is why the list refuses command and env, nil if it allows them.
func (a AllowList) Refusal(command string, env map[string]string) error {
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
