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
// dereference) makes run report false: Eval then runs the VM, which gives
// the value or the error it always gave.
type fast func(env map[string]any) any

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
	c    any    // constant
	name string // read, deref
}

type operandKind int

const (
	computed operandKind = iota
	constant
	read  // env[name]
	deref // plain(env[name])
)

// compileFast returns p as closures, or nil if p uses an opcode they do
// not cover.
func compileFast(p *vm.Program) fast {
	var stack []operand
	push := func(o operand) { stack = append(stack, o) }
	pushConst := func(c any) { push(operand{f: func(map[string]any) any { return c }, kind: constant, c: c}) }
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
			push(operand{f: func(env map[string]any) any { return env[name] }, kind: read, name: name})
		case vm.OpDeref:
			a, ok := pop(1)
			if !ok {
				return nil
			}
			if name := a[0].name; a[0].kind == read {
				push(operand{f: func(env map[string]any) any { return plain(env[name]) }, kind: deref, name: name})
				break
			}
			x := a[0].f
			push(operand{f: func(env map[string]any) any { return plain(x(env)) }})
		case vm.OpNegate:
			a, ok := pop(1)
			if !ok {
				return nil
			}
			x := a[0].f
			push(operand{f: func(env map[string]any) any { return runtime.Negate(x(env)) }})
		case vm.OpNot:
			a, ok := pop(1)
			if !ok {
				return nil
			}
			x := a[0].f
			push(operand{f: func(env map[string]any) any { return !x(env).(bool) }})
		default:
			f, ok := binaryOps[op]
			if !ok {
				return nil
			}
			ab, ok := pop(2)
			if !ok {
				return nil
			}
			push(operand{f: binary(f, ab[0], ab[1])})
		}
	}
	if len(stack) != 1 {
		return nil
	}
	return stack[0].f
}

// binary returns the closure of f(a, b), reading a dereferenced name and
// a constant inline.
func binary(f func(a, b any) any, a, b operand) fast {
	switch {
	case a.kind == deref && b.kind == constant:
		name, c := a.name, b.c
		return func(env map[string]any) any { return f(plain(env[name]), c) }
	case a.kind == deref && b.kind == deref:
		x, y := a.name, b.name
		return func(env map[string]any) any { return f(plain(env[x]), plain(env[y])) }
	}
	x, y := a.f, b.f
	return func(env map[string]any) any { return f(x(env), y(env)) }
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
func (f fast) run(env map[string]any) (out any, ok bool) {
	defer func() {
		if recover() != nil {
			out, ok = nil, false
		}
	}()
	return f(env), true
}
