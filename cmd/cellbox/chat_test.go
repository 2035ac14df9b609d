package main

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/builtins/llm"
	"github.com/cellbox/cellbox/internal/llmtest"
	"github.com/cellbox/cellbox/sandbox/sandboxtest"
)

// TestChat drives `cellbox chat`'s loop against the scripted server and a
// real local box: the model writes a file through the tools, the
// conversation is kept across messages, each call is printed.
func TestChat(t *testing.T) {
	svc, _ := sandboxtest.Service(t, sandboxtest.Options{})
	id, _, err := svc.NewSession(context.Background())
	require.NoError(t, err)
	c := svc.Client(id)
	s := llmtest.New(t,
		llmtest.Turn{Calls: []llmtest.Call{{ID: "w", Name: "write_file", Input: `{"path":"hello.txt","content":"hi from the model\n"}`}}},
		llmtest.Turn{Text: "Wrote hello.txt."},
		llmtest.Turn{Calls: []llmtest.Call{{ID: "r", Name: "shell", Input: `{"command":"cat hello.txt"}`}}},
		llmtest.Turn{Text: "It says hi."},
	)
	env := s.Env()
	p, err := llm.New("openai", func(k string) string { return env[k] }, s.Client())
	require.NoError(t, err)

	var out strings.Builder
	in := strings.NewReader("write hello.txt\nwhat does it say?\n")
	require.NoError(t, chat(context.Background(), in, &out, c, p, chatOptions{model: "m", box: "chat", allow: []string{"write_file", "shell"}, maxTurns: 4}))

	var file strings.Builder
	_, err = c.Download(context.Background(), "chat", "/workspace/hello.txt", &file)
	require.NoError(t, err)
	assert.Equal(t, "hi from the model\n", file.String())

	printed := out.String()
	assert.Contains(t, printed, `→ write_file {"path":"hello.txt"`)
	assert.Contains(t, printed, "Wrote hello.txt.")
	assert.Contains(t, printed, `hi from the model\n`)
	assert.Contains(t, printed, "It says hi.")
	reqs := s.Requests()
	require.Len(t, reqs, 4)
	assert.Contains(t, reqs[2].Raw, "write hello.txt", "the second message carries the first exchange")
	assert.Contains(t, reqs[2].Raw, "Wrote hello.txt.")
}

// TestChatWithheldTools: chat binds the tools as an llm node does (one
// code path): without --allow, a model asking to re-make its box with the
// full network gets tool errors naming the allow list, and the box keeps
// no network.
func TestChatWithheldTools(t *testing.T) {
	svc, _ := sandboxtest.Service(t, sandboxtest.Options{})
	id, _, err := svc.NewSession(context.Background())
	require.NoError(t, err)
	c := svc.Client(id)
	s := llmtest.New(t,
		llmtest.Turn{Calls: []llmtest.Call{
			{ID: "d", Name: "sandbox_destroy", Input: `{}`},
			{ID: "c", Name: "sandbox_create", Input: `{"network":true}`},
			{ID: "f", Name: "fork", Input: `{"count":1}`},
			{ID: "n", Name: "shell", Input: `{"command":"tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"}`},
		}},
		llmtest.Turn{Text: "no luck"},
	)
	env := s.Env()
	p, err := llm.New("openai", func(k string) string { return env[k] }, s.Client())
	require.NoError(t, err)
	var out strings.Builder
	require.NoError(t, chat(context.Background(), strings.NewReader("open your network\n"), &out, c, p, chatOptions{model: "m", box: "chatbox", maxTurns: 4}))
	printed := out.String()
	for _, name := range []string{"sandbox_destroy", "sandbox_create", "fork"} {
		assert.Contains(t, printed, `← error: tool "`+name+`" is withheld`)
	}
	assert.Contains(t, printed, "cellbox chat --allow")
	assert.Contains(t, printed, `"stdout":"lo\n"`, "the box sees only its loopback")
	raw, err := c.Tool(context.Background(), "sandbox_list", nil)
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(string(raw), `"name":`), "no box was made: %s", raw)
	assert.Contains(t, string(raw), `"network":{"mode":"none"`)
}

// What reaches the terminal in a chat shows its control characters (a
// prompt-injected model's text, a box's output in a tool result), and a
// chat out of turns names its own flag, --max-turns.
func TestChatShowsControlsAndFlag(t *testing.T) {
	svc, _ := sandboxtest.Service(t, sandboxtest.Options{})
	id, _, err := svc.NewSession(context.Background())
	require.NoError(t, err)
	s := llmtest.New(t,
		llmtest.Turn{Text: "\x1b]0;pwned\x07hello", Calls: []llmtest.Call{{ID: "a", Name: "shell", Input: `{"command":"printf '\\033[2Jcleared'"}`}}},
		llmtest.Turn{Calls: []llmtest.Call{{ID: "b", Name: "shell", Input: `{"command":"true"}`}}},
	)
	env := s.Env()
	p, err := llm.New("openai", func(k string) string { return env[k] }, s.Client())
	require.NoError(t, err)
	var out strings.Builder
	require.NoError(t, chat(context.Background(), strings.NewReader("go\n"), &out, svc.Client(id), p, chatOptions{model: "m", box: "chat", allow: []string{"shell"}, maxTurns: 2}))
	printed := out.String()
	assert.NotContains(t, printed, "\x1b", "no escape reaches the terminal")
	assert.NotContains(t, printed, "\x07")
	assert.Contains(t, printed, `\x1b]0;pwned\x07hello`)
	assert.Contains(t, printed, "raise --max-turns")
	assert.NotContains(t, printed, "raise max_turns")
}

// TestChatInterrupt: Ctrl-C while the model answers ends that exchange and
// the next message is answered (before, a Ctrl-C failed every later
// message, "interrupt signal received"); Ctrl-C at the prompt ends the
// chat.
func TestChatInterrupt(t *testing.T) {
	svc, _ := sandboxtest.Service(t, sandboxtest.Options{})
	id, _, err := svc.NewSession(context.Background())
	require.NoError(t, err)
	hold, started := make(chan struct{}), make(chan struct{})
	defer close(hold)
	s := llmtest.New(t,
		llmtest.Turn{Text: "a long answer", Hold: hold, Started: started},
		llmtest.Turn{Text: "the second answer"},
	)
	env := s.Env()
	p, err := llm.New("openai", func(k string) string { return env[k] }, s.Client())
	require.NoError(t, err)

	inR, inW := io.Pipe()
	interrupt := make(chan os.Signal, 1)
	var out syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- chat(context.Background(), inR, &out, svc.Client(id), p, chatOptions{model: "m", box: "chat", allow: []string{"shell"}, maxTurns: 2, interrupt: interrupt})
	}()
	io.WriteString(inW, "first\n")
	<-started
	interrupt <- os.Interrupt // while the model streams
	io.WriteString(inW, "second\n")
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "the second answer") }, 30*time.Second, 10*time.Millisecond, "the next message is answered: %s", &out)
	assert.Contains(t, out.String(), "interrupted: that message and its answer are dropped")
	require.Eventually(t, func() bool { return strings.HasSuffix(out.String(), "> ") }, 5*time.Second, 10*time.Millisecond)
	interrupt <- os.Interrupt // at the prompt
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Ctrl-C at the prompt did not end the chat")
	}
	assert.NotContains(t, s.Requests()[1].Raw, "first", "the interrupted exchange is not in the conversation")
}
