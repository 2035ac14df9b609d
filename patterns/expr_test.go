package patterns

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseString(t *testing.T) {
	tmpl := func(parts ...Part) Value { return Value{Kind: ValueTemplate, Parts: parts} }
	tests := []struct {
		in   string
		want Value
		err  string
	}{
		{in: "", want: Literal("")},
		{in: "plain text", want: Literal("plain text")},
		{in: "$HOME and {braces}", want: Literal("$HOME and {braces}")},
		{in: "${x}", want: Expr("x")},
		{in: "${ x.y[\"a}b\"] }", want: Expr(`x.y["a}b"]`)},
		{in: "${ {'a': 1}.a }", want: Expr("{'a': 1}.a")},
		{in: "${`}` + x}", want: Expr("`}` + x")},
		{in: `${"\"}" + x}`, want: Expr(`"\"}" + x`)},
		{in: "$${x}", want: Literal("${x}")},
		{in: "a ${x} b ${y}", want: tmpl(Part{Text: "a "}, Part{Expr: "x"}, Part{Text: " b "}, Part{Expr: "y"})},
		{in: "${x}${y}", want: tmpl(Part{Expr: "x"}, Part{Expr: "y"})},
		{in: " ${x}", want: tmpl(Part{Text: " "}, Part{Expr: "x"})},
		{in: "$${a} ${b}", want: tmpl(Part{Text: "${a} "}, Part{Expr: "b"})},
		{in: "${x", err: `"${" at column 1 has no closing "}"`},
		{in: "ab ${ {x}", err: `"${" at column 4 has no closing "}"`},
		{in: `${"x}`, err: `unterminated string in ${…} at column 3`},
		{in: "${ }", err: "empty ${} at column 1"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseString(tt.in)
			if tt.err != "" {
				require.EqualError(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, got, Str(got.String()), "String writes what Str reads back")
		})
	}
}
