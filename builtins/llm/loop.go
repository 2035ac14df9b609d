package llm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/cellbox/cellbox/internal/fastjson"
)

// ToolRunner runs one tool call; its result (or its error, as text) goes
// back to the model as a tool_result. Only a cancelled ctx stops the loop.
type ToolRunner func(ctx context.Context, call ToolCall) (result string, isError bool)

// LoopResult is a finished tool loop.
type LoopResult struct {
	// Text is the final answer's text.
	Text string `json:"text"`
	// Messages is the whole conversation, request messages included.
	Messages []Message `json:"messages"`
	// ToolCalls are all the calls the model made, in order.
	ToolCalls  []ToolCall `json:"tool_calls"`
	Usage      Usage      `json:"usage"`
	StopReason string     `json:"stop_reason"`
	Turns      int        `json:"turns"`
}

// LoopHooks observe a loop as it runs; any may be nil.
type LoopHooks struct {
	Text       func(turn int, piece string)
	ToolCall   func(call ToolCall)
	ToolResult func(call ToolCall, result string, isError bool)
	// Unknown, if set, is the tool error of a call of a tool outside
	// req.Tools (it can say why the tool is not offered); nil says which
	// tools the model may call.
	Unknown func(name string) string
}

// badArgumentsShown bounds how much of a call's broken arguments its tool
// error quotes: the start says what went wrong, and the model has the rest.
const badArgumentsShown = 200

// badArguments is the tool error of a call whose arguments are not a JSON
// object: what the model sent (its start) and what to send instead.
func badArguments(c ToolCall) string {
	sent := string(c.Input)
	var s string
	if json.Unmarshal(c.Input, &s) == nil {
		sent = s // callInput's string of arguments that did not parse
	}
	if len(sent) > badArgumentsShown {
		sent = strings.ToValidUTF8(sent[:badArgumentsShown], "") + "…"
	}
	return fmt.Sprintf("the arguments of %s are not a valid JSON object (cut off or malformed?); you sent: %s — call %s again with its arguments as one complete JSON object matching its input schema", c.Name, sent, c.Name)
}

// DefaultMaxTurns bounds a tool loop when the caller gives no bound.
const DefaultMaxTurns = 20

// ErrMaxTurns is wrapped by the error of a Loop that ran out of turns
// while the model still asked for tools.
var ErrMaxTurns = errors.New("the model still asks for tools")

// Loop calls the model, runs the tools it asks for, gives it their
// results, and calls it again until it answers without asking for a tool.
// A tool outside req.Tools, or a call whose arguments are not a JSON
// object, goes back to the model as a tool error. More
// than maxTurns model calls is an error (with the partial result).
func Loop(ctx context.Context, p Provider, req Request, run ToolRunner, maxTurns int, hooks LoopHooks) (LoopResult, error) {
	if maxTurns <= 0 {
		maxTurns = DefaultMaxTurns
	}
	names := make([]string, len(req.Tools))
	for i, t := range req.Tools {
		names[i] = t.Name
	}
	res := LoopResult{Messages: slices.Clone(req.Messages)}
	for {
		if res.Turns == maxTurns {
			return res, fmt.Errorf("max_turns (%d) reached and %w: raise max_turns or narrow the task", maxTurns, ErrMaxTurns)
		}
		res.Turns++
		turn := res.Turns
		call := req
		call.Messages = res.Messages
		var onText func(string)
		if hooks.Text != nil {
			onText = func(s string) { hooks.Text(turn, s) }
		}
		r, err := p.Stream(ctx, call, onText)
		res.Usage.Add(r.Usage)
		res.Text, res.StopReason = r.Text, r.StopReason
		if err != nil {
			return res, fmt.Errorf("model call %d: %w", turn, err)
		}
		res.Messages = append(res.Messages, r.Message())
		if len(r.ToolCalls) == 0 {
			return res, nil
		}
		results := Message{Role: "user"}
		for _, c := range r.ToolCalls {
			res.ToolCalls = append(res.ToolCalls, listed(c))
			if hooks.ToolCall != nil {
				hooks.ToolCall(c)
			}
			var out string
			var isErr bool
			switch {
			case !slices.Contains(names, c.Name) && hooks.Unknown != nil:
				out, isErr = hooks.Unknown(c.Name), true
			case !slices.Contains(names, c.Name):
				out, isErr = fmt.Sprintf("unknown tool %q: the tools you may call are %s", c.Name, strings.Join(names, ", ")), true
			case !isObject(c.Input):
				out, isErr = badArguments(c), true
			case run == nil:
				out, isErr = "no tools are available here", true
			default:
				out, isErr = run(ctx, c)
			}
			if err := ctx.Err(); err != nil {
				return res, err
			}
			if hooks.ToolResult != nil {
				hooks.ToolResult(c, out, isErr)
			}
			results.Content = append(results.Content, Block{Type: "tool_result", ToolUseID: c.ID, Text: out, IsError: isErr})
		}
		res.Messages = append(res.Messages, results)
	}
}

// maxListedInput bounds the strings of a call's input in LoopResult's
// ToolCalls, a list for reading: the whole input is in Messages, which
// the conversation needs; a model's 6 MiB write_file was stored twice.
const maxListedInput = 64 << 10

// listed is c as ToolCalls lists it: its input's long strings cut
// (fastjson.Cut), its shape kept.
func listed(c ToolCall) ToolCall {
	if len(c.Input) > maxListedInput {
		c.Input, _ = fastjson.Cut(c.Input, maxListedInput)
	}
	return c
}
