package patterns

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/builtin"
	"github.com/expr-lang/expr/file"
	"github.com/expr-lang/expr/parser"
)

// parseString reads a string by the one rule of the language: `${expr}`
// alone is an expression (its value keeps its JSON type), `${…}` amid other
// text makes a template (a string), `$${` is a literal `${`, and anything
// else is literal text.
func parseString(s string) (Value, error) {
	var parts []Part
	var text strings.Builder
	for i := 0; i < len(s); {
		switch {
		case strings.HasPrefix(s[i:], "$${"):
			text.WriteString("${")
			i += 3
		case strings.HasPrefix(s[i:], "${"):
			end, err := exprEnd(s, i+2)
			if err != nil {
				return Value{}, err
			}
			src := strings.TrimSpace(s[i+2 : end])
			if src == "" {
				return Value{}, fmt.Errorf("empty ${} at column %d", i+1)
			}
			if text.Len() > 0 {
				parts = append(parts, Part{Text: text.String()})
				text.Reset()
			}
			parts = append(parts, Part{Expr: src})
			i = end + 1
		default:
			text.WriteByte(s[i])
			i++
		}
	}
	switch {
	case len(parts) == 0:
		return Literal(text.String()), nil
	case len(parts) == 1 && text.Len() == 0:
		return Expr(parts[0].Expr), nil
	}
	if text.Len() > 0 {
		parts = append(parts, Part{Text: text.String()})
	}
	return Value{Kind: ValueTemplate, Parts: parts}, nil
}

// exprEnd returns the index of the `}` that closes the `${` whose
// expression starts at start, skipping nested braces and string literals.
func exprEnd(s string, start int) (int, error) {
	depth := 0
	for i := start; i < len(s); i++ {
		switch c := s[i]; c {
		case '"', '\'', '`':
			j := i + 1
			for j < len(s) && s[j] != c {
				if s[j] == '\\' && c != '`' {
					j++
				}
				j++
			}
			if j >= len(s) {
				return 0, fmt.Errorf("unterminated string in ${…} at column %d", i+1)
			}
			i = j
		case '{':
			depth++
		case '}':
			if depth == 0 {
				return i, nil
			}
			depth--
		}
	}
	return 0, fmt.Errorf(`"${" at column %d has no closing "}"`, start-1)
}

// ref is a name an expression reads: a cell or a node, and the constant
// member names that follow it (clean.result.files["/out"] → clean, [result
// files /out]).
type ref struct {
	name string
	path []string
	call bool // name(...) — the expression calls it as a function
}

// analyze parses an expression and returns the names it reads and the
// member paths it reads of them, so that a pattern can check them against
// what each node outputs. (builtins.Parse is the authority on what the
// runtime accepts; the checker calls it too.)
func analyze(src string) ([]ref, error) {
	tree, err := parser.Parse(src)
	if err != nil {
		var fe *file.Error
		if errors.As(err, &fe) {
			return nil, fmt.Errorf("%s at column %d", fe.Message, fe.Column+1)
		}
		return nil, err
	}
	v := &refVisitor{inner: map[ast.Node]bool{}, lets: map[string]bool{}, callees: map[ast.Node]bool{}}
	ast.Walk(&tree.Node, v)
	var refs []ref
	// Members first (outermost chains), then bare identifiers.
	for _, m := range v.members {
		if v.inner[m] {
			continue
		}
		root, path := chain(m)
		id, ok := root.(*ast.IdentifierNode)
		if !ok || v.lets[id.Value] {
			continue
		}
		refs = append(refs, ref{name: id.Value, path: path})
	}
	for _, id := range v.idents {
		if v.inner[id] || v.lets[id.Value] {
			continue
		}
		refs = append(refs, ref{name: id.Value, call: v.callees[id]})
	}
	return refs, nil
}

type refVisitor struct {
	idents  []*ast.IdentifierNode
	members []*ast.MemberNode
	inner   map[ast.Node]bool // nodes inside a member chain (not its root expression)
	callees map[ast.Node]bool
	lets    map[string]bool
}

func (v *refVisitor) Visit(n *ast.Node) {
	switch n := (*n).(type) {
	case *ast.IdentifierNode:
		v.idents = append(v.idents, n)
	case *ast.MemberNode:
		v.members = append(v.members, n)
		// The chain's inner members and its root identifier are covered
		// by this member.
		for x := n.Node; ; {
			v.inner[x] = true
			m, ok := x.(*ast.MemberNode)
			if !ok {
				break
			}
			x = m.Node
		}
	case *ast.CallNode:
		v.callees[n.Callee] = true
	case *ast.VariableDeclaratorNode:
		v.lets[n.Name] = true
	}
}

// chain returns the root of a member chain and the constant names from the
// root outward, up to the first computed member.
func chain(m *ast.MemberNode) (ast.Node, []string) {
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
	var path []string
	for _, p := range props {
		s, ok := p.(*ast.StringNode)
		if !ok {
			break
		}
		path = append(path, s.Value)
	}
	return x, path
}

// isBuiltin reports whether name is an expression built-in function or
// keyword, which a cell or node may not be called.
func isBuiltin(name string) bool {
	switch name {
	case "true", "false", "nil", "not", "and", "or", "in", "matches", "contains",
		"startsWith", "endsWith", "let", "if", "else", "$env":
		return true
	}
	return slices.Contains(builtin.Names, name)
}
