package examples_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/builtins"
	"github.com/cellbox/cellbox/internal/llmtest"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/kube/kubetest"
)

// TestCodingAgent plays a scripted model over the OpenAI wire format: it
// writes a buggy calc.py and its test, runs the test (fails), edits the
// bug, reruns (passes) and answers. The box really holds the fixed code,
// and the cells show the answer, the code and the tool calls.
func TestCodingAgent(t *testing.T) { codingAgent(t, nil) }

// TestCodingAgentOnKubernetes is TestCodingAgent with the agent's box a
// pod of the two-node test cluster.
func TestCodingAgentOnKubernetes(t *testing.T) {
	kc, ns := kubetest.Setup(t)
	codingAgent(t, kubetest.Open(t, kubetest.Options(t, kc, ns)))
}

func codingAgent(t *testing.T, be backend.Backend) {
	call := func(id, name string, input any) llmtest.Call {
		raw, _ := json.Marshal(input)
		return llmtest.Call{ID: id, Name: name, Input: string(raw)}
	}
	s := llmtest.New(t,
		llmtest.Turn{Text: "Writing the code and its test.", Calls: []llmtest.Call{
			call("1", "write_file", map[string]any{"path": "/workspace/calc.py", "content": "def add(a, b):\n    return a - b\n"}),
			call("2", "write_file", map[string]any{"path": "/workspace/test_calc.py", "content": "from calc import add\nassert add(2, 3) == 5, add(2, 3)\nprint('ok')\n"}),
		}},
		llmtest.Turn{Calls: []llmtest.Call{call("3", "shell", map[string]any{"command": "cd /workspace && python3 -B test_calc.py"})}},
		llmtest.Turn{Text: "add subtracts; fixing.", Calls: []llmtest.Call{
			call("4", "edit", map[string]any{"path": "/workspace/calc.py", "edits": []any{map[string]any{"oldText": "a - b", "newText": "a + b"}}}),
		}},
		llmtest.Turn{Calls: []llmtest.Call{call("5", "shell", map[string]any{"command": "cd /workspace && python3 -B test_calc.py"})}},
		llmtest.Turn{Text: "calc.add works and test_calc.py passes."},
	)
	w := newWorldOn(t, "", be)
	env := s.Env()
	w.env.LLM = builtins.LLMEnv{Getenv: func(k string) string { return env[k] }, HTTP: s.Client()}
	in := w.load(load(t, "coding-agent"))
	in.wait()

	assert.Equal(t, "calc.add works and test_calc.py passes.", in.str("answer"))
	fixed := "def add(a, b):\n    return a + b\n"
	eventually(t, 10*time.Second, "calc.py read back into the workspace's files", func() bool { return in.str("code") == fixed })
	var tools []string
	in.get("tool_calls", &tools)
	assert.Equal(t, []string{"write_file", "write_file", "shell", "edit", "shell"}, tools)

	var ws struct {
		Box     string                  `json:"box"`
		History []builtins.HistoryEntry `json:"history"`
	}
	in.get("workspace", &ws)
	var content strings.Builder
	_, err := w.env.Client.Download(t.Context(), ws.Box, "/workspace/calc.py", &content)
	require.NoError(t, err)
	assert.Equal(t, fixed, content.String(), "the box holds the fixed code")
	require.Len(t, ws.History, 5)
	assert.Contains(t, ws.History[2].Stdout, "AssertionError: -1", "the first run failed")
	assert.Contains(t, ws.History[4].Stdout, `ok\n`, "the second passed")

	reqs := s.Requests()
	require.Len(t, reqs, 5)
	assert.Equal(t, "llama3.1", reqs[0].Body["model"])
	assert.Contains(t, reqs[3].Raw, "AssertionError", "the model saw the failure")
}
