package builtins

import (
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

// compileFast returns p as closures, or nil if p uses an opcode they do
// not cover.
func compileFast(p *vm.Program) fast {
	var stack []fast
	push := func(f fast) { stack = append(stack, f) }
	constant := func(c any) { push(func(map[string]any) any { return c }) }
	for i, op := range p.Bytecode {
		arg := p.Arguments[i]
		// The operands an opcode pops, in push order.
		pop := func(n int) []fast {
			if len(stack) < n {
				return nil
			}
			args := stack[len(stack)-n:]
			stack = stack[:len(stack)-n]
			return args
		}
		switch op {
		case vm.OpPush:
			constant(p.Constants[arg])
		case vm.OpInt:
			constant(arg)
		case vm.OpTrue:
			constant(true)
		case vm.OpFalse:
			constant(false)
		case vm.OpNil:
			constant(nil)
		case vm.OpLoadFast:
			name, ok := p.Constants[arg].(string)
			if !ok {
				return nil
			}
			push(func(env map[string]any) any { return env[name] })
		case vm.OpDeref:
			a := pop(1)
			if a == nil {
				return nil
			}
			x := a[0]
			push(func(env map[string]any) any { return plain(x(env)) })
		case vm.OpNegate:
			a := pop(1)
			if a == nil {
				return nil
			}
			x := a[0]
			push(func(env map[string]any) any { return runtime.Negate(x(env)) })
		case vm.OpNot:
			a := pop(1)
			if a == nil {
				return nil
			}
			x := a[0]
			push(func(env map[string]any) any { return !x(env).(bool) })
		default:
			f, ok := binaryOps[op]
			if !ok {
				return nil
			}
			ab := pop(2)
			if ab == nil {
				return nil
			}
			x, y := ab[0], ab[1]
			push(func(env map[string]any) any { return f(x(env), y(env)) })
		}
	}
	if len(stack) != 1 {
		return nil
	}
	return stack[0]
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
