package builtins

import "github.com/cellbox/cellbox/runtime"

// Computed is the computed node kind (a runtime.Compute): an expression
// over cells. Its node's inputs are the names the expression reads.
type Computed struct{ Expr *Expr }

// NewComputed compiles src into a computed node kind.
func NewComputed(src string) (*Computed, error) {
	e, err := Parse(src)
	if err != nil {
		return nil, err
	}
	return &Computed{Expr: e}, nil
}

// Inputs returns the names to bind as the node's Inputs (Expr.Refs()).
func (c *Computed) Inputs() []string { return c.Expr.Refs() }

// Compute evaluates the expression over the inputs.
func (c *Computed) Compute(in runtime.Inputs) (any, error) { return c.Expr.Eval(in) }

// BindArgs is Compute over the inputs' values in the order of names
// (runtime.BindArgs).
func (c *Computed) BindArgs(names []string) func(args []any) (any, error) {
	return c.Expr.BindArgs(names)
}
