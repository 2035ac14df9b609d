package llm_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/builtins/llm"
	"github.com/cellbox/cellbox/internal/llmtest"
)

// BenchmarkToolLoop is one small tool loop per op on each wire format: a
// streamed answer from the scripted server (loopback) asking for a tool,
// the tool (a no-op here), its result sent back, a streamed final answer —
// two model calls. ns/op includes the scripted server's own work, so it
// bounds cellbox's client and loop time from above; a box call adds what
// `cellbox bench boxes` measures for exec.
func BenchmarkToolLoop(b *testing.B) {
	for _, provider := range llm.Providers {
		b.Run(provider, func(b *testing.B) {
			turns := make([]llmtest.Turn, 0, 2*b.N)
			for range b.N {
				turns = append(turns,
					llmtest.Turn{Text: "running it", Calls: []llmtest.Call{{ID: "c", Name: "shell", Input: `{"command":"make test"}`}}},
					llmtest.Turn{Text: "the tests pass"})
			}
			s := llmtest.New(b, turns...)
			env := s.Env()
			p, err := llm.New(provider, func(k string) string { return env[k] }, s.Client())
			require.NoError(b, err)
			req := llm.Request{Model: "m", Messages: []llm.Message{llm.Text("user", "go")}, Tools: []llm.Tool{{Name: "shell", InputSchema: []byte(`{"type":"object"}`)}}}
			run := func(context.Context, llm.ToolCall) (string, bool) { return `{"exit_code":0}`, false }
			b.ResetTimer()
			for range b.N {
				if _, err := llm.Loop(context.Background(), p, req, run, 4, llm.LoopHooks{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
