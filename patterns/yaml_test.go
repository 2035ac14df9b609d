package patterns

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"
	"time"
	"unicode/utf8"

	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLoadCSVPipeline(t *testing.T) {
	p, err := Load("testdata/csv")
	require.NoError(t, err)

	assert.Equal(t, "csv-pipeline", p.Name)
	assert.Equal(t, "testdata/csv", p.Dir)

	th, ok := p.Cell("threshold")
	require.True(t, ok)
	assert.JSONEq(t, `10`, string(th.Value))
	raw, _ := p.Cell("raw")
	assert.Equal(t, "data.csv", raw.File)
	assert.JSONEq(t, `"a,b\n1,20\n2,5\n"`, string(raw.Value), "a file cell holds the file's text")
	cfg, _ := p.Cell("config")
	assert.JSONEq(t, `{"port":8080,"tags":["a","b"]}`, string(cfg.Value))
	assert.JSONEq(t, `{"type":"object","properties":{"port":{"type":"integer"}},"required":["port"]}`, string(cfg.Schema))

	clean, ok := p.Node("clean")
	require.True(t, ok)
	assert.Equal(t, KindExec, clean.Kind)
	assert.Equal(t, []string{"raw"}, clean.Reads)
	assert.Equal(t, []Value{Literal("python3 /workspace/clean.py")}, clean.Exec.Command)
	assert.Equal(t, Literal("cellbox/python"), clean.Exec.Image)
	assert.Equal(t, map[string]Value{"LC_ALL": Literal("C.UTF-8")}, clean.Exec.Env)
	assert.Equal(t, map[string]Value{
		"/workspace/in.csv":     Ref("raw"),
		"/workspace/clean.py":   {Kind: ValueFile, Path: "clean.py", Text: "import sys\nprint(\"clean\")\n"},
		"/workspace/note.txt":   Literal("static text"),
		"/workspace/out.csv":    OutputText,
		"/workspace/stats.json": OutputJSON,
	}, clean.Exec.Files)
	assert.False(t, clean.Exec.NoCache)

	big, _ := p.Node("big")
	assert.Equal(t, []string{"clean", "threshold"}, big.Reads)
	assert.Equal(t, []Value{
		{Kind: ValueTemplate, Parts: []Part{{Text: "python3 /workspace/filter.py --min "}, {Expr: "threshold"}}},
		Literal("wc -l /workspace/big.csv"),
	}, big.Exec.Command)
	assert.True(t, big.Exec.NoCache)
	assert.Equal(t, 30*time.Second, big.Exec.Timeout)
	assert.Equal(t, Expr(`clean.result.files["/workspace/out.csv"]`), big.Exec.Files["/workspace/in.csv"])

	ok2, _ := p.Node("ok")
	assert.Equal(t, Expr("clean.result.exit_code == 0 && big.result.exit_code == 0"), ok2.Computed)
	assert.Equal(t, []string{"big", "clean"}, ok2.Reads)

	repl, _ := p.Node("repl")
	assert.Equal(t, KindSandbox, repl.Kind)
	assert.Equal(t, Literal("8080"), repl.Sandbox.Env["PORT"], "a number in env is its text")
	assert.Equal(t, OutputText, repl.Sandbox.Files["/workspace/result.txt"])

	// Source positions point at the lines the fields are written on.
	assert.Equal(t, Pos{File: "testdata/csv/pattern.yaml", Line: 15, Col: 3}, p.Where("nodes.clean"))
	assert.Equal(t, 21, p.Where(`nodes.clean.exec.files["/workspace/in.csv"]`).Line)
	assert.Equal(t, 29, p.Where("nodes.big.exec.command[0]").Line)
}

func TestLoadFileOrFolder(t *testing.T) {
	a, err := Load("testdata/csv")
	require.NoError(t, err)
	b, err := Load("testdata/csv/pattern.yaml")
	require.NoError(t, err)
	a.Source, b.Source = nil, nil
	assert.Equal(t, a, b)

	_, err = Load("testdata/nope")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "testdata/nope")

	// Another file is not read: its lines came back in the errors.
	secret := filepath.Join(t.TempDir(), "shadow")
	require.NoError(t, os.WriteFile(secret, []byte("root:$6$hash:20228:0:99999:7:::\n"), 0o600))
	_, err = Load(secret)
	require.ErrorContains(t, err, "not a .yaml file; give a pattern folder (holding pattern.yaml) or a .yaml file")
	assert.NotContains(t, err.Error(), "root:")
	yml := filepath.Join(t.TempDir(), "p.yml")
	require.NoError(t, os.WriteFile(yml, []byte("name: x\ncells: {a: 1}\n"), 0o600))
	_, err = Load(yml)
	assert.NoError(t, err, ".yml is a YAML file too")
}

func TestParseValid(t *testing.T) {
	fsys := fstest.MapFS{"s.py": {Data: []byte("print(1)\n")}}
	tests := []struct {
		name  string
		src   string
		check func(t *testing.T, p *Pattern)
	}{
		{"cells only", "name: c\ncells:\n  a: 1\n  b: [1, {x: y}]\n  c:\n  d: {value: null, schema: {type: integer}}\n", func(t *testing.T, p *Pattern) {
			require.Len(t, p.Cells, 4)
			assert.Equal(t, []string{"a", "b", "c", "d"}, []string{p.Cells[0].Name, p.Cells[1].Name, p.Cells[2].Name, p.Cells[3].Name})
			assert.JSONEq(t, `[1,{"x":"y"}]`, string(p.Cells[1].Value))
			assert.Nil(t, p.Cells[2].Value, "an empty cell starts as null")
			assert.Nil(t, p.Cells[3].Value, "a null initial value is not checked against the schema")
		}},
		{"yaml scalars become json", "name: c\ncells:\n  t: 2024-01-02\n  f: 1.5\n  h: <b>&\n  k: {value: {1: one, true: yes}}\n", func(t *testing.T, p *Pattern) {
			assert.Equal(t, `"2024-01-02"`, string(p.Cells[0].Value))
			assert.Equal(t, `1.5`, string(p.Cells[1].Value))
			assert.Equal(t, `"<b>&"`, string(p.Cells[2].Value))
			assert.Equal(t, `{"1":"one","true":"yes"}`, string(p.Cells[3].Value))
		}},
		{"aliases", "name: c\ncells:\n  a: &v {value: {x: 1}}\n  b: *v\nnodes:\n  e:\n    exec:\n      command: &cmd [echo hi]\n      env: &env {A: b}\n  f:\n    exec: {command: *cmd, env: *env}\n", func(t *testing.T, p *Pattern) {
			assert.Equal(t, p.Cells[0].Value, p.Cells[1].Value)
			assert.Equal(t, p.Nodes[0].Exec.Env, p.Nodes[1].Exec.Env)
		}},
		{"string rule", "name: c\ncells: {x: 1}\nnodes:\n  n:\n    exec:\n      command:\n        - echo $HOME $${x} ${x}\n        - ${ x }\n        - plain\n", func(t *testing.T, p *Pattern) {
			assert.Equal(t, []Value{
				{Kind: ValueTemplate, Parts: []Part{{Text: "echo $HOME ${x} "}, {Expr: "x"}}},
				Expr("x"),
				Literal("plain"),
			}, p.Nodes[0].Exec.Command)
		}},
		{"file forms", "name: c\nnodes:\n  n:\n    sandbox:\n      files:\n        /tmp/a: {file: s.py}\n        /tmp/b: {content: text}\n        /tmp/c: {output: json}\n        /tmp/d: json\n        /tmp/e: 42\n", func(t *testing.T, p *Pattern) {
			f := p.Nodes[0].Sandbox.Files
			assert.Equal(t, Value{Kind: ValueFile, Path: "s.py", Text: "print(1)\n"}, f["/tmp/a"])
			assert.Equal(t, Literal("text"), f["/tmp/b"], "content: is always literal")
			assert.Equal(t, OutputJSON, f["/tmp/c"])
			assert.Equal(t, OutputJSON, f["/tmp/d"])
			assert.Equal(t, Literal("42"), f["/tmp/e"])
		}},
		{"reading outputs", "name: c\nnodes:\n  e:\n    exec:\n      command: x\n      files: {/tmp/o: text}\n  s:\n    sandbox: {files: {/tmp/p: json}}\n  r: {computed: '${e.pending || e.error != nil ? \"\" : e.result.files[\"/tmp/o\"] + e.result.stdout + s.status + s.history[0].stdout + s.files[\"/tmp/p\"]}'}\n", func(t *testing.T, p *Pattern) {
			assert.Equal(t, []string{"e", "s"}, p.Nodes[2].Reads)
		}},
		{"ports and previews", "name: c\nnodes:\n  web:\n    sandbox: {ports: [8000, 5173]}\n  u: {computed: '${web.previews[\"8000\"].url + web.previews[\"5173\"].host_url}'}\n", func(t *testing.T, p *Pattern) {
			assert.Equal(t, []int{8000, 5173}, p.Nodes[0].Sandbox.Ports)
			assert.Equal(t, []string{"web"}, p.Nodes[1].Reads)
		}},
		{"start", "name: c\ncells: {v: 1}\nnodes:\n  a:\n    sandbox: {start: python3 server.py}\n  b:\n    sandbox:\n      start: {command: 'serve v${v}', port: 8000}\n  c:\n    sandbox: {start: {command: run, ready: test -f /tmp/up}}\n  s: {computed: '${a.server.state + b.server.output}'}\n", func(t *testing.T, p *Pattern) {
			assert.Equal(t, &StartSpec{Command: Literal("python3 server.py")}, p.Nodes[0].Sandbox.Start, "the short form")
			assert.Equal(t, 8000, p.Nodes[1].Sandbox.Start.Port)
			assert.Equal(t, []string{"v"}, p.Nodes[1].Reads, "the command is a template over cells")
			assert.Equal(t, Literal("test -f /tmp/up"), p.Nodes[2].Sandbox.Start.Ready)
			assert.Equal(t, []string{"a", "b"}, p.Nodes[3].Reads)
		}},
		{"exec network", "name: c\nnodes:\n  e: {exec: {command: pip download x, network: {allow: [pypi.org]}}}\n", func(t *testing.T, p *Pattern) {
			assert.Equal(t, []string{"pypi.org"}, p.Nodes[0].Exec.Network.Allow)
		}},
		{"network", "name: c\nnodes:\n  a: {sandbox: {network: true}}\n  b: {sandbox: {network: false}}\n  c:\n    sandbox:\n      network:\n        allow: [pypi.org, '*.internal', 10.1.2.0/24]\n        inject: [{host: pypi.org, header: X-Key, secret: PYPI}]\n", func(t *testing.T, p *Pattern) {
			assert.Equal(t, &api.Network{Full: true}, p.Nodes[0].Sandbox.Network)
			assert.Equal(t, &api.Network{}, p.Nodes[1].Sandbox.Network, "false is closed")
			assert.Equal(t, []string{"pypi.org", "*.internal", "10.1.2.0/24"}, p.Nodes[2].Sandbox.Network.Allow)
			assert.Equal(t, []api.Inject{{Host: "pypi.org", Header: "X-Key", Secret: "PYPI"}}, p.Nodes[2].Sandbox.Network.Inject)
		}},
		{"expression scopes", "name: c\ncells: {xs: [1], k: a}\nnodes:\n  r: {computed: '${let y = 2; map(filter(xs, # > 0), # * y)[0] + {\"v\": 1}[k]}'}\n", func(t *testing.T, p *Pattern) {
			assert.Equal(t, []string{"k", "xs"}, p.Nodes[0].Reads, "let variables and predicates are not references")
		}},
		{"template computed", "name: c\ncells: {n: 1}\nnodes:\n  t: {computed: 'n is ${n}'}\n", func(t *testing.T, p *Pattern) {
			assert.Equal(t, Value{Kind: ValueTemplate, Parts: []Part{{Text: "n is "}, {Expr: "n"}}}, p.Nodes[0].Computed)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse("p.yaml", []byte(tt.src), fsys)
			require.NoError(t, err)
			tt.check(t, p)
		})
	}
}

func TestParseErrors(t *testing.T) {
	fsys := fstest.MapFS{"clean.py": {Data: []byte("x")}, "lib/util.py": {Data: []byte("y")}, "bin.dat": {Data: []byte{0xff, 0xfe}}}
	tests := []struct {
		name string
		src  string
		want []string // each line of the error, in order
	}{
		{"malformed yaml", "name: x\n  bad: [\n", []string{
			`p.yaml:2: malformed YAML: mapping values are not allowed in this context`}},
		{"unquoted expression in flow mapping", "name: x\nnodes:\n  r:\n    sandbox:\n      files: {/i: ${x}}\n", []string{
			`p.yaml:5: malformed YAML: did not find expected ',' or '}' (inside {…} or […] YAML needs ${…} quoted: '${x}')`}},
		{"unquoted expression in a one-line flow mapping", "name: x\ncells:\n  a: 1\nnodes:\n  b: {computed: ${a + 1}}\n", []string{
			`p.yaml:5: malformed YAML: did not find expected ',' or '}' (inside {…} or […] YAML needs ${…} quoted: '${x}')`}},
		{"unclosed flow mapping names the line it opens on", "name: x\ncells:\n  a: {b: 1, c: {d: 2}\n  e: 3\n", []string{
			`p.yaml:3: malformed YAML: did not find expected ',' or '}'`}},
		{"unclosed flow sequence names the line it opens on", "name: x\ncells:\n  a: [1,\n    2\n  b: 3\n", []string{
			`p.yaml:3: malformed YAML: did not find expected ',' or ']'`}},
		{"unknown alias has its line", "name: x\ncells:\n  a: *nope\n", []string{
			`p.yaml:3: malformed YAML: unknown anchor 'nope' referenced`}},
		{"unclosed quote names the line it opens on", "name: x\ndescription: \"abc\ncells: {}\n", []string{
			`p.yaml:2: malformed YAML: found unexpected end of stream`}},
		{"key indented too little", "name: x\ncells:\n  a: 1\n b: 2\n", []string{
			`p.yaml:4: malformed YAML: did not find expected key`}},
		{"empty", "", []string{`p.yaml: empty pattern: it needs at least a name (see docs/patterns.md)`}},
		{"two documents", "name: a\n---\nname: b\n", []string{`p.yaml:2: more than one YAML document: a pattern file holds one`}},
		{"not a mapping", "[1, 2]\n", []string{`p.yaml:1: want a mapping with fields name, description, cells, nodes, got a list`}},
		{"missing name, misspelled field", "nam: x\n", []string{
			`p.yaml: name: missing: every pattern needs a name`,
			`p.yaml:1: nam: unknown field "nam" (did you mean "name"?) (fields: name, description, cells, nodes)`}},
		{"bad pattern name", "name: a b\n", []string{`p.yaml:1: name: "a b" is not a valid pattern name: use letters, digits, '-', '_' and '.'`}},
		{"unknown cell", "name: x\ncells:\n  threshold: 10\nnodes:\n  big: {computed: '${treshold * 2}'}\n", []string{
			`p.yaml:5: nodes.big.computed: unknown cell "treshold" (did you mean "threshold"?)`}},
		{"unknown node", "name: x\nnodes:\n  clean: {computed: '${1}'}\n  big: {computed: '${clen + 1}'}\n", []string{
			`p.yaml:4: nodes.big.computed: unknown node "clen" (did you mean "clean"?)`}},
		{"unknown name without suggestion", "name: x\ncells: {a: 1}\nnodes:\n  b: {computed: '${zzz}'}\n", []string{
			`p.yaml:4: nodes.b.computed: unknown cell or node "zzz" (cells: a; nodes: b)`}},
		{"a let binds its name within the let only", "name: x\ncells: {a: 1}\nnodes:\n  b: {computed: '${(let zzz = 1; zzz) + zzz}'}\n", []string{
			`p.yaml:4: nodes.b.computed: unknown cell or node "zzz" (cells: a; nodes: b)`}},
		{"unknown field with suggestion", "name: x\nnodes:\n  clean:\n    exec:\n      comand: echo\n", []string{
			`p.yaml:5: nodes.clean.exec.comand: unknown field "comand" (did you mean "command"?) (fields: command, image, env, files, cache, timeout, network)`}},
		{"missing command", "name: x\nnodes:\n  e:\n    exec: {image: x}\n", []string{
			`p.yaml:4: nodes.e.exec.command: missing: an exec node needs a command (a string or a list of strings)`}},
		{"unknown node kind", "name: x\nnodes:\n  a: {exce: {command: x}}\n  c: {}\n", []string{
			`p.yaml:3: nodes.a.exce: unknown node kind "exce" (did you mean "exec"?) (kinds: computed, exec, sandbox, fetch, llm)`,
			`p.yaml:4: nodes.c: missing node kind: write one of computed, exec, sandbox, fetch, llm`}},
		{"node field beside its kind", "name: x\nnodes:\n  a: {computed: '${1}', extra: 1, descriptoin: x}\n", []string{
			`p.yaml:3: nodes.a.extra: unknown field "extra": a node holds its kind and a description, and the kind's settings go under it (fields: computed, exec, sandbox, fetch, llm, description)`,
			`p.yaml:3: nodes.a.descriptoin: unknown field "descriptoin" (did you mean "description"?): a node holds its kind and a description, and the kind's settings go under it (fields: computed, exec, sandbox, fetch, llm, description)`}},
		{"llm node", "name: x\ncells: {t: {value: hi}}\nnodes:\n  e: {exec: {command: x}}\n  a: {llm: {provider: opneai, model: m, prompt: '${t}', tools: {sandbox: e}, max_tokens: lots, timeout: soon}}\n  b: {llm: {provider: openai, model: m}}\n  c: {computed: '${b.result.txt}'}\n", []string{
			`p.yaml:5: nodes.a.llm.provider: unknown provider "opneai" (did you mean "openai"?) (providers: anthropic, openai)`,
			`p.yaml:5: nodes.a.llm.max_tokens: "lots" is not a number (or write an expression, ${…})`,
			`p.yaml:5: nodes.a.llm.timeout: want a positive duration such as 30s or 5m (or an expression, ${…}), got "soon"`,
			`p.yaml:5: nodes.a.llm.tools.sandbox: "e" is not a sandbox node of this pattern: tools act on a sandbox node's box`,
			`p.yaml:6: nodes.b.llm: give prompt (a user message) or messages (a conversation), one of the two`,
			`p.yaml:7: nodes.c.computed: llm node "b" has no output "result.txt" (did you mean "text"?) (result has: text, messages, tool_calls, usage, stop_reason, turns)`}},
		{"two kinds", "name: x\nnodes:\n  k: {computed: '${1}', exec: {command: x}}\n", []string{
			`p.yaml:3: nodes.k.exec: a node has one kind; "k" already has computed`}},
		{"node not a mapping", "name: x\nnodes:\n  k: echo hi\n", []string{
			`p.yaml:3: nodes.k: want a node: a mapping with one of computed, exec, sandbox, fetch, llm, got the string "echo hi"`}},
		{"computed without ${}", "name: x\ncells: {a: 1}\nnodes:\n  g: {computed: a + 1}\n  h: {computed: 5}\n", []string{
			`p.yaml:4: nodes.g.computed: "a + 1" is not an expression: write ${…} around it (e.g. '${a + 1}')`,
			`p.yaml:5: nodes.h.computed: "5" is not an expression: write ${…} around it (e.g. '${5}')`}},
		{"bad expressions", "name: x\ncells: {a: 1}\nnodes:\n  e: {computed: '${a +}'}\n  f: {computed: 'x ${a'}\n  h: {computed: '${lenn(a)}'}\n  j: {computed: 'a ${}'}\n", []string{
			`p.yaml:4: nodes.e.computed: bad expression "a +": unexpected token EOF at column 3`,
			`p.yaml:5: nodes.f.computed: "${" at column 3 has no closing "}"`,
			`p.yaml:6: nodes.h.computed: unknown function "lenn" (did you mean "len"?)`,
			`p.yaml:7: nodes.j.computed: empty ${} at column 3`}},
		{"node outputs", "name: x\nnodes:\n  e:\n    exec: {command: x, files: {/tmp/o: text, /tmp/i: in}}\n" +
			"  a: {computed: '${e.reslt}'}\n  b: {computed: '${e.result.exitcode}'}\n  c: {computed: '${e.result.files[\"/tmp/0\"]}'}\n  d: {computed: '${e.result.files[\"/tmp/i\"]}'}\n" +
			"  r:\n    sandbox: {files: {/tmp/p: json}}\n  f: {computed: '${r.run}'}\n  g: {computed: '${r.histry}'}\n  h: {computed: '${r.files[\"/tmp/q\"]}'}\n", []string{
			`p.yaml:5: nodes.a.computed: exec node "e" has no output "reslt" (did you mean "result"?) (outputs: pending, result, error)`,
			`p.yaml:6: nodes.b.computed: exec node "e" has no output "result.exitcode" (did you mean "exit_code"?) (result has: stdout, stderr, exit_code, truncated, files)`,
			`p.yaml:7: nodes.c.computed: exec node "e" has no output file "/tmp/0" (did you mean "/tmp/o"?) (output files: /tmp/o)`,
			`p.yaml:8: nodes.d.computed: file "/tmp/i" of exec node "e" is an input (literal), not an output: declare it as text or json to read it back`,
			`p.yaml:11: nodes.f.computed: r.run is a stream of sandbox node "r": send events to it, expressions cannot read it`,
			`p.yaml:12: nodes.g.computed: sandbox node "r" has no output "histry" (did you mean "history"?) (outputs: pending, status, box, error, history, files, previews, server)`,
			`p.yaml:13: nodes.h.computed: sandbox node "r" has no output file "/tmp/q" (did you mean "/tmp/p"?) (output files: /tmp/p)`}},
		{"cycle", "name: x\nnodes:\n  clean:\n    exec:\n      command: echo\n      files:\n        /tmp/in: ${big}\n  big: {computed: '${clean.result.stdout}'}\n  self: {computed: '${self + 1}'}\n", []string{
			`p.yaml:7: nodes.clean.exec.files["/tmp/in"]: dependency cycle clean -> big -> clean (clean reads big at p.yaml:7; big reads clean at p.yaml:8)`,
			`p.yaml:9: nodes.self.computed: dependency cycle self -> self (self reads self at p.yaml:9)`}},
		{"files", "name: x\nnodes:\n  e:\n    exec:\n      command: x\n      files:\n        /workspace/a: {file: clen.py}\n        /workspace/b: {file: ../x}\n        c: text\n        /workspace/d: {file: lib/utill.py}\n        /workspace/e: {file: lib}\n        /workspace/f: {file: bin.dat}\n        /workspace/g: {file: a, content: b}\n        /workspace/h: {output: xml}\n        /workspace/i:\n        /workspace/j: {}\n        /etc/motd2: hello\n        /workspace: hello\n        /tmp/ok: hello\n", []string{
			`p.yaml:7: nodes.e.exec.files["/workspace/a"]: file "clen.py" not found in the pattern folder (in memory) (did you mean "clean.py"?)`,
			`p.yaml:8: nodes.e.exec.files["/workspace/b"]: "../x" is not a path inside the pattern folder (use a relative path without ..)`,
			`p.yaml:9: nodes.e.exec.files.c: "c" is not a clean absolute path in the box (e.g. "/workspace/c")`,
			`p.yaml:10: nodes.e.exec.files["/workspace/d"]: file "lib/utill.py" not found in the pattern folder (in memory) (did you mean "lib/util.py"?)`,
			`p.yaml:11: nodes.e.exec.files["/workspace/e"]: "lib" is a folder, not a file`,
			`p.yaml:12: nodes.e.exec.files["/workspace/f"]: file "bin.dat" is not UTF-8 text (binary files are not supported yet)`,
			`p.yaml:13: nodes.e.exec.files["/workspace/g"]: a file takes one of file, content, output`,
			`p.yaml:14: nodes.e.exec.files["/workspace/h"].output: unknown output format "xml" (want text or json)`,
			`p.yaml:15: nodes.e.exec.files["/workspace/i"]: want file content, a ${…} expression, {file: path}, or text/json for an output, got nothing (null)`,
			`p.yaml:16: nodes.e.exec.files["/workspace/j"]: empty mapping: a file takes one of file, content, output`,
			`p.yaml:17: nodes.e.exec.files["/etc/motd2"]: "/etc/motd2" is outside /workspace and /tmp, where a box's files are read and written (e.g. "/workspace/motd2")`,
			`p.yaml:18: nodes.e.exec.files["/workspace"]: "/workspace" is outside /workspace and /tmp, where a box's files are read and written (e.g. "/workspace/workspace")`}},
		{"cell forms", "name: x\ncells:\n  config: {port: 8080}\n  both: {value: 1, file: clean.py}\n  missing: {file: nope.txt}\n  ok: {file: clean.py}\n", []string{
			`p.yaml:3: cells.config.port: unknown field "port" (fields: value, file, schema, description); a cell written as a mapping takes these fields, so write an object value under value: (config: {value: {...}})`,
			`p.yaml:4: cells.both.file: a cell takes value or file, not both`,
			`p.yaml:5: cells.missing.file: file "nope.txt" not found in the pattern folder (in memory)`}},
		{"schema not a mapping", "name: x\ncells:\n  u: {value: 1, schema: [1]}\n", []string{
			`p.yaml:3: cells.u.schema: a JSON Schema is a mapping (or true/false), got a list`}},
		{"names", "name: x\ncells:\n  a: 1\n  a: 2\n  s: 1\nnodes:\n  s: {computed: '${1}'}\n  raw-data: {computed: '${1}'}\n  len: {computed: '${1}'}\n  user: {computed: '${raw-data}'}\n", []string{
			`p.yaml:4: cells.a: "a" is defined twice (first at p.yaml:3)`,
			`p.yaml:7: nodes.s: name "s" is already used by a cell (p.yaml:5); cells and nodes share one namespace`,
			`p.yaml:8: nodes.raw-data: "raw-data" is not a valid node name: use letters, digits and '_', not starting with a digit (expressions refer to it by name)`,
			`p.yaml:9: nodes.len: "len" is an expression built-in; choose another node name`,
			`p.yaml:10: nodes.user.computed: unknown cell or node "raw" (cells: a, s; nodes: len, raw-data, user)`,
			`p.yaml:10: nodes.user.computed: unknown cell or node "data" (cells: a, s; nodes: len, raw-data, user)`}},
		{"field types", "name: x\nnodes:\n  e:\n    exec:\n      command: 5\n      cache: maybe\n      timeout: forever\n      env: {A-B: x, C: null}\n      image: [a]\n  f:\n    exec: {command: []}\n", []string{
			`p.yaml:5: nodes.e.exec.command: want a command: a string or a list of strings, got the number 5`,
			`p.yaml:6: nodes.e.exec.cache: want true or false, got the string "maybe"`,
			`p.yaml:7: nodes.e.exec.timeout: want a positive duration such as 30s or 5m, got "forever"`,
			`p.yaml:8: nodes.e.exec.env.C: want a string, got nothing (null)`,
			`p.yaml:8: nodes.e.exec.env.A-B: "A-B" is not a valid environment variable name`,
			`p.yaml:9: nodes.e.exec.image: want a string, got a list`,
			`p.yaml:11: nodes.f.exec.command: empty command list`}},
		{"blank commands", "name: x\nnodes:\n  e:\n    exec:\n      command: ''\n  f:\n    exec:\n      command: [echo a, '  ', '${x}']\ncells:\n  x: ''\n", []string{
			`p.yaml:5: nodes.e.exec.command: empty command: give a command for bash to run (e.g. python3 main.py)`,
			`p.yaml:8: nodes.f.exec.command[1]: empty command: give a command for bash to run (e.g. python3 main.py)`}},
		{"ports", "name: x\nnodes:\n  w:\n    sandbox:\n      ports:\n        - 8000\n        - 0\n        - 70000\n        - http\n        - 8000\n  v:\n    sandbox: {ports: 8000}\n", []string{
			`p.yaml:7: nodes.w.sandbox.ports[1]: port 0 is out of range: want 1-65535`,
			`p.yaml:8: nodes.w.sandbox.ports[2]: port 70000 is out of range: want 1-65535`,
			`p.yaml:9: nodes.w.sandbox.ports[3]: want a port number (1-65535), got the string "http"`,
			`p.yaml:10: nodes.w.sandbox.ports[4]: port 8000 is listed twice`,
			`p.yaml:12: nodes.v.sandbox.ports: want a list of port numbers such as [8000], got the number 8000`}},
		{"start", "name: x\nnodes:\n  a: {sandbox: {start: 5}}\n  b: {sandbox: {start: {port: 8000}}}\n  c: {sandbox: {start: {command: x, port: 70000}}}\n  d: {sandbox: {start: {command: x, port: 80, ready: y}}}\n  e: {sandbox: {start: {command: x, port: http, wait: 1}}}\n", []string{
			`p.yaml:3: nodes.a.sandbox.start: want a command ("python3 server.py") or {command: ..., port: 8000} or {command: ..., ready: ...}, got the number 5`,
			`p.yaml:4: nodes.b.sandbox.start.command: missing: the command that starts the server (e.g. python3 server.py)`,
			`p.yaml:5: nodes.c.sandbox.start.port: port 70000 is out of range: want 1-65535`,
			`p.yaml:6: nodes.d.sandbox.start.ready: give port or ready, not both: the server is ready when its port accepts connections (port) or when the ready command exits 0 (ready)`,
			`p.yaml:7: nodes.e.sandbox.start.wait: unknown field "wait" (fields: command, port, ready)`,
			`p.yaml:7: nodes.e.sandbox.start.port: want a port number (1-65535), got the string "http"`}},
		{"network", "name: x\nnodes:\n  a: {sandbox: {network: yes please}}\n  b: {sandbox: {network: {allow: [10.0.0.0/33]}}}\n  c: {sandbox: {network: {allow: [x.org], inject: [{host: x.org, header: K, value: sk-1}]}}}\n  d: {sandbox: {network: {alow: [x.org]}}}\n", []string{
			`p.yaml:3: nodes.a.sandbox.network: want true, false or {allow: [...], inject: [...]}, got the string "yes please"`,
			`p.yaml:4: nodes.b.sandbox.network: network: allow "10.0.0.0/33": not a CIDR: netip.ParsePrefix("10.0.0.0/33"): prefix length out of range (want example.org, *.example.org, 10.1.2.0/24 or 1.2.3.4, each optionally with :PORT)`,
			`p.yaml:5: nodes.c.sandbox.network: inject[0]: a pattern names a server secret (secret: NAME, the server's CELLBOX_SECRET_NAME), never a value: the file would carry the key`,
			`p.yaml:6: nodes.d.sandbox.network: network: want true, or an object {"allow": [...], "inject": [...]}: json: unknown field "alow"`}},
		{"reading previews", "name: x\nnodes:\n  w: {sandbox: {ports: [8000, 8001]}}\n  n: {sandbox: {}}\n" +
			"  a: {computed: '${w.previews[\"8080\"]}'}\n  b: {computed: '${w.previews[\"8000\"].ulr}'}\n  c: {computed: '${n.previews[\"8000\"]}'}\n  d: {computed: '${w.previews}'}\n", []string{
			`p.yaml:5: nodes.a.computed: sandbox node "w" has no preview of port "8080" (did you mean "8000"?) (ports: 8000, 8001)`,
			`p.yaml:6: nodes.b.computed: a preview of sandbox node "w" has no field "ulr" (did you mean "url"?) (fields: url, host_url)`,
			`p.yaml:7: nodes.c.computed: sandbox node "n" declares no ports, so it has no previews (add ports: [8000])`}},
		{"json values", "name: x\ncells:\n  a: .inf\n  b: !custom 1\n  c: {value: {? [1]: 2}}\n  d: {value: {<<: {a: 1}}}\n", []string{
			`p.yaml:3: cells.a: .inf is not a JSON number`,
			`p.yaml:4: cells.b: unsupported YAML tag !custom`,
			`p.yaml:5: cells.c.value: a JSON object key must be a plain string, got a list`,
			`p.yaml:6: cells.d.value: merge keys (<<) are not supported; write the fields out (aliases such as *name are fine)`}},
		{"many errors at once", "name: x\ncells: {a: 1}\nnodes:\n  b: {computed: '${aa}'}\n  c: {computed: '${bb}'}\n  d: {computed: '${cc}'}\n", []string{
			`p.yaml:4: nodes.b.computed: unknown cell "aa" (did you mean "a"?)`,
			`p.yaml:5: nodes.c.computed: unknown node "bb" (did you mean "b"?)`,
			`p.yaml:6: nodes.d.computed: unknown node "cc" (did you mean "c"?)`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse("p.yaml", []byte(tt.src), fsys)
			require.Error(t, err)
			assert.Nil(t, p)
			assert.Equal(t, strings.Join(tt.want, "\n"), err.Error())
			var list ErrorList
			require.True(t, errors.As(err, &list))
			assert.Len(t, list, len(tt.want))
		})
	}
}

// What the runtime refuses in an expression (builtins.Parse) is an error
// here too, placed on the field, in the runtime's words.
func TestRuntimeRefusals(t *testing.T) {
	_, err := Parse("p.yaml", []byte("name: x\nnodes:\n  d: {computed: '${now()}'}\n  i: {computed: 'x ${$env}'}\n"), nil)
	var list ErrorList
	require.ErrorAs(t, err, &list)
	require.Len(t, list, 2)
	assert.Equal(t, Pos{File: "p.yaml", Line: 3, Col: 7}, list[0].Pos)
	assert.Equal(t, "nodes.d.computed", list[0].Path)
	assert.Contains(t, list[0].Msg, "now()")
	assert.Contains(t, list[0].Msg, "not allowed")
	assert.Equal(t, "nodes.i.computed", list[1].Path)
	assert.Contains(t, list[1].Msg, "$env is not allowed")
}

// Schemas are checked by the same validator the cell store uses on writes;
// its messages are its own.
func TestSchemas(t *testing.T) {
	_, err := Parse("p.yaml", []byte("name: x\ncells:\n"+
		"  s: {value: {port: x}, schema: {type: object, properties: {port: {type: integer}}}}\n"+
		"  t: {value: 1, schema: {type: frob}}\n"+
		"  u: {schema: {type: integer}}\n"+
		"  v: {value: 3, schema: {type: integer, minimum: 1}}\n"), nil)
	var list ErrorList
	require.ErrorAs(t, err, &list)
	require.Len(t, list, 2, "an absent initial value is not checked; a good one passes")
	assert.Equal(t, "p.yaml:3: cells.s.schema", list[0].Pos.String()+": "+list[0].Path)
	assert.Contains(t, list[0].Msg, "initial value does not satisfy the schema: /port: ")
	assert.Contains(t, list[0].Msg, "integer")
	assert.Equal(t, "p.yaml:4: cells.t.schema", list[1].Pos.String()+": "+list[1].Path)
	assert.Contains(t, list[1].Msg, "invalid JSON Schema")
	assert.Contains(t, list[1].Msg, "frob")
}

func TestErrorsAreReachable(t *testing.T) {
	_, err := Parse("p.yaml", []byte("name: x\nnodes:\n  b: {computed: '${a}'}\n"), nil)
	var e *Error
	require.True(t, errors.As(err, &e))
	assert.Equal(t, Pos{File: "p.yaml", Line: 3, Col: 7}, e.Pos)
	assert.Equal(t, "nodes.b.computed", e.Path)
}

func TestFileWithoutFolder(t *testing.T) {
	_, err := Parse("p.yaml", []byte("name: x\ncells:\n  a: {file: x.txt}\n"), nil)
	require.EqualError(t, err, `p.yaml:3: cells.a.file: cannot read "x.txt": this pattern has no folder (load it from a file, or set the builder's Dir)`)
}

func TestAliasBomb(t *testing.T) {
	src := "name: x\ncells:\n  a: &a [1,1,1,1,1,1,1,1,1,1]\n"
	prev := "a"
	for i := range 8 {
		name := string(rune('b' + i))
		src += "  " + name + ": &" + name + " [*" + prev + ",*" + prev + ",*" + prev + ",*" + prev + ",*" + prev + ",*" + prev + ",*" + prev + ",*" + prev + ",*" + prev + ",*" + prev + "]\n"
		prev = name
	}
	_, err := Parse("p.yaml", []byte(src), nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "value too large or too deep")
}

// TestSelfAlias: an alias inside the value it names is said to be so, in
// one short line; a value too deep to take has its path cut in the middle
// (both used to print 1,000 levels of path, 3 KB).
func TestSelfAlias(t *testing.T) {
	for _, src := range []string{"x: &a [*a]", "x: &a {value: {k: [1, {z: *a}]}}"} {
		_, err := Parse("p.yaml", []byte("name: x\ncells:\n  "+src+"\n"), nil)
		require.Error(t, err, src)
		assert.Contains(t, err.Error(), "alias *a is inside the value it names", src)
		assert.Less(t, len(err.Error()), 200, src)
	}
	deep := strings.Repeat("[", MaxDepth+10) + strings.Repeat("]", MaxDepth+10)
	_, err := Parse("p.yaml", []byte("name: x\ncells:\n  x: "+deep+"\n"), nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "value too large or too deep")
	assert.Contains(t, err.Error(), "p.yaml:3: cells.x[0][0]")
	assert.Less(t, len(err.Error()), 400)

	// Cut between the bytes of a key's rune, the path stays valid UTF-8.
	cut := shortPath("a" + strings.Repeat("é", 200) + "b")
	assert.True(t, utf8.ValidString(cut), "%q", cut)
	assert.Contains(t, cut, "…(282 bytes)…")
}

func TestDescriptionIsJSON(t *testing.T) {
	p, err := Load("testdata/csv")
	require.NoError(t, err)
	b, err := json.Marshal(p)
	require.NoError(t, err)
	var back Pattern
	require.NoError(t, json.Unmarshal(b, &back))
	back.Source = p.Source
	assert.Equal(t, p, &back, "a description survives a JSON round trip")
}

// TestLoadRefusesSpecialFiles: a pattern file, or a file it references, that
// is a device (given by path, or behind a symlink in the pattern folder) is
// refused, and so is a FIFO as a file: reference; a pattern file read from
// a FIFO nobody writes to is empty. Before, Load read /dev/zero until the
// server ran out of memory and blocked forever opening a FIFO.
func TestLoadRefusesSpecialFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	folder := func(target string) string {
		d := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(d, FileName), []byte("name: x\ncells:\n  a: {file: data.txt}\n"), 0o600))
		require.NoError(t, os.Symlink(target, filepath.Join(d, "data.txt")))
		return d
	}
	fifoFolder := func() string {
		d := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(d, FileName), []byte("name: x\ncells:\n  a: {file: data.txt}\n"), 0o600))
		require.NoError(t, syscall.Mkfifo(filepath.Join(d, "data.txt"), 0o600))
		return d
	}
	linked := func(target string) string {
		d := t.TempDir()
		require.NoError(t, os.Symlink(target, filepath.Join(d, FileName)))
		return d
	}
	tests := []struct{ name, path, want string }{
		{"fifo without a writer", fifo, "empty pattern"},
		{"fifo behind the folder's pattern.yaml", linked(fifo), "empty pattern"},
		{"fifo as a file: reference", fifoFolder(), `"data.txt" is a named pipe (FIFO), not a regular file`},
		{"a link out of the folder to a fifo", folder(fifo), `"data.txt" links out of the pattern folder`},
		{"device", "/dev/zero", "a device, not a regular file or a pipe"},
		{"device behind the folder's pattern.yaml", linked("/dev/zero"), "a device, not a regular file or a pipe"},
		{"a link out of the folder to a device", folder("/dev/zero"), `"data.txt" links out of the pattern folder`},
		{"a link out of the folder to a file", folder("/etc/hostname"), `"data.txt" links out of the pattern folder`},
		{"a relative link out of the folder", folder("../outside.txt"), `"data.txt" links out of the pattern folder`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadOrHang(t, tt.path)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}

	// A link inside the folder is followed.
	in := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(in, FileName), []byte("name: x\ncells:\n  a: {file: data.txt}\n"), 0o600))
	require.NoError(t, os.Mkdir(filepath.Join(in, "sub"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(in, "sub", "real.txt"), []byte("inside"), 0o600))
	require.NoError(t, os.Symlink("sub/real.txt", filepath.Join(in, "data.txt")))
	p, err := loadOrHang(t, in)
	require.NoError(t, err)
	assert.JSONEq(t, `"inside"`, string(p.Cells[0].Value))

	// A pipe is read, as bash's cellbox run <(make-pattern) passes it.
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	_, err = w.WriteString("name: piped\n")
	require.NoError(t, err)
	require.NoError(t, w.Close())
	p, err = loadOrHang(t, fmt.Sprintf("/proc/self/fd/%d", r.Fd()))
	require.NoError(t, err)
	assert.Equal(t, "piped", p.Name)
}

// loadOrHang runs Load, failing the test if it does not return.
func loadOrHang(t *testing.T, path string) (*Pattern, error) {
	t.Helper()
	type result struct {
		p   *Pattern
		err error
	}
	done := make(chan result, 1)
	go func() { p, err := Load(path); done <- result{p, err} }()
	select {
	case r := <-done:
		return r.p, r.err
	case <-time.After(10 * time.Second):
		t.Fatalf("Load(%s) did not return (a hang guard, not a timing assertion)", path)
		return nil, nil
	}
}
