package builtins_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/builtins"
	"github.com/cellbox/cellbox/builtins/llm"
	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/internal/llmtest"
	"github.com/cellbox/cellbox/runtime"
	"github.com/cellbox/cellbox/sandbox/api"
)

// agentPattern gives an llm node the tools of a sandbox node.
const agentPattern = `
name: agent
cells:
  task: {value: ""}
nodes:
  box: {sandbox: {}}
  agent:
    llm:
      provider: PROVIDER
      model: scripted
      system: You write code in /workspace and test it.
      prompt: ${task}
      tools: {sandbox: box, allow: [shell, read_file, write_file, edit]}
      max_turns: 8
  answer: {computed: '${agent.result.text}'}
`

// llmOut is an llm node's output cell.
type llmOut struct {
	Pending bool                `json:"pending"`
	Result  *builtins.LLMResult `json:"result"`
	Error   *string             `json:"error"`
}

func (r *run) llm(name string) llmOut {
	r.t.Helper()
	var o llmOut
	r.get(name, &o)
	return o
}

func withServer(b *box, s *llmtest.Server) {
	env := s.Env()
	b.llm = builtins.LLMEnv{Getenv: func(k string) string { return env[k] }, HTTP: s.Client()}
}

// codingScript is an agent that writes a failing test, runs it, fixes the
// code and runs it again.
func codingScript() []llmtest.Turn {
	call := func(id, name string, input any) llmtest.Call {
		raw, _ := json.Marshal(input)
		return llmtest.Call{ID: id, Name: name, Input: string(raw)}
	}
	return []llmtest.Turn{
		{Text: "I'll write the function and its test.", Calls: []llmtest.Call{
			call("t1", "write_file", map[string]any{"path": "add.sh", "content": "add() { echo $(($1 - $2)); }\n"}),
			call("t2", "write_file", map[string]any{"path": "test.sh", "content": ". ./add.sh\n[ \"$(add 2 3)\" = 5 ] || { echo FAIL: add 2 3 = $(add 2 3); exit 1; }\necho PASS\n"}),
		}},
		{Calls: []llmtest.Call{call("t3", "shell", map[string]any{"command": "sh test.sh"})}},
		{Text: "The test fails; fixing the sign.", Calls: []llmtest.Call{
			call("t4", "edit", map[string]any{"path": "add.sh", "edits": []any{map[string]any{"oldText": "$1 - $2", "newText": "$1 + $2"}}}),
		}},
		{Calls: []llmtest.Call{call("t5", "shell", map[string]any{"command": "sh test.sh"})}},
		{Text: "Done: add.sh adds and its test passes."},
	}
}

// TestLLMCodingAgent: the model writes a file, runs a failing test in the
// box, edits, reruns and finishes, on both wire formats (and through the
// sandbox service's HTTP client, whose tool list comes from GET
// /v1/tools); the box holds the fixed code and the sandbox node's
// history shows every tool call.
func TestLLMCodingAgent(t *testing.T) {
	for _, tc := range []struct {
		provider string
		overHTTP bool
	}{{"anthropic", false}, {"openai", false}, {"openai", true}} {
		provider := tc.provider
		name := provider
		if tc.overHTTP {
			name += "/over-HTTP"
		}
		t.Run(name, func(t *testing.T) {
			b := startBox(t, tc.overHTTP)
			s := llmtest.New(t, codingScript()...)
			withServer(b, s)
			r := b.load(t, strings.Replace(agentPattern, "PROVIDER", provider, 1), nil)
			r.settle()
			require.Equal(t, "running", r.sandbox("box").Status)
			r.set("task", `"write add() in add.sh with a test"`)
			r.settle()

			out := r.llm("agent")
			require.Nil(t, out.Error, "%v", out.Error)
			assert.Equal(t, "Done: add.sh adds and its test passes.", out.Result.Text)
			assert.Equal(t, 5, out.Result.Turns)
			assert.Len(t, out.Result.ToolCalls, 5)
			var answer string
			r.get("answer", &answer)
			assert.Equal(t, out.Result.Text, answer)

			box := r.sandbox("box")
			code, ok := b.read(box.Box, "/workspace/add.sh")
			require.True(t, ok)
			assert.Equal(t, "add() { echo $(($1 + $2)); }\n", code)

			var tools []string
			for _, h := range box.History {
				tools = append(tools, h.Tool)
				assert.Equal(t, "agent", h.By)
			}
			assert.Equal(t, []string{"write_file", "write_file", "shell", "edit", "shell"}, tools)
			assert.Contains(t, box.History[2].Stdout, "FAIL: add 2 3 = -1")
			assert.Contains(t, box.History[4].Stdout, "PASS")

			// The model saw the failing run's output, and no sandbox
			// parameter: the tools are bound to the node's box.
			reqs := s.Requests()
			require.Len(t, reqs, 5)
			assert.Contains(t, reqs[3].Raw, "FAIL: add 2 3 = -1")
			assert.NotContains(t, reqs[0].Raw, `"sandbox"`)
			assert.Contains(t, reqs[0].Raw, `"write_file"`)
			assert.NotContains(t, reqs[0].Raw, `"sandbox_list"`)
		})
	}
}

// TestLLMCacheAcrossRestart: a finished call is not repeated when the
// runner restarts over the same store, nor when an input reverts.
func TestLLMCacheAcrossRestart(t *testing.T) {
	b := newBox(t)
	s := llmtest.New(t, llmtest.Turn{Text: "hello there"})
	withServer(b, s)
	const p = `
name: hi
cells: {q: {value: "say hi"}}
nodes:
  a: {llm: {provider: anthropic, model: m, prompt: '${q}', temperature: 0.5, max_tokens: 100}}
`
	store, err := cells.OpenBolt(filepath.Join(t.TempDir(), "cells.db"), cells.Options{NoSync: true})
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	r := b.loadOn(t, store, p, nil)
	r.settle()
	require.Equal(t, "hello there", r.llm("a").Result.Text)
	require.Len(t, s.Requests(), 1)
	body := s.Requests()[0].Body
	assert.EqualValues(t, 100, body["max_tokens"])
	assert.EqualValues(t, 0.5, body["temperature"])
	r.close(runtime.Shutdown)

	r2 := b.loadOn(t, store, p, nil)
	r2.settle()
	assert.Equal(t, "hello there", r2.llm("a").Result.Text)
	assert.Len(t, s.Requests(), 1, "no request reaches the server after the restart")

	// A revert reuses the memo too.
	s.Add(llmtest.Turn{Text: "bye"})
	r2.set("q", `"say bye"`)
	r2.settle()
	assert.Equal(t, "bye", r2.llm("a").Result.Text)
	r2.set("q", `"say hi"`)
	r2.settle()
	assert.Equal(t, "hello there", r2.llm("a").Result.Text)
	assert.Len(t, s.Requests(), 2, "the revert is a memo hit")
}

// TestLLMAbortOnInputChange: a prompt change mid-stream aborts the call
// in flight; only the new prompt's answer is written.
func TestLLMAbortOnInputChange(t *testing.T) {
	b := newBox(t)
	started, hold := make(chan struct{}), make(chan struct{})
	s := llmtest.New(t, llmtest.Turn{Text: "stale answer", Started: started, Hold: hold}, llmtest.Turn{Text: "fresh answer"})
	withServer(b, s)
	r := b.load(t, `
name: ab
cells: {q: {value: "first"}}
nodes:
  a: {llm: {provider: openai, model: m, prompt: '${q}'}}
`, nil)
	<-started
	// The answer shows as it streams: the first piece is in the cell
	// while the call is still pending.
	waitFor(t, "the first piece of the answer", func() bool {
		o := r.llm("a")
		return o.Pending && o.Result != nil && o.Result.Text == "stal"
	})
	r.set("q", `"second"`)
	r.settle()
	close(hold) // the stale stream could go on now: its answer must not land
	out := r.llm("a")
	require.Nil(t, out.Error)
	assert.Equal(t, "fresh answer", out.Result.Text)
	reqs := s.Requests()
	require.Len(t, reqs, 2)
	assert.Contains(t, reqs[1].Raw, "second")
}

// TestLLMErrors: a provider's refusal surfaces on the node with its
// message; a 429 is retried once; a missing key names its variable.
func TestLLMErrors(t *testing.T) {
	llm.MaxRetryAfter = 2 * time.Second
	b := newBox(t)
	s := llmtest.New(t,
		llmtest.Turn{Status: 429, RetryAfter: "0", ErrMessage: "rate limited"}, llmtest.Turn{Text: "after the retry"},
		llmtest.Turn{Status: 401, ErrMessage: "invalid x-api-key"})
	withServer(b, s)
	r := b.load(t, `
name: er
cells: {q: {value: "one"}}
nodes:
  a: {llm: {provider: anthropic, model: m, prompt: '${q}'}}
`, nil)
	r.settle()
	assert.Equal(t, "after the retry", r.llm("a").Result.Text)
	r.set("q", `"two"`)
	r.settle()
	out := r.llm("a")
	require.NotNil(t, out.Error)
	assert.Contains(t, *out.Error, "401")
	assert.Contains(t, *out.Error, "invalid x-api-key")
	assert.NotContains(t, *out.Error, "test-key")

	b.llm = builtins.LLMEnv{Getenv: func(string) string { return "" }}
	r2 := b.load(t, `
name: nokey
nodes:
  a: {llm: {provider: anthropic, model: m, prompt: hi}}
`, nil)
	r2.settle()
	require.NotNil(t, r2.llm("a").Error)
	assert.Contains(t, *r2.llm("a").Error, "ANTHROPIC_API_KEY")
}

// TestLLMUnknownToolAndMaxTurns: an invented tool goes back to the model
// as a tool error; a sandbox the model names is overridden by the node's
// box; max_turns reached fails the node with the conversation.
func TestLLMUnknownToolAndMaxTurns(t *testing.T) {
	b := newBox(t)
	s := llmtest.New(t,
		// An invented tool, and a real one the allow-list leaves out.
		llmtest.Turn{Calls: []llmtest.Call{{ID: "x", Name: "launch_missiles", Input: `{}`}, {ID: "z", Name: "sandbox_destroy", Input: `{}`}}},
		// A model naming another box still works in its own.
		llmtest.Turn{Calls: []llmtest.Call{{ID: "y", Name: "shell", Input: `{"command":"echo again","sandbox":"elsewhere"}`}}},
	)
	withServer(b, s)
	r := b.load(t, strings.NewReplacer("PROVIDER", "openai", "max_turns: 8", "max_turns: 2").Replace(agentPattern), nil)
	r.settle()
	r.set("task", `"loop"`)
	r.settle()
	out := r.llm("agent")
	require.NotNil(t, out.Error)
	assert.Contains(t, *out.Error, "max_turns (2) reached")
	require.NotNil(t, out.Result, "the conversation so far is kept beside the error")
	assert.Len(t, out.Result.ToolCalls, 3)
	assert.Contains(t, s.Requests()[1].Raw, `unknown tool \"launch_missiles\"`)
	assert.Contains(t, s.Requests()[1].Raw, `tool \"sandbox_destroy\" is not in this model's allow list (shell, read_file, write_file, edit)`)
	assert.Equal(t, "running", r.sandbox("box").Status, "the box was not destroyed")
	hist := r.sandbox("box").History
	require.Len(t, hist, 1, "the invented tool never reached the box")
	assert.Equal(t, "again\n", jsonField(t, hist[0].Stdout, "stdout"))
	assert.NotContains(t, b.list(t), "elsewhere", "the tools are bound to the node's box")
}

// TestLLMBadToolArguments: a model whose tool call's arguments are not
// valid JSON (cut off) gets a tool error and goes on, on both wires; the
// node's result keeps the conversation (it is storable), and the broken
// call never reaches the box.
func TestLLMBadToolArguments(t *testing.T) {
	for _, provider := range llm.Providers {
		t.Run(provider, func(t *testing.T) {
			b := newBox(t)
			s := llmtest.New(t,
				llmtest.Turn{Calls: []llmtest.Call{{ID: "bad", Name: "shell", Input: `{"command": `}}},
				llmtest.Turn{Calls: []llmtest.Call{{ID: "good", Name: "shell", Input: `{"command":"echo fixed"}`}}},
				llmtest.Turn{Text: "done"},
			)
			withServer(b, s)
			r := b.load(t, strings.Replace(agentPattern, "PROVIDER", provider, 1), nil)
			r.settle()
			r.set("task", `"run something"`)
			r.settle()

			out := r.llm("agent")
			if out.Error != nil {
				require.FailNow(t, "the node failed", *out.Error)
			}
			require.NotNil(t, out.Result)
			assert.Equal(t, "done", out.Result.Text)
			assert.Equal(t, 3, out.Result.Turns)
			require.Len(t, out.Result.Messages, 6)
			answer := out.Result.Messages[2].Content[0]
			assert.True(t, answer.IsError)
			assert.Contains(t, answer.Text, "the arguments of shell are not a valid JSON object")
			assert.JSONEq(t, `"{\"command\": "`, string(out.Result.ToolCalls[0].Input))

			hist := r.sandbox("box").History
			require.Len(t, hist, 1, "the broken call never reached the box")
			assert.Equal(t, "fixed\n", jsonField(t, hist[0].Stdout, "stdout"))
		})
	}
}

func jsonField(t *testing.T, raw, key string) any {
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(raw), &m), raw)
	return m[key]
}

// TestLLMHistoryCapsToolInput: a tool call with a megabyte-sized input
// (write_file's content) is cut in the history, not in the box.
func TestLLMHistoryCapsToolInput(t *testing.T) {
	b := newBox(t)
	big := strings.Repeat("x", 3*builtins.HistoryOutputLimit)
	input, _ := json.Marshal(map[string]any{"path": "big.txt", "content": big})
	s := llmtest.New(t,
		llmtest.Turn{Calls: []llmtest.Call{{ID: "w", Name: "write_file", Input: string(input)}}},
		llmtest.Turn{Text: "written"})
	withServer(b, s)
	r := b.load(t, strings.Replace(agentPattern, "PROVIDER", "anthropic", 1), nil)
	r.settle()
	r.set("task", `"write a big file"`)
	r.settle()
	require.Equal(t, "written", r.llm("agent").Result.Text)
	box := r.sandbox("box")
	require.Len(t, box.History, 1)
	assert.LessOrEqual(t, len(box.History[0].Command), builtins.HistoryOutputLimit+len("…"))
	assert.True(t, box.History[0].Truncated)
	content, ok := b.read(box.Box, "/workspace/big.txt")
	require.True(t, ok)
	assert.Len(t, content, len(big))
}

// TestLLMResumesAfterRestart: a runner stopped mid-loop resumes after the
// last finished step: the model call and the tool call that completed are
// not repeated (the command ran once in the box), the call in flight is.
// So does a node with cache: false (before, it ran every step again: its
// steps were kept only in the memo cache), while a later run of its same
// inputs starts afresh.
func TestLLMResumesAfterRestart(t *testing.T) {
	for _, cache := range []bool{true, false} {
		t.Run(fmt.Sprintf("cache %v", cache), func(t *testing.T) {
			b := newBox(t)
			started, hold := make(chan struct{}), make(chan struct{})
			s := llmtest.New(t,
				llmtest.Turn{Calls: []llmtest.Call{{ID: "a", Name: "shell", Input: `{"command":"echo ran >> /workspace/log"}`}}},
				llmtest.Turn{Text: "interrupted", Started: started, Hold: hold},
				llmtest.Turn{Text: "finished"},
				llmtest.Turn{Calls: []llmtest.Call{{ID: "b", Name: "shell", Input: `{"command":"echo again >> /workspace/log"}`}}},
				llmtest.Turn{Text: "once more"},
			)
			withServer(b, s)
			p := strings.Replace(agentPattern, "PROVIDER", "openai", 1)
			if !cache {
				p = strings.Replace(p, "      max_turns: 8\n", "      max_turns: 8\n      cache: false\n", 1)
			}
			store, err := cells.OpenBolt(filepath.Join(t.TempDir(), "cells.db"), cells.Options{NoSync: true})
			require.NoError(t, err)
			t.Cleanup(func() { store.Close() })
			r := b.loadOn(t, store, p, nil)
			r.settle()
			r.set("task", `"log once"`)
			<-started
			r.close(runtime.Shutdown) // the runner stops with the second model call in flight
			close(hold)

			r2 := b.loadOn(t, store, p, nil)
			r2.settle()
			out := r2.llm("agent")
			require.Nil(t, out.Error)
			assert.Equal(t, "finished", out.Result.Text)
			assert.Equal(t, 2, out.Result.Turns)
			require.Len(t, s.Requests(), 3, "the first model call is not repeated")
			log, ok := b.read(r2.sandbox("box").Box, "/workspace/log")
			require.True(t, ok)
			assert.Equal(t, "ran\n", log, "the tool call is not repeated")
			if cache {
				return
			}
			// Away and back: without the cache, the same inputs run again,
			// none of the earlier run's steps recalled.
			r2.set("task", `"something else"`)
			r2.set("task", `"log once"`)
			r2.settle()
			assert.Equal(t, "once more", r2.llm("agent").Result.Text)
		})
	}
}

// TestLLMDefaultProvider: a node without provider takes the runner's
// CELLBOX_LLM_PROVIDER; without that either, its error names both ways.
func TestLLMDefaultProvider(t *testing.T) {
	b := newBox(t)
	s := llmtest.New(t, llmtest.Turn{Text: "from the default"})
	env := s.Env()
	const p = "name: dp\nnodes:\n  a: {llm: {model: m, prompt: hi}}\n"
	b.llm = builtins.LLMEnv{Getenv: func(k string) string { return env[k] }, HTTP: s.Client()}
	r := b.load(t, p, nil)
	r.settle()
	require.NotNil(t, r.llm("a").Error)
	assert.Contains(t, *r.llm("a").Error, "CELLBOX_LLM_PROVIDER")

	env["CELLBOX_LLM_PROVIDER"] = "anthropic"
	r2 := b.load(t, p, nil)
	r2.settle()
	require.Nil(t, r2.llm("a").Error)
	assert.Equal(t, "from the default", r2.llm("a").Result.Text)
	assert.Equal(t, "/v1/messages", s.Requests()[0].Path)
}

// TestLLMMessages: a conversation from a cell goes to the model as it is;
// a malformed one fails the node saying what to write.
func TestLLMMessages(t *testing.T) {
	b := newBox(t)
	s := llmtest.New(t, llmtest.Turn{Text: "third answer"})
	withServer(b, s)
	r := b.load(t, `
name: conv
cells:
  conversation: {value: [{role: user, content: hi}, {role: assistant, content: hello}, {role: user, content: again}]}
nodes:
  a: {llm: {provider: openai, model: m, system: terse, messages: '${conversation}'}}
`, nil)
	r.settle()
	require.Equal(t, "third answer", r.llm("a").Result.Text)
	msgs, _ := s.Requests()[0].Body["messages"].([]any)
	require.Len(t, msgs, 4, "system + the three messages")
	assert.Equal(t, map[string]any{"role": "assistant", "content": "hello"}, msgs[2])

	r.set("conversation", `[{"role": "robot", "content": "x"}]`)
	r.settle()
	require.NotNil(t, r.llm("a").Error)
	assert.Contains(t, *r.llm("a").Error, `messages[0]: want {"role": "user"|"assistant"`)
}

// TestLLMTimeout: timeout follows its cell; a call that outlives it fails
// the node saying so.
func TestLLMTimeout(t *testing.T) {
	b := newBox(t)
	s := llmtest.New(t, llmtest.Turn{Text: "never finished", Hold: make(chan struct{})})
	withServer(b, s)
	r := b.load(t, `
name: to
cells: {limit: {value: 1s}}
nodes:
  a: {llm: {provider: anthropic, model: m, prompt: hi, timeout: '${limit}'}}
`, nil)
	r.settle()
	out := r.llm("a")
	require.NotNil(t, out.Error)
	assert.Contains(t, *out.Error, "timed out after 1s")
	require.NotNil(t, out.Result)
	assert.Equal(t, "neve", out.Result.Text, "what streamed before the timeout is kept")
}

// boxNetwork is the network mode of a box (sandbox_list) and the
// interfaces its commands see (/proc/net/dev of the box's namespace).
func (b *box) boxNetwork(t *testing.T, name string) (mode, ifaces string) {
	t.Helper()
	raw, err := b.client.Tool(context.Background(), "sandbox_list", nil)
	require.NoError(t, err)
	var out api.SandboxListOutput
	require.NoError(t, json.Unmarshal(raw, &out))
	for _, s := range out.Sandboxes {
		if s.Name == name {
			mode = s.Network.Mode
		}
	}
	res, err := b.client.Exec(context.Background(), name, api.ExecRequest{Command: "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"}, nil)
	require.NoError(t, err)
	return mode, res.Stdout
}

// TestLLMBoxToolsWithheld: a model bound to a box cannot give it a
// network. Without an allow list, sandbox_destroy, sandbox_create and fork
// (which make, remove or re-make boxes) go back to it as tool errors that
// name the allow list; with an allow list naming sandbox_create but not
// network_set, sandbox_create's network is refused. The box keeps no
// network (only loopback in its namespace) and no box is made.
func TestLLMBoxToolsWithheld(t *testing.T) {
	for _, tc := range []struct {
		name, allow string
		calls       []llmtest.Call
		want        []string // in the tool results the model got
	}{
		{
			name: "default set",
			calls: []llmtest.Call{
				{ID: "d", Name: "sandbox_destroy", Input: `{}`},
				{ID: "c", Name: "sandbox_create", Input: `{"network":true}`},
				{ID: "f", Name: "fork", Input: `{"count":3}`},
			},
			want: []string{`tool \"sandbox_destroy\" is withheld`, `tool \"sandbox_create\" is withheld`, `tool \"fork\" is withheld`, "allow list names it"},
		},
		{
			name:  "sandbox_create allowed, network_set not",
			allow: ", allow: [shell, sandbox_create]",
			calls: []llmtest.Call{
				{ID: "c", Name: "sandbox_create", Input: `{"network":true}`},
				{ID: "a", Name: "sandbox_create", Input: `{"network":{"allow":["*"]}}`},
				{ID: "s", Name: "sandbox_create", Input: `{"box_id":"other","share_across_sessions":true}`},
			},
			want: []string{"sandbox_create with network is refused", "does not name network_set", "sandbox_create with box_id or share_across_sessions is refused"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBox(t)
			s := llmtest.New(t, llmtest.Turn{Calls: tc.calls}, llmtest.Turn{Text: "done"})
			withServer(b, s)
			pattern := strings.NewReplacer("PROVIDER", "openai", ", allow: [shell, read_file, write_file, edit]", tc.allow).Replace(agentPattern)
			r := b.load(t, pattern, nil)
			r.settle()
			r.set("task", `"open your network"`)
			r.settle()
			out := r.llm("agent")
			require.Nil(t, out.Error, "%v", out.Error)
			reqs := s.Requests()
			require.Len(t, reqs, 2)
			for _, w := range tc.want {
				assert.Contains(t, reqs[1].Raw, w)
			}
			assert.Equal(t, len(tc.calls), strings.Count(reqs[1].Raw, `"role":"tool"`), "each call came back as a tool result")
			box := r.sandbox("box")
			assert.Equal(t, "running", box.Status)
			assert.Equal(t, []string{box.Box}, b.list(t), "no box was made or re-made")
			mode, ifaces := b.boxNetwork(t, box.Box)
			assert.Equal(t, "none", mode)
			assert.Equal(t, "lo\n", ifaces, "the box sees only its loopback")
		})
	}
}

// TestLLMMadeBoxesGoWithThePattern: boxes a model allowed to fork and
// branch makes are listed in the sandbox node's output (made) and
// destroyed when the pattern stops, with the node's own box.
func TestLLMMadeBoxesGoWithThePattern(t *testing.T) {
	b := newBox(t)
	s := llmtest.New(t,
		llmtest.Turn{Calls: []llmtest.Call{{ID: "f", Name: "fork", Input: `{"count":2}`}, {ID: "s", Name: "snapshot", Input: `{}`}}},
		llmtest.Turn{Text: "forked"},
	)
	withServer(b, s)
	pattern := strings.NewReplacer("PROVIDER", "anthropic", "allow: [shell, read_file, write_file, edit]", "allow: [shell, fork, snapshot]").Replace(agentPattern)
	r := b.load(t, pattern, nil)
	r.settle()
	r.set("task", `"fork yourself"`)
	r.settle()
	out := r.llm("agent")
	require.Nil(t, out.Error, "%v", out.Error)
	box := r.sandbox("box")
	require.Len(t, box.Made, 2, "the forks are recorded: %v", box.History)
	assert.ElementsMatch(t, append([]string{box.Box}, box.Made...), b.list(t))

	r.close(runtime.Stopped)
	assert.Empty(t, b.list(t), "the forks went with the pattern's box")
	assert.Empty(t, r.sandbox("box").Made)
}

// TestLLMWholeNumbers: max_turns and max_tokens of 1.5 fail the node
// saying so (they were cut to 1 without a word).
func TestLLMWholeNumbers(t *testing.T) {
	b := newBox(t)
	s := llmtest.New(t)
	withServer(b, s)
	r := b.load(t, `
name: whole
nodes:
  a: {llm: {provider: openai, model: m, prompt: hi, max_turns: 1.5}}
  b: {llm: {provider: openai, model: m, prompt: hi, max_tokens: 99.9}}
`, nil)
	r.settle()
	require.NotNil(t, r.llm("a").Error)
	assert.Contains(t, *r.llm("a").Error, "max_turns is 1.5: give a whole number, at least 1")
	require.NotNil(t, r.llm("b").Error)
	assert.Contains(t, *r.llm("b").Error, "max_tokens is 99.9: give a whole number")
	assert.Empty(t, s.Requests(), "no model was called")
}
