package patterns

import (
	"fmt"
	"slices"
	"strings"

	"github.com/expr-lang/expr/builtin"
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
