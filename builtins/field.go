package builtins

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/cellbox/cellbox/runtime"
)

// Field is one field of a node (a command, an env value, a file's content)
// as a function of the node's inputs. The pattern compiler builds them from
// literals, expressions, templates and files of the pattern folder; the
// node kinds evaluate them on every run.
type Field func(in runtime.Inputs) (any, error)

// Const is a Field with a fixed value.
func Const(v any) Field { return func(runtime.Inputs) (any, error) { return v, nil } }

// ExprField is a Field holding the value of e.
func ExprField(e *Expr) Field {
	return func(in runtime.Inputs) (any, error) { return e.Eval(in) }
}

// TemplatePart is a piece of a template: literal Text, or the value of Expr
// formatted by Text.
type TemplatePart struct {
	Text string
	Expr *Expr
}

// TemplateField is a Field joining parts into one string.
func TemplateField(parts []TemplatePart) Field {
	return func(in runtime.Inputs) (any, error) {
		var b strings.Builder
		for _, p := range parts {
			if p.Expr == nil {
				b.WriteString(p.Text)
				continue
			}
			v, err := p.Expr.Eval(in)
			if err != nil {
				return nil, err
			}
			s, err := Text(v)
			if err != nil {
				return nil, fmt.Errorf("template part ${%s}: %w", p.Expr, err)
			}
			b.WriteString(s)
		}
		return b.String(), nil
	}
}

// Text formats a value as text, the way templates insert values and files
// and env values are written: a string as it is, null as nothing, anything
// else (numbers, booleans, lists, objects) as compact JSON.
func Text(v any) (string, error) {
	switch x := v.(type) {
	case nil:
		return "", nil
	case string:
		return x, nil
	case json.RawMessage:
		return string(x), nil
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("format %T as JSON: %w", v, err)
	}
	return string(raw), nil
}

// ComputeFunc is a Compute node kind from a function (e.g. a template).
type ComputeFunc func(in runtime.Inputs) (any, error)

// Compute calls f.
func (f ComputeFunc) Compute(in runtime.Inputs) (any, error) { return f(in) }

// File binds a path in a box: an input (Input set: its value is written to
// the file) or an output (Output "text" or "json": the file is read back).
type File struct {
	Input  Field
	Output string
}

// Output formats of File.
const (
	OutputText = "text"
	OutputJSON = "json"
)

// evalText evaluates f and formats its value with Text; what names the
// field in errors.
func evalText(f Field, in runtime.Inputs, what string) (string, error) {
	v, err := f(in)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	s, err := Text(v)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	return s, nil
}
