package patterns

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/cellbox/cellbox/builtins"
	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/runtime"
)

// DefaultSpace is the space Compile puts a pattern instance in.
const DefaultSpace = "default"

// Compile turns a validated pattern (from Load, Parse or Build) into the
// runtime's graph: instance p.Name in DefaultSpace. See CompileInstance.
func Compile(p *Pattern, env builtins.Env) (runtime.Pattern, error) {
	return CompileInstance(p, env, DefaultSpace, p.Name)
}

// CompileInstance turns a validated pattern into the runtime's graph for
// the instance name in space (one pattern may run as several instances).
// Cells keep their initial values and schemas; each node becomes its
// built-in (computed, exec, sandbox, fetch), reading the cells and nodes its
// expressions name (Node.Reads), with each field a builtins.Field of those
// inputs. exec and sandbox nodes drive boxes through env.Client, which
// they then require.
func CompileInstance(p *Pattern, env builtins.Env, space, name string) (runtime.Pattern, error) {
	out := runtime.Pattern{Space: space, Name: name}
	for _, part := range []struct{ what, v string }{{"space", space}, {"instance name", name}} {
		if !patternNameRE.MatchString(part.v) {
			return out, fmt.Errorf("compile pattern %s: %s %q: use letters, digits, '-', '_' and '.' (not starting with '.', '-' or '_')", p.Name, part.what, part.v)
		}
	}
	for _, c := range p.Cells {
		out.Cells = append(out.Cells, runtime.Cell{Name: c.Name, Initial: c.Value, Schema: c.Schema})
	}
	e := &errs{where: p.Where}
	boxes := map[string]*builtins.Sandbox{} // for the llm nodes given their tools
	var llms []int
	for i := range p.Nodes {
		n := &p.Nodes[i]
		c := compiler{e: e, at: field("nodes", n.Name)}
		rn := runtime.Node{Name: n.Name, Inputs: n.Reads, Builtin: string(n.Kind)}
		addr := cells.Address{Space: space, Pattern: name, Name: n.Name}
		var err error
		switch n.Kind {
		case KindComputed:
			rn.Kind = c.computed(n.Computed)
		case KindExec:
			rn.Kind, err = builtins.NewExec(env, c.exec(addr, n.Exec))
		case KindFetch:
			rn.Kind, err = builtins.NewFetch(env, c.fetch(addr, n.Fetch))
		case KindSandbox:
			var sb *builtins.Sandbox
			sb, err = builtins.NewSandbox(env, c.sandbox(addr, n.Sandbox))
			rn.Kind, boxes[n.Name] = sb, sb
			rn.Streams = slices.Clone(streams[KindSandbox])
		case KindLLM:
			llms = append(llms, len(out.Nodes)) // after the sandbox nodes, below
		default:
			e.add(c.at, "unknown node kind %q", n.Kind)
		}
		if err != nil {
			e.add(c.at, "%v", err)
		}
		out.Nodes = append(out.Nodes, rn)
	}
	for _, i := range llms {
		n := &p.Nodes[i]
		c := compiler{e: e, at: field("nodes", n.Name)}
		addr := cells.Address{Space: space, Pattern: name, Name: n.Name}
		k, err := builtins.NewLLM(env, c.llm(addr, n.LLM, boxes))
		if err != nil {
			e.add(c.at, "%v", err)
			continue
		}
		out.Nodes[i].Kind = k
	}
	if err := e.err(); err != nil {
		return runtime.Pattern{}, err
	}
	return out, nil
}

// compiler compiles the fields of one node, collecting errors.
type compiler struct {
	e  *errs
	at string
}

// field compiles a value (literal, expression, template or file of the
// pattern) into a builtins.Field; nil for an unset value.
func (c compiler) field(at string, v Value) builtins.Field {
	switch v.Kind {
	case "":
		return nil
	case ValueLiteral, ValueFile:
		return builtins.Const(v.Text)
	case ValueExpr:
		if x := c.expr(at, v.Expr); x != nil {
			return builtins.ExprField(x)
		}
	case ValueTemplate:
		parts := make([]builtins.TemplatePart, len(v.Parts))
		for i, p := range v.Parts {
			parts[i].Text = p.Text
			if p.Expr != "" {
				parts[i].Expr = c.expr(at, p.Expr)
			}
		}
		return builtins.TemplateField(parts)
	default:
		c.e.add(at, "a %s value is not allowed here", v.Kind)
	}
	return builtins.Const(nil)
}

func (c compiler) expr(at, src string) *builtins.Expr {
	x, err := builtins.Parse(src)
	if err != nil {
		c.e.add(at, "%v", err)
	}
	return x
}

func (c compiler) computed(v Value) runtime.Compute {
	at := field(c.at, "computed")
	if v.Kind == ValueExpr {
		if x := c.expr(at, v.Expr); x != nil {
			return &builtins.Computed{Expr: x}
		}
		return builtins.ComputeFunc(func(runtime.Inputs) (any, error) { return nil, nil })
	}
	return builtins.ComputeFunc(c.field(at, v))
}

func (c compiler) env(at string, env map[string]Value) map[string]builtins.Field {
	if len(env) == 0 {
		return nil
	}
	out := make(map[string]builtins.Field, len(env))
	for k, v := range env {
		out[k] = c.field(field(field(at, "env"), k), v)
	}
	return out
}

func (c compiler) files(at string, files map[string]Value) map[string]builtins.File {
	if len(files) == 0 {
		return nil
	}
	out := make(map[string]builtins.File, len(files))
	for k, v := range files {
		if v.Kind == ValueOutput {
			out[k] = builtins.File{Output: v.Format}
			continue
		}
		out[k] = builtins.File{Input: c.field(field(field(at, "files"), k), v)}
	}
	return out
}

func (c compiler) exec(addr cells.Address, s *ExecSpec) builtins.ExecSpec {
	at := field(c.at, "exec")
	spec := builtins.ExecSpec{
		Node:    addr,
		Image:   c.field(field(at, "image"), s.Image),
		Env:     c.env(at, s.Env),
		Files:   c.files(at, s.Files),
		NoCache: s.NoCache,
		Timeout: s.Timeout,
		Network: s.Network,
	}
	for i, v := range s.Command {
		spec.Command = append(spec.Command, c.field(index(field(at, "command"), i), v))
	}
	return spec
}

func (c compiler) sandbox(addr cells.Address, s *SandboxSpec) builtins.SandboxSpec {
	at := field(c.at, "sandbox")
	spec := builtins.SandboxSpec{
		Node:     addr,
		Image:    c.field(field(at, "image"), s.Image),
		Env:      c.env(at, s.Env),
		Files:    c.files(at, s.Files),
		Ports:    slices.Clone(s.Ports),
		Network:  s.Network,
		Snapshot: c.field(field(at, "snapshot"), s.Snapshot),
	}
	if s.Start != nil {
		sat := field(at, "start")
		spec.Start = &builtins.StartSpec{
			Command: c.field(field(sat, "command"), s.Start.Command),
			Port:    s.Start.Port,
			Ready:   c.field(field(sat, "ready"), s.Start.Ready),
		}
	}
	return spec
}

func (c compiler) fetch(addr cells.Address, s *FetchSpec) builtins.FetchSpec {
	at := field(c.at, "fetch")
	spec := builtins.FetchSpec{
		Node:          addr,
		URL:           c.field(field(at, "url"), s.URL),
		Method:        c.field(field(at, "method"), s.Method),
		Body:          c.field(field(at, "body"), s.Body),
		SecretHeaders: maps.Clone(s.SecretHeaders),
		Format:        s.Format,
		NoCache:       s.NoCache,
		Timeout:       s.Timeout,
		MaxBytes:      s.MaxBytes,
	}
	if len(s.Headers) > 0 {
		spec.Headers = make(map[string]builtins.Field, len(s.Headers))
		for k, v := range s.Headers {
			spec.Headers[k] = c.field(field(field(at, "headers"), k), v)
		}
	}
	return spec
}

func (c compiler) llm(addr cells.Address, s *LLMSpec, boxes map[string]*builtins.Sandbox) builtins.LLMSpec {
	at := field(c.at, "llm")
	spec := builtins.LLMSpec{
		Node:        addr,
		Provider:    s.Provider,
		Model:       c.field(field(at, "model"), s.Model),
		System:      c.field(field(at, "system"), s.System),
		Prompt:      c.field(field(at, "prompt"), s.Prompt),
		Messages:    c.field(field(at, "messages"), s.Messages),
		MaxTokens:   c.number(field(at, "max_tokens"), s.MaxTokens),
		Temperature: c.number(field(at, "temperature"), s.Temperature),
		MaxTurns:    c.number(field(at, "max_turns"), s.MaxTurns),
		Timeout:     c.field(field(at, "timeout"), s.Timeout),
		NoCache:     s.NoCache,
	}
	if s.Tools != nil {
		spec.Tools = &builtins.LLMTools{Sandbox: boxes[s.Tools.Sandbox], Allow: slices.Clone(s.Tools.Allow)}
	}
	return spec
}

// number compiles a numeric field: a literal is parsed here (YAML's
// max_tokens: 1000 arrives as text), an expression is left to give a
// number.
func (c compiler) number(at string, v Value) builtins.Field {
	if v.Kind != ValueLiteral {
		return c.field(at, v)
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(v.Text), 64)
	if err != nil {
		c.e.add(at, "%q is not a number", v.Text)
		return nil
	}
	return builtins.Const(f)
}
