// Package builtins holds the node kinds patterns use: computed, exec,
// sandbox.
package builtins

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/builtin"
	"github.com/expr-lang/expr/file"
	"github.com/expr-lang/expr/parser"
	"github.com/expr-lang/expr/vm"
)

// Expr is a compiled, deterministic expr-lang expression over cells
// (https://expr-lang.org/docs/language-definition). The values it reads are
// decoded JSON: nil, bool, float64, string, []any, map[string]any.
//
// Deterministic means the same inputs give the same output: now() is
// refused, date() reads dates in UTC, and keys(), values() and toPairs()
// return map entries in key order instead of Go's random map order.
type Expr struct {
	src     string
	refs    []string
	program *vm.Program
	steps   bool // it has predicates, which count their steps (countSteps)
}

// nondeterministic builtins, refused at compile time with the reason.
var refused = map[string]string{
	"now": "now(), which reads the clock,",
}

// Parse compiles src. It refuses functions that read the clock, $env, and
// calls of unknown functions, with an error saying why.
func Parse(src string) (*Expr, error) {
	if strings.TrimSpace(src) == "" {
		return nil, fmt.Errorf("expression is empty")
	}
	a, err := analyze(src)
	if err != nil {
		return nil, fmt.Errorf("expression %q: %w", src, err)
	}
	if a.err != nil {
		return nil, fmt.Errorf("expression %q: %w", src, a.err)
	}
	counter := &countSteps{}
	program, err := expr.Compile(src, append(exprOptions, expr.Patch(counter))...)
	if err != nil {
		return nil, fmt.Errorf("expression %q: %w", src, err)
	}
	refs := []string{}
	for _, r := range a.reads {
		if !r.Call {
			refs = append(refs, r.Name)
		}
	}
	slices.Sort(refs)
	return &Expr{src: src, refs: slices.Compact(refs), program: program, steps: counter.found}, nil
}

// A Read is something an expression reads by name: a cell or a node with
// the constant member path it reads of it (clean.result.files["/out"] →
// clean, [result files /out]; the path stops at the first computed
// member), or a function it calls by name (Call).
type Read struct {
	Name string
	Path []string
	Call bool
}

// Analyze parses src and returns what it reads, without compiling or
// judging it (Parse does both): patterns check the names and paths against
// what each node outputs. Names bound by let are not reads, within the let
// only. It fails only on a syntax error, saying where.
func Analyze(src string) ([]Read, error) {
	a, err := analyze(src)
	if err != nil {
		return nil, err
	}
	return a.reads, nil
}

// analyze parses src and walks it: the one analysis of an expression, for
// Parse and Analyze alike.
func analyze(src string) (*analysis, error) {
	tree, err := parser.Parse(src)
	if err != nil {
		var fe *file.Error
		if errors.As(err, &fe) {
			return nil, fmt.Errorf("%s at column %d", fe.Message, fe.Column+1)
		}
		return nil, err
	}
	a := &analysis{src: src}
	a.walk(tree.Node, nil)
	return a, nil
}

// MustParse is Parse for expressions known to be valid (tests, Go patterns
// with constant sources); it panics on an error.
func MustParse(src string) *Expr {
	e, err := Parse(src)
	if err != nil {
		panic(err)
	}
	return e
}

// Refs returns the cell or node names the expression reads: the root of
// every identifier or member chain (clean.result.files["/a"] -> "clean"),
// sorted, without duplicates. Names bound by let are not refs.
func (e *Expr) Refs() []string { return slices.Clone(e.refs) }

// String returns the source.
func (e *Expr) String() string { return e.src }

var vms = sync.Pool{New: func() any { return &vm.VM{} }}

// Eval evaluates the expression with env holding the referenced values (a
// missing one reads as nil). Safe for concurrent use.
func (e *Expr) Eval(env map[string]any) (any, error) {
	if e.steps { // a counter of its own, in a copy: callers may share env
		with := make(map[string]any, len(env)+1)
		maps.Copy(with, env)
		env = with
	}
	return e.run(env)
}

// BindArgs returns the expression as a function of its values in the
// order of names (a name the expression reads but names lacks reads as
// nil): Eval without a map to fill per call, for the runtime's computes
// (runtime.BindArgs). Safe for concurrent use.
func (e *Expr) BindArgs(names []string) func(args []any) (any, error) {
	slot := make(map[string]int, len(names))
	for i, n := range names {
		if _, ok := slot[n]; !ok {
			slot[n] = i
		}
	}
	var f fast
	if !e.steps {
		f = compileFast(e.program, slot)
	}
	return func(args []any) (any, error) {
		if f != nil {
			if out, ok := f.run(args); ok {
				return out, nil
			}
		}
		env := make(map[string]any, len(slot)+1)
		for n, i := range slot {
			env[n] = args[i]
		}
		return e.run(env)
	}
}

// run evaluates the expression on expr's VM. env is the evaluation's own:
// run adds the step counter to it.
func (e *Expr) run(env map[string]any) (any, error) {
	if env == nil {
		env = map[string]any{}
	}
	if e.steps {
		env[stepsName] = new(int)
	}
	m := vms.Get().(*vm.VM)
	defer vms.Put(m)
	out, err := m.Run(e.program, env)
	if err != nil {
		return nil, fmt.Errorf("expression %q: %w", e.src, err)
	}
	return out, nil
}

// MaxSteps bounds the predicate steps (one run of the body of all, any,
// map, filter, ... for one element) of one evaluation: predicates nested
// over big lists take n^depth steps, and a compute holds up the runtime
// while it runs. Ten million take about a second here.
const MaxSteps = 10_000_000

// stepsName and stepName are the counter and the function countSteps adds:
// names a source cannot write ("$" starts no identifier), so they are
// neither reads nor calls of the expression.
const (
	stepsName = "$steps"
	stepName  = "$step"
)

// countSteps (an ast.Visitor for expr.Patch) makes each predicate count a
// step before its body: {body} becomes {$step($steps) ?? body}, where
// $step returns nil, or an error past MaxSteps. Hand-written because expr
// has a memory budget but no bound on time.
type countSteps struct{ found bool }

func (c *countSteps) Visit(node *ast.Node) {
	p, ok := (*node).(*ast.PredicateNode)
	if !ok {
		return
	}
	c.found = true
	step := &ast.CallNode{Callee: &ast.IdentifierNode{Value: stepName}, Arguments: []ast.Node{&ast.IdentifierNode{Value: stepsName}}}
	p.Node = &ast.BinaryNode{Operator: "??", Left: step, Right: p.Node}
}

// step is $step: it counts a step of the evaluation whose counter n is.
func step(args ...any) (any, error) {
	n, ok := args[0].(*int)
	if !ok {
		return nil, nil
	}
	if *n++; *n > MaxSteps {
		return nil, fmt.Errorf("more than %d steps of all/any/map/filter/...: predicates nested over big lists; filter the list first, or split the work into computed cells", MaxSteps)
	}
	return nil, nil
}

var exprOptions = []expr.Option{
	expr.Function(stepName, step),
	// Env of map[string]any makes every name a direct map read (expr's
	// OpLoadFast) instead of a reflect lookup that allocates per read;
	// names are checked by Parse's own analysis, so undefined ones are
	// allowed here and read as nil, as before.
	expr.Env(map[string]any{}),
	expr.AllowUndefinedVariables(),
	// date() reads dates in UTC, not in the machine's zone. (expr.Timezone
	// would do it too, but breaks method calls on the result in v1.17.)
	expr.Function("date", func(args ...any) (any, error) {
		return builtinDate(append([]any{time.UTC}, args...)...)
	}),
	expr.Function("keys", func(args ...any) (any, error) {
		return sortedMap(args, "keys", func(k string, _ any) any { return k })
	}),
	expr.Function("values", func(args ...any) (any, error) {
		return sortedMap(args, "values", func(_ string, v any) any { return v })
	}),
	expr.Function("toPairs", func(args ...any) (any, error) {
		return sortedMap(args, "toPairs", func(k string, v any) any { return []any{k, v} })
	}),
}

// sortedMap maps the entries of a map argument, in key order.
func sortedMap(args []any, fn string, f func(k string, v any) any) (any, error) {
	if len(args) != 1 {
		return nil, fmt.Errorf("%s() takes 1 argument, got %d", fn, len(args))
	}
	v := reflect.ValueOf(args[0])
	if v.Kind() != reflect.Map {
		return nil, fmt.Errorf("%s() of %s: want a map", fn, v.Kind())
	}
	type entry struct {
		k string
		v any
	}
	entries := make([]entry, 0, v.Len())
	for it := v.MapRange(); it.Next(); {
		entries = append(entries, entry{fmt.Sprint(it.Key().Interface()), it.Value().Interface()})
	}
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.k, b.k) })
	out := make([]any, len(entries))
	for i, e := range entries {
		out[i] = f(e.k, e.v)
	}
	return out, nil
}

// overridden are the builtins replaced by exprOptions: they parse as calls.
var overridden = map[string]bool{"date": true, "keys": true, "values": true, "toPairs": true}

// builtinDate is expr's own date(), which takes a leading *time.Location.
var builtinDate = builtin.Builtins[builtin.Index["date"]].Func

// analysis walks a parse tree for what it reads and what Parse refuses
// (the first refusal is err; the walk goes on, so reads are complete).
type analysis struct {
	src   string
	reads []Read
	err   error
}

// read records a read of name, once per name and path.
func (a *analysis) read(r Read) {
	if !slices.ContainsFunc(a.reads, func(x Read) bool {
		return x.Name == r.Name && x.Call == r.Call && slices.Equal(x.Path, r.Path)
	}) {
		a.reads = append(a.reads, r)
	}
}

func (a *analysis) fail(n ast.Node, format string, args ...any) {
	if a.err == nil {
		before := a.src[:min(max(n.Location().From, 0), len(a.src))]
		line := strings.Count(before, "\n") + 1
		col := len([]rune(before[strings.LastIndexByte(before, '\n')+1:])) + 1
		a.err = fmt.Errorf("%s (line %d, column %d)", fmt.Sprintf(format, args...), line, col)
	}
}

// walk visits n; scope holds the let-bound names in effect.
func (a *analysis) walk(n ast.Node, scope []string) {
	if n == nil {
		return
	}
	switch n := n.(type) {
	case *ast.IdentifierNode:
		switch {
		case n.Value == "$env":
			a.fail(n, "$env is not allowed: name the cells you read")
		case !slices.Contains(scope, n.Value):
			a.read(Read{Name: n.Value})
		}
	case *ast.MemberNode:
		root, path, computed := chain(n)
		if id, ok := root.(*ast.IdentifierNode); ok && id.Value != "$env" && !slices.Contains(scope, id.Value) {
			a.read(Read{Name: id.Value, Path: path})
		} else {
			a.walk(root, scope)
		}
		for _, p := range computed {
			a.walk(p, scope)
		}
	case *ast.ChainNode:
		a.walk(n.Node, scope)
	case *ast.UnaryNode:
		a.walk(n.Node, scope)
	case *ast.BinaryNode:
		a.walk(n.Left, scope)
		a.walk(n.Right, scope)
	case *ast.SliceNode:
		a.walk(n.Node, scope)
		a.walk(n.From, scope)
		a.walk(n.To, scope)
	case *ast.BuiltinNode:
		if why, ok := refused[n.Name]; ok {
			a.fail(n, "%s is not allowed: expressions must be deterministic (no clock, no randomness); pass such a value in through a cell", why)
		}
		for _, arg := range n.Arguments {
			a.walk(arg, scope)
		}
	case *ast.CallNode:
		switch c := n.Callee.(type) {
		case *ast.IdentifierNode:
			if !overridden[c.Value] {
				a.read(Read{Name: c.Value, Call: true})
				a.fail(n, "%s is not a function: expressions can call only the expr-lang builtins", c.Value)
			}
		default: // a method, as in date(s).Hour()
			a.walk(c, scope)
		}
		for _, arg := range n.Arguments {
			a.walk(arg, scope)
		}
	case *ast.PredicateNode:
		a.walk(n.Node, scope)
	case *ast.VariableDeclaratorNode:
		a.walk(n.Value, scope)
		a.walk(n.Expr, append(slices.Clip(scope), n.Name))
	case *ast.SequenceNode:
		for _, x := range n.Nodes {
			a.walk(x, scope)
		}
	case *ast.ConditionalNode:
		a.walk(n.Cond, scope)
		a.walk(n.Exp1, scope)
		a.walk(n.Exp2, scope)
	case *ast.ArrayNode:
		for _, x := range n.Nodes {
			a.walk(x, scope)
		}
	case *ast.MapNode:
		for _, x := range n.Pairs {
			a.walk(x, scope)
		}
	case *ast.PairNode:
		a.walk(n.Key, scope)
		a.walk(n.Value, scope)
	}
}

// chain returns the root of a member chain, the constant names from the
// root outward up to the first computed member, and the property nodes
// from there on (which may read names themselves: a.b[k].c reads k).
func chain(m *ast.MemberNode) (root ast.Node, path []string, computed []ast.Node) {
	var props []ast.Node
	var x ast.Node = m
	for {
		mm, ok := x.(*ast.MemberNode)
		if !ok {
			break
		}
		props = append(props, mm.Property)
		x = mm.Node
	}
	slices.Reverse(props)
	for i, p := range props {
		s, ok := p.(*ast.StringNode)
		if !ok {
			return x, path, props[i:]
		}
		path = append(path, s.Value)
	}
	return x, path, nil
}
