package builtins_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/builtins"
	"github.com/cellbox/cellbox/builtins/llm"
	"github.com/cellbox/cellbox/internal/llmtest"
	"github.com/cellbox/cellbox/sandbox/sandboxtest"
)

// BenchmarkToolTurnInBox measures one turn of the tool loop with its box
// call: the model (the scripted server) asks for shell `true`, the call
// runs in a real bubblewrap box through the in-process client, and the
// model answers. Each op is that turn and the final answer (two model
// calls). Beside it, the same loop whose tool does nothing, so the
// difference is what a box call costs; the scripted server's own time is
// in both.
func BenchmarkToolTurnInBox(b *testing.B) {
	svc, _ := sandboxtest.Service(b, sandboxtest.Options{})
	ctx := context.Background()
	id, _, err := svc.NewSession(ctx)
	require.NoError(b, err)
	client := svc.Client(id)
	_, err = client.Tool(ctx, "shell", map[string]any{"sandbox": "bench", "command": "true"})
	require.NoError(b, err, "the box is up before the clock starts")
	ts, err := builtins.BoxTools(ctx, client, []string{"shell"})
	require.NoError(b, err)
	for _, tc := range []struct {
		name string
		run  llm.ToolRunner
	}{
		{"box", ts.Runner(client, "bench")},
		{"no-op tool", func(context.Context, llm.ToolCall) (string, bool) { return `{"exit_code":0}`, false }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			turns := make([]llmtest.Turn, 0, 2*b.N)
			for range b.N {
				turns = append(turns,
					llmtest.Turn{Text: "running it", Calls: []llmtest.Call{{ID: "c", Name: "shell", Input: `{"command":"true"}`}}},
					llmtest.Turn{Text: "done"})
			}
			s := llmtest.New(b, turns...)
			env := s.Env()
			p, err := llm.New("openai", func(k string) string { return env[k] }, s.Client())
			require.NoError(b, err)
			req := llm.Request{Model: "m", Messages: []llm.Message{llm.Text("user", "go")}, Tools: ts.Tools}
			b.ResetTimer()
			for range b.N {
				if _, err := llm.Loop(ctx, p, req, tc.run, 4, llm.LoopHooks{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
