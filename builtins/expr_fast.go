package builtins

import (
	"slices"

	"github.com/expr-lang/expr/vm"
	"github.com/expr-lang/expr/vm/runtime"
)

// fast is an expression run as a tree of Go closures instead of on expr's
// VM: the straight-line programs most computed cells compile to (names,
// constants, member reads, arithmetic and comparisons; no jumps, calls or
// predicates). Each closure makes the call the VM makes for its opcode
// (runtime.Add for OpAdd, ...), so the value is the VM's. Hand-written
// because on such a program the VM's dispatch loop, stack, pool and
// reflect-based dereference cost more than the arithmetic, and a
// propagation runs thousands of them in a row.
//
// Whatever the VM would report as an error (a panic of one of those
// calls) or treat in a way the closures do not (a value OpDeref would
// dereference) makes run report false: the bound evaluator (BindArgs) then
// runs the VM, which gives the value or the error it always gave.
//
// Names are read from the bound evaluator's arguments, each from its slot,
// fixed at bind time.
type fast func(args []any) any

// notPlain is the panic of a value fast does not handle as the VM does.
type notPlain struct{}

var binaryOps = map[vm.Opcode]func(a, b any) any{
	vm.OpAdd:         runtime.Add,
	vm.OpSubtract:    runtime.Subtract,
	vm.OpMultiply:    runtime.Multiply,
	vm.OpDivide:      func(a, b any) any { return runtime.Divide(a, b) },
	vm.OpModulo:      func(a, b any) any { return runtime.Modulo(a, b) },
	vm.OpExponent:    func(a, b any) any { return runtime.Exponent(a, b) },
	vm.OpEqual:       func(a, b any) any { return runtime.Equal(a, b) },
	vm.OpLess:        func(a, b any) any { return runtime.Less(a, b) },
	vm.OpMore:        func(a, b any) any { return runtime.More(a, b) },
	vm.OpLessOrEqual: func(a, b any) any { return runtime.LessOrEqual(a, b) },
	vm.OpMoreOrEqual: func(a, b any) any { return runtime.MoreOrEqual(a, b) },
	vm.OpIn:          func(a, b any) any { return runtime.In(a, b) },
	vm.OpFetch:       runtime.Fetch,
}

// operand is a value on compileFast's stack: its closure, and what it is
// when that is simpler (a constant; a name read, dereferenced or not), so
// the opcode that takes it can read it inline instead of calling a closure
// (a + 1 is one closure, not four).
type operand struct {
	f    fast
	kind operandKind
	c    any             // constant
	get  func([]any) any // read, deref: the name's reader
	idx  int             // read, deref: the name's slot, or -1 (none)
}

type operandKind int

const (
	computed operandKind = iota
	constant
	read  // get(env)
	deref // plain(get(env))
)

// compileFast returns p as closures reading each name from its slot (a
// name with none reads as nil, as a missing one does from a map), or nil
// if p uses an opcode they do not cover.
func compileFast(p *vm.Program, slot map[string]int) fast {
	var stack []operand
	push := func(o operand) { stack = append(stack, o) }
	pushConst := func(c any) { push(operand{f: func([]any) any { return c }, kind: constant, c: c}) }
	for i, op := range p.Bytecode {
		arg := p.Arguments[i]
		// pop returns the operands an opcode takes, in push order.
		pop := func(n int) ([]operand, bool) {
			if len(stack) < n {
				return nil, false
			}
			args := slices.Clone(stack[len(stack)-n:])
			stack = stack[:len(stack)-n]
			return args, true
		}
		switch op {
		case vm.OpPush:
			pushConst(p.Constants[arg])
		case vm.OpInt:
			pushConst(arg)
		case vm.OpTrue:
			pushConst(true)
		case vm.OpFalse:
			pushConst(false)
		case vm.OpNil:
			pushConst(nil)
		case vm.OpLoadFast:
			name, ok := p.Constants[arg].(string)
			if !ok {
				return nil
			}
			get := fromSlot(slot, name)
			idx, ok := slot[name]
			if !ok {
				idx = -1
			}
			push(operand{f: get, kind: read, get: get, idx: idx})
		case vm.OpDeref:
			a, ok := pop(1)
			if !ok {
				return nil
			}
			if get := a[0].get; a[0].kind == read {
				push(operand{f: func(env []any) any { return plain(get(env)) }, kind: deref, get: get, idx: a[0].idx})
				break
			}
			x := a[0].f
			push(operand{f: func(env []any) any { return plain(x(env)) }})
		case vm.OpNegate:
			a, ok := pop(1)
			if !ok {
				return nil
			}
			x := a[0].f
			push(operand{f: func(env []any) any { return runtime.Negate(x(env)) }})
		case vm.OpNot:
			a, ok := pop(1)
			if !ok {
				return nil
			}
			x := a[0].f
			push(operand{f: func(env []any) any { return !x(env).(bool) }})
		default:
			f, ok := binaryOps[op]
			if !ok {
				return nil
			}
			ab, ok := pop(2)
			if !ok {
				return nil
			}
			push(operand{f: binary(op, f, ab[0], ab[1])})
		}
	}
	if len(stack) != 1 {
		return nil
	}
	return stack[0].f
}

// binary returns the closure of f(a, b) (f is op's), reading a
// dereferenced name and a constant inline. name + int and name - int read
// the name's slot directly and add ints without f when the name holds an
// int, as f would (expr's runtime.Add and Subtract give int for two ints,
// wrapping as Go does).
func binary(op vm.Opcode, f func(a, b any) any, a, b operand) fast {
	c, cInt := b.c.(int)
	switch {
	case a.kind == deref && a.idx >= 0 && b.kind == constant && cInt && op == vm.OpAdd:
		i := a.idx
		return func(env []any) any {
			if x, ok := env[i].(int); ok {
				return x + c
			}
			return f(plain(env[i]), c)
		}
	case a.kind == deref && a.idx >= 0 && b.kind == constant && cInt && op == vm.OpSubtract:
		i := a.idx
		return func(env []any) any {
			if x, ok := env[i].(int); ok {
				return x - c
			}
			return f(plain(env[i]), c)
		}
	case a.kind == deref && a.idx >= 0 && b.kind == deref && b.idx >= 0 && op == vm.OpAdd:
		i, j := a.idx, b.idx
		return func(env []any) any {
			if x, ok := env[i].(int); ok {
				if y, ok := env[j].(int); ok {
					return x + y
				}
			}
			return f(plain(env[i]), plain(env[j]))
		}
	case a.kind == deref && b.kind == constant:
		get, c := a.get, b.c
		return func(env []any) any { return f(plain(get(env)), c) }
	case a.kind == deref && b.kind == deref:
		x, y := a.get, b.get
		return func(env []any) any { return f(plain(x(env)), plain(y(env))) }
	}
	x, y := a.f, b.f
	return func(env []any) any { return f(x(env), y(env)) }
}

// plain is OpDeref of a decoded JSON value, which has nothing to
// dereference; anything else is left to the VM.
func plain(v any) any {
	switch v.(type) {
	case nil, bool, int, float64, string, []any, map[string]any:
		return v
	}
	panic(notPlain{})
}

// run evaluates the closures; false means "run the VM instead".
func (f fast) run(env []any) (out any, ok bool) {
	defer func() {
		if recover() != nil {
			out, ok = nil, false
		}
	}()
	return f(env), true
}

// fromSlot reads a name from its slot of a bound evaluator's arguments
// (a name with none reads as nil, as a missing one does from a map).
func fromSlot(slot map[string]int, name string) func([]any) any {
	i, ok := slot[name]
	if !ok {
		return func([]any) any { return nil }
	}
	return func(args []any) any { return args[i] }
}
