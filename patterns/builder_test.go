package patterns

import (
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// csvPipeline builds testdata/csv/pattern.yaml in Go.
func csvPipeline() *Builder {
	b := New("csv-pipeline").Dir("testdata/csv").Describe("clean, filter and summarize a CSV file")
	threshold := b.Cell("threshold", 10)
	b.CellFile("raw", "data.csv")
	b.Cell("config", struct {
		Port int      `json:"port"`
		Tags []string `json:"tags"`
	}{8080, []string{"a", "b"}}, WithSchema(json.RawMessage(`{
		"type": "object",
		"properties": {"port": {"type": "integer"}},
		"required": ["port"]}`)))
	clean := b.Exec("clean", ExecSpec{
		Image:   Literal("cellbox/python"),
		Command: Command("python3 /workspace/clean.py"),
		Env:     Strings(map[string]string{"LC_ALL": "C.UTF-8"}),
		Files: map[string]Value{
			"/workspace/in.csv":     Ref("raw"),
			"/workspace/clean.py":   FromFile("clean.py"),
			"/workspace/note.txt":   Literal("static text"),
			"/workspace/out.csv":    OutputText,
			"/workspace/stats.json": OutputJSON,
		},
	})
	b.Exec("big", ExecSpec{
		Command: []Value{
			{Kind: ValueTemplate, Parts: []Part{{Text: "python3 /workspace/filter.py --min "}, {Expr: threshold.Expr}}},
			Literal("wc -l /workspace/big.csv"),
		},
		NoCache: true,
		Timeout: 30 * time.Second,
		Files: map[string]Value{
			"/workspace/in.csv":    Expr(clean.Expr + `.result.files["/workspace/out.csv"]`),
			"/workspace/filter.py": FromFile("filter.py"),
			"/workspace/big.csv":   OutputText,
		},
	})
	b.Computed("ok", "clean.result.exit_code == 0 && big.result.exit_code == 0")
	b.ComputedValue("summary", Str(`rows over ${threshold}: ${len(split(big.result.files["/workspace/big.csv"], "\n"))}`))
	b.DescribeNode("summary", "a line for the dashboard")
	b.Sandbox("repl", SandboxSpec{
		Image: Str("cellbox/python"),
		Env:   Strings(map[string]string{"PORT": "8080"}),
		Files: map[string]Value{
			"/workspace/config.json": Str("${config}"),
			"/workspace/result.txt":  OutputText,
		},
		Ports: []int{8080},
	})
	return b
}

func TestBuilderEqualsYAML(t *testing.T) {
	fromYAML, err := Load("testdata/csv")
	require.NoError(t, err)
	fromGo, err := csvPipeline().Build()
	require.NoError(t, err)

	assert.NotEqual(t, fromYAML.Source, fromGo.Source, "the sources differ")
	fromYAML.Source, fromGo.Source = nil, nil
	assert.Equal(t, fromYAML, fromGo)
}

func TestBuilderErrorsNameTheGoLine(t *testing.T) {
	_, file, line, _ := runtime.Caller(0)
	_ = file
	b := New("x")
	b.Cell("threshold", 10)                 // line+3
	b.Computed("big", "treshold * 2")       // line+4
	b.Computed("big", "1")                  // line+5
	b.Cell("bad", func() {})                // line+6
	b.Exec("e", ExecSpec{})                 // line+7
	b.ComputedValue("t", Str("${unclosed")) // line+8
	b.Exec("f", ExecSpec{Command: Command("x"), Files: map[string]Value{"/tmp/a": FromFile("a.txt")}})
	_, err := b.Build()
	require.Error(t, err)
	at := func(n int) string { return fmt.Sprintf("builder_test.go:%d", line+n) }
	assert.Equal(t, at(4)+`: nodes.big.computed: unknown cell "treshold" (did you mean "threshold"?)`+"\n"+
		at(5)+`: nodes.big: "big" is defined twice (first at `+at(4)+`)`+"\n"+
		at(6)+`: cells.bad: initial value: json: unsupported type: func()`+"\n"+
		at(7)+`: nodes.e.exec.command: missing: an exec node needs a command (a string or a list of strings)`+"\n"+
		at(8)+`: nodes.t.computed: "${" at column 1 has no closing "}"`+"\n"+
		at(9)+`: nodes.f.exec.files["/tmp/a"]: cannot read "a.txt": this pattern has no folder (load it from a file, or set the builder's Dir)`,
		err.Error())
	var list ErrorList
	require.True(t, errors.As(err, &list))
	assert.Len(t, list, 6)
}

func TestBuilderFS(t *testing.T) {
	b := New("x").FS("embedded", fstest.MapFS{"run.sh": {Data: []byte("echo hi\n")}})
	b.Exec("e", ExecSpec{Command: Command("sh /workspace/run.sh"), Files: map[string]Value{"/workspace/run.sh": FromFile("run.sh")}})
	b.Exec("g", ExecSpec{Command: Command("x"), Files: map[string]Value{"/tmp/b": FromFile("nope.sh")}})
	_, err := b.Build()
	require.Error(t, err)
	assert.Contains(t, err.Error(), `nodes.g.exec.files["/tmp/b"]: file "nope.sh" not found in the pattern folder embedded`)

	b = New("x").FS("embedded", fstest.MapFS{"run.sh": {Data: []byte("echo hi\n")}})
	b.Exec("e", ExecSpec{Command: Command("sh /workspace/run.sh"), Files: map[string]Value{"/workspace/run.sh": FromFile("run.sh")}})
	p, err := b.Build()
	require.NoError(t, err)
	assert.Equal(t, "echo hi\n", p.Nodes[0].Exec.Files["/workspace/run.sh"].Text)
}

func TestBuilderCopiesSpecs(t *testing.T) {
	files := map[string]Value{"/tmp/a": Literal("x")}
	b := New("x")
	b.Exec("e", ExecSpec{Command: Command("x"), Files: files})
	files["/tmp/b"] = Ref("nope")
	p, err := b.Build()
	require.NoError(t, err, "a change to the caller's map after Exec does not reach the pattern")
	assert.Len(t, p.Nodes[0].Exec.Files, 1)
}

func TestBuilderPorts(t *testing.T) {
	ports := []int{8000}
	b := New("x")
	b.Sandbox("web", SandboxSpec{Ports: ports})
	ports[0] = 1
	p, err := b.Build()
	require.NoError(t, err)
	assert.Equal(t, []int{8000}, p.Nodes[0].Sandbox.Ports, "the spec is copied")

	_, _, line, _ := runtime.Caller(0)
	b = New("x")
	b.Sandbox("bad", SandboxSpec{Ports: []int{8000, 65536, 8000}}) // line+2
	_, err = b.Build()
	at := fmt.Sprintf("builder_test.go:%d", line+2)
	assert.EqualError(t, err, at+`: nodes.bad.sandbox.ports[1]: port 65536 is out of range: want 1-65535`+"\n"+
		at+`: nodes.bad.sandbox.ports[2]: port 8000 is listed twice`)
}

func TestBuilderLLMEqualsYAML(t *testing.T) {
	fromYAML, err := Parse("p.yaml", []byte(`
name: agent
cells: {task: {value: hi}}
nodes:
  box: {sandbox: {}}
  agent:
    llm:
      provider: anthropic
      model: claude
      prompt: ${task}
      tools: {sandbox: box, allow: [shell, edit]}
      max_turns: 5
      cache: false
      timeout: 2m
`), nil)
	require.NoError(t, err)
	b := New("agent")
	b.Cell("task", "hi")
	b.Sandbox("box", SandboxSpec{})
	b.LLM("agent", LLMSpec{
		Provider: "anthropic", Model: Literal("claude"), Prompt: Ref("task"),
		Tools:    &LLMTools{Sandbox: "box", Allow: []string{"shell", "edit"}},
		MaxTurns: Literal("5"), NoCache: true, Timeout: Literal("2m"),
	})
	fromGo, err := b.Build()
	require.NoError(t, err)
	fromYAML.Source, fromGo.Source = nil, nil
	assert.Equal(t, fromYAML, fromGo)
	assert.Equal(t, []string{"box", "task"}, fromGo.Nodes[1].Reads, "the llm node reads its sandbox node")
}
