package patterns

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
)

// Builder builds a Pattern in Go. Each method records where it was called,
// so Build's errors name the line of the Go program:
//
//	b := patterns.New("csv").Dir("examples/csv")
//	threshold := b.Cell("threshold", 10)
//	b.CellFile("raw", "data.csv")
//	b.Exec("clean", patterns.ExecSpec{
//		Command: patterns.Command("python3 /workspace/clean.py"),
//		Files: map[string]patterns.Value{
//			"/workspace/in.csv":   patterns.Ref("raw"),
//			"/workspace/clean.py": patterns.FromFile("clean.py"),
//			"/workspace/out.csv":  patterns.OutputText,
//		},
//	})
//	b.Computed("ok", "clean.result.exit_code == 0")
//	p, err := b.Build()
type Builder struct {
	p    Pattern
	fsys fs.FS
	errs ErrorList
}

// New starts a pattern called name.
func New(name string) *Builder {
	b := &Builder{p: Pattern{Name: name, Source: map[string]Pos{}}}
	b.p.Source[""] = caller()
	return b
}

// Describe sets the pattern's description.
func (b *Builder) Describe(description string) *Builder {
	b.p.Description = description
	return b
}

// Dir sets the pattern folder that FromFile and CellFile read from.
func (b *Builder) Dir(dir string) *Builder {
	b.p.Dir = dir
	b.fsys = folderFS(dir)
	return b
}

// FS sets the file system FromFile and CellFile read from (an embed.FS, for
// example); name is how errors call it.
func (b *Builder) FS(name string, fsys fs.FS) *Builder {
	b.p.Dir = name
	b.fsys = fsys
	return b
}

// DescribeNode sets the description of the node called name, added before.
func (b *Builder) DescribeNode(name, description string) *Builder {
	if n, ok := b.p.Node(name); ok {
		n.Description = description
	} else {
		b.fail(field("nodes", name), "DescribeNode: no node %q yet", name)
	}
	return b
}

// CellOption sets an optional part of a cell.
type CellOption func(*Cell) error

// WithSchema sets the cell's JSON Schema: a value that encodes to JSON (a
// map, a struct, or json.RawMessage for JSON text).
func WithSchema(schema any) CellOption {
	return func(c *Cell) error {
		b, err := canonical(schema)
		if err != nil {
			return fmt.Errorf("schema: %w", err)
		}
		c.Schema = b
		return nil
	}
}

// WithDescription sets the cell's description.
func WithDescription(description string) CellOption {
	return func(c *Cell) error {
		c.Description = description
		return nil
	}
}

// Cell adds an input cell with an initial value (any value that encodes to
// JSON; nil for none) and returns a reference to it.
func (b *Builder) Cell(name string, value any, opts ...CellOption) Value {
	c := Cell{Name: name}
	v, err := canonical(value)
	if err != nil {
		b.fail(field("cells", name), "initial value: %v", err)
	}
	c.Value = v
	b.addCell(c, opts)
	return Ref(name)
}

// CellFile adds an input cell whose initial value is the text of a file of
// the pattern folder, and returns a reference to it.
func (b *Builder) CellFile(name, path string, opts ...CellOption) Value {
	b.addCell(Cell{Name: name, File: path}, opts)
	return Ref(name)
}

func (b *Builder) addCell(c Cell, opts []CellOption) {
	at := field("cells", c.Name)
	if b.claim(at, c.Name) {
		return
	}
	for _, o := range opts {
		if err := o(&c); err != nil {
			b.fail(at, "%v", err)
		}
	}
	b.p.Cells = append(b.p.Cells, c)
}

// Computed adds a node whose value is the expression src (written without
// ${ }), and returns a reference to it.
func (b *Builder) Computed(name, src string) Value {
	return b.ComputedValue(name, Expr(src))
}

// ComputedValue adds a computed node from an expression or a template (see
// Str), and returns a reference to it.
func (b *Builder) ComputedValue(name string, v Value) Value {
	b.addNode(Node{Name: name, Kind: KindComputed, Computed: v})
	return Ref(name)
}

// Exec adds an exec node and returns a reference to it. The spec is
// copied.
func (b *Builder) Exec(name string, spec ExecSpec) Value {
	spec.Command = slices.Clone(spec.Command)
	spec.Env, spec.Files = maps.Clone(spec.Env), maps.Clone(spec.Files)
	b.addNode(Node{Name: name, Kind: KindExec, Exec: &spec})
	return Ref(name)
}

// Sandbox adds a sandbox node and returns a reference to it. The spec is
// copied.
func (b *Builder) Sandbox(name string, spec SandboxSpec) Value {
	spec.Env, spec.Files, spec.Ports = maps.Clone(spec.Env), maps.Clone(spec.Files), slices.Clone(spec.Ports)
	b.addNode(Node{Name: name, Kind: KindSandbox, Sandbox: &spec})
	return Ref(name)
}

// Fetch adds a fetch node and returns a reference to it. The spec is
// copied.
func (b *Builder) Fetch(name string, spec FetchSpec) Value {
	spec.Headers, spec.SecretHeaders = maps.Clone(spec.Headers), maps.Clone(spec.SecretHeaders)
	b.addNode(Node{Name: name, Kind: KindFetch, Fetch: &spec})
	return Ref(name)
}

// LLM adds an llm node and returns a reference to it. The spec is
// copied.
func (b *Builder) LLM(name string, spec LLMSpec) Value {
	if spec.Tools != nil {
		t := *spec.Tools
		t.Allow = slices.Clone(t.Allow)
		spec.Tools = &t
	}
	b.addNode(Node{Name: name, Kind: KindLLM, LLM: &spec})
	return Ref(name)
}

func (b *Builder) addNode(n Node) {
	if !b.claim(field("nodes", n.Name), n.Name) {
		b.p.Nodes = append(b.p.Nodes, n)
	}
}

// claim records where the cell or node at path was added; it reports (and
// returns true) when the name is already taken in the same section.
func (b *Builder) claim(at, name string) bool {
	pos := caller()
	if prev, dup := b.p.Source[at]; dup {
		b.errs = append(b.errs, &Error{Pos: pos, Path: at, Msg: fmt.Sprintf("%q is defined twice (first at %s)", name, prev)})
		return true
	}
	b.p.Source[at] = pos
	return false
}

func (b *Builder) fail(at, format string, args ...any) {
	b.errs = append(b.errs, &Error{Pos: caller(), Path: at, Msg: fmt.Sprintf(format, args...)})
}

// Build validates the pattern as Load does and returns it. The Builder
// must not be used afterwards.
func (b *Builder) Build() (*Pattern, error) {
	e := &errs{list: b.errs, where: b.p.Where}
	check(&b.p, b.fsys, e)
	if err := e.err(); err != nil {
		return nil, err
	}
	p := b.p
	return &p, nil
}

// caller returns where the Builder's user called it: the first frame
// outside this file.
func caller() Pos {
	_, self, _, _ := runtime.Caller(0)
	for skip := 1; ; skip++ {
		_, file, line, ok := runtime.Caller(skip)
		if !ok {
			return Pos{}
		}
		if file != self {
			if wd, err := os.Getwd(); err == nil {
				if rel, err := filepath.Rel(wd, file); err == nil && !filepath.IsAbs(rel) && rel[0] != '.' {
					file = rel
				}
			}
			return Pos{File: file, Line: line}
		}
	}
}

// canonical encodes a Go value as compact canonical JSON, the form YAML
// values take; nil and null give nil.
func canonical(v any) (json.RawMessage, error) {
	b, err := marshal(v)
	if err != nil {
		return nil, err
	}
	var generic any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&generic); err != nil {
		return nil, err
	}
	if generic == nil {
		return nil, nil
	}
	return marshal(generic)
}
