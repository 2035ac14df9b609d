package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"github.com/cellbox/cellbox/builtins"
	"github.com/cellbox/cellbox/builtins/llm"
	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandboxclient"
)

func init() {
	register(command{
		name:  "chat",
		usage: "[--provider P --model M --box NAME --allow a,b] [--server URL --session ID --token T]  talk to a model that works in a session's box",
		run:   runChat,
	})
}

// chatOptions shape a chat: the same request and loop an llm node makes.
type chatOptions struct {
	model, system, box string
	allow              []string
	maxTurns           int
	ready              func() // called once the tools are bound, before the first prompt
	// interrupt delivers Ctrl-C: it ends the exchange in flight (the
	// conversation goes on), or at the prompt the chat. nil: none.
	interrupt <-chan os.Signal
}

func runChat(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("chat", flag.ContinueOnError)
	cf := addClientFlags(fs, true)
	provider := fs.String("provider", envOr("CELLBOX_LLM_PROVIDER", "openai"), "anthropic or openai (any OpenAI-compatible server: OPENAI_BASE_URL); env CELLBOX_LLM_PROVIDER")
	model := fs.String("model", os.Getenv("CELLBOX_LLM_MODEL"), "the model (env CELLBOX_LLM_MODEL)")
	system := fs.String("system", "You work in a Linux sandbox through its tools; files live in /workspace.", "the system prompt")
	box := fs.String("box", "default", "the box of the session the tools act on (created on first use)")
	allow := fs.String("allow", "", "comma-separated tools the model may call (default: every tool about one box except sandbox_create, sandbox_destroy, fork, branch and network_set)")
	maxTurns := fs.Int("max-turns", llm.DefaultMaxTurns, "model calls per message, at most")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *model == "" {
		return errors.New("no model: pass --model (or set CELLBOX_LLM_MODEL)")
	}
	if *maxTurns < 1 {
		return fmt.Errorf("--max-turns %d: give at least 1 (model calls per message)", *maxTurns)
	}
	if err := sandbox.CheckName(*box); err != nil {
		return fmt.Errorf("--box: %w", err)
	}
	if *cf.session == "" || *cf.token == "" {
		return errors.New("no session: run `eval \"$(cellbox session new)\"` or pass --session and --token")
	}
	p, err := llm.New(*provider, nil, nil)
	if err != nil {
		return err
	}
	// Ctrl-C is the chat's own (interrupt), not the end of ctx, which
	// SIGTERM still brings: a Ctrl-C that cancelled ctx failed every later
	// message, and nothing but EOF ended the chat.
	signal.Reset(os.Interrupt)
	interrupt := make(chan os.Signal, 1)
	signal.Notify(interrupt, os.Interrupt)
	defer signal.Stop(interrupt)
	opts := chatOptions{model: *model, system: *system, box: *box, maxTurns: *maxTurns, interrupt: interrupt, ready: func() {
		fmt.Fprintf(os.Stderr, "chatting with %s %s in box %q; Ctrl-C stops an answer, an empty line, Ctrl-D or Ctrl-C at the prompt ends\n", *provider, *model, *box)
	}}
	if *allow != "" {
		opts.allow = strings.Split(*allow, ",")
	}
	return chat(ctx, os.Stdin, os.Stdout, sandboxclient.New(*cf.server, *cf.session, *cf.token), p, opts)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// chatResultLimit caps a tool result as printed (the model gets it whole).
const chatResultLimit = 400

// chat reads user messages, one a line, from in and runs the tool loop on
// each, keeping the conversation; it prints the answer as it streams and
// each tool call and result as it happens. It is the llm node's loop
// (llm.Loop with builtins.BoxTools and its Runner), in a terminal.
func chat(ctx context.Context, in io.Reader, out io.Writer, c sandboxclient.Client, p llm.Provider, o chatOptions) error {
	ts, err := builtins.BoxTools(ctx, c, o.allow)
	if err != nil {
		return err
	}
	if o.ready != nil {
		o.ready()
	}
	run := ts.Runner(c, o.box)
	var history []llm.Message
	lines, readErr := readLines(ctx, in)
	for {
		fmt.Fprint(out, "> ")
		var line string
		select {
		case <-ctx.Done(): // SIGTERM
			fmt.Fprintln(out)
			return nil
		case <-o.interrupt: // Ctrl-C at the prompt
			fmt.Fprintln(out)
			return nil
		case l, ok := <-lines:
			if !ok {
				fmt.Fprintln(out)
				return <-readErr
			}
			line = strings.TrimSpace(l)
		}
		if line == "" || line == "/quit" {
			return nil
		}
		turn, endTurn := context.WithCancel(ctx)
		answered, cut := make(chan struct{}), make(chan bool, 1)
		go func() {
			select {
			case <-o.interrupt:
				endTurn()
				cut <- true
			case <-answered:
				cut <- false
			}
		}()
		req := llm.Request{Model: o.model, System: o.system, Tools: ts.Tools, Messages: append(history, llm.Text("user", line))}
		res, err := llm.Loop(turn, p, req, run, o.maxTurns, llm.LoopHooks{
			Unknown: ts.Unknown,
			Text:    func(_ int, piece string) { fmt.Fprint(out, printableLines(piece)) },
			ToolCall: func(call llm.ToolCall) {
				fmt.Fprintf(out, "\n→ %s %s\n", printable(call.Name), printable(string(call.Input)))
			},
			ToolResult: func(_ llm.ToolCall, result string, isError bool) {
				mark := "←"
				if isError {
					mark = "← error:"
				}
				if len(result) > chatResultLimit {
					result = result[:chatResultLimit] + fmt.Sprintf("… (%d bytes)", len(result))
				}
				fmt.Fprintf(out, "%s %s\n", mark, printableLines(result))
			},
		})
		close(answered)
		interrupted := <-cut
		endTurn()
		fmt.Fprintln(out)
		if ctx.Err() != nil { // SIGTERM
			return nil
		}
		if err != nil && interrupted {
			fmt.Fprintln(out, "interrupted: that message and its answer are dropped; the conversation goes on")
			continue
		}
		if err != nil {
			// The conversation goes on without the failed exchange.
			if errors.Is(err, llm.ErrMaxTurns) {
				err = fmt.Errorf("%d model calls and the model still asks for tools: raise --max-turns or narrow the task", o.maxTurns)
			}
			fmt.Fprintf(out, "error: %s\n", printableLines(err.Error()))
			continue
		}
		history = res.Messages
		fmt.Fprintf(out, "[%d turns, %d+%d tokens]\n", res.Turns, res.Usage.InputTokens, res.Usage.OutputTokens)
	}
}

// readLines reads in's lines into the channel it returns (closed at the
// end of in, when the error channel gets sc.Err()), so that the prompt can
// wait for a line, a Ctrl-C or ctx at once. It stops sending when ctx
// ends.
func readLines(ctx context.Context, in io.Reader) (<-chan string, <-chan error) {
	lines, errc := make(chan string), make(chan error, 1)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
				errc <- nil
				return
			}
		}
		errc <- sc.Err()
	}()
	return lines, errc
}
