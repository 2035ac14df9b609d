package builtins

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestExprRefs(t *testing.T) {
	for _, tc := range []struct {
		src  string
		refs []string
	}{
		{`clean.result.files["/work/out.csv"]`, []string{"clean"}},
		{`a + b * a`, []string{"a", "b"}},
		{`let x = a; x + b`, []string{"a", "b"}},
		{`let a = 1; a`, []string{}},
		{`filter(rows, #.score > threshold)`, []string{"rows", "threshold"}},
		{`map(rows, .name)`, []string{"rows"}},
		{`cfg?.port ?? 8080`, []string{"cfg"}},
		{`{"n": len(items), "first": items[0:1]}`, []string{"items"}},
		{`keys(env)`, []string{"env"}},
		{`x > 1 ? "big" : "small"`, []string{"x"}},
		{`"literal"`, []string{}},
	} {
		e, err := Parse(tc.src)
		require.NoError(t, err, tc.src)
		assert.Equal(t, tc.refs, e.Refs(), tc.src)
		assert.Equal(t, tc.src, e.String())
	}
}

func TestExprRefused(t *testing.T) {
	for _, tc := range []struct{ src, err string }{
		{`now()`, "now(), which reads the clock, is not allowed"},
		{`a + now().Unix()`, "expressions must be deterministic (no clock, no randomness)"},
		{`$env.a`, "$env is not allowed"},
		{`rand(3)`, "rand is not a function"},
		{"a +\n  foo(b)", "(line 2, column 3)"},
		{`a +`, "unexpected token EOF"},
		{`   `, "expression is empty"},
	} {
		_, err := Parse(tc.src)
		assert.ErrorContains(t, err, tc.err, tc.src)
	}
}

func TestExprEval(t *testing.T) {
	for _, tc := range []struct {
		src  string
		env  map[string]any
		want any
	}{
		{`clean.result.files["/work/out.csv"]`, map[string]any{"clean": map[string]any{"result": map[string]any{"files": map[string]any{"/work/out.csv": "a,b"}}}}, "a,b"},
		{`n % 2 == 0 ? "even" : "odd"`, map[string]any{"n": 4}, "even"},
		{`filter(rows, # > threshold)`, map[string]any{"rows": []any{1, 5, 9}, "threshold": 4}, []any{5, 9}},
		{`keys(m)`, map[string]any{"m": map[string]any{"c": 1, "a": 2, "b": 3}}, []any{"a", "b", "c"}},
		{`values(m)`, map[string]any{"m": map[string]any{"c": 1, "a": 2, "b": 3}}, []any{2, 3, 1}},
		{`toPairs(m)`, map[string]any{"m": map[string]any{"b": 1, "a": 2}}, []any{[]any{"a", 2}, []any{"b", 1}}},
		{`date("2024-03-01").Hour()`, nil, 0},
		{`missing ?? "default"`, nil, "default"},
		{`map(filter(rows, # > 1), # * 2)`, map[string]any{"rows": []any{1, 2, 3}}, []any{4, 6}},
		{`all(rows, # > 0) && any(rows, # == 3) && count(rows, # >= 2) == 2 && none(rows, # > 9)`, map[string]any{"rows": []any{1, 2, 3}}, true},
		{`sortBy(rows, -#)`, map[string]any{"rows": []any{1, 3, 2}}, []any{3, 2, 1}},
		{`reduce(rows, #acc + #, 0)`, map[string]any{"rows": []any{1, 2, 3}}, 6},
		{`map(rows, map(rows, # * #))[1]`, map[string]any{"rows": []any{1, 2}}, []any{1, 4}},
	} {
		e, err := Parse(tc.src)
		require.NoError(t, err, tc.src)
		for range 3 { // keys() must not depend on map order
			got, err := e.Eval(tc.env)
			require.NoError(t, err, tc.src)
			assert.Equal(t, tc.want, got, tc.src)
		}
	}
	e, err := Parse(`a.b`)
	require.NoError(t, err)
	_, err = e.Eval(map[string]any{"a": nil})
	assert.ErrorContains(t, err, `expression "a.b": cannot fetch b from <nil>`)
}

// Predicates nested over a list take n^depth steps: past MaxSteps the
// evaluation fails (saying what to do) instead of holding up the runtime
// for minutes; the env it was given is left as it was.
func TestExprStepBudget(t *testing.T) {
	l := make([]any, 200)
	for i := range l {
		l[i] = i + 1
	}
	e, err := Parse(`all(l, {all(l, {all(l, {all(l, {# > 0})})})})`)
	require.NoError(t, err)
	env := map[string]any{"l": l}
	_, err = e.Eval(env)
	assert.ErrorContains(t, err, "more than 10000000 steps of all/any/map/filter")
	assert.Equal(t, map[string]any{"l": l}, env)

	got, err := MustParse(`all(l, {all(l, {# > 0})})`).Eval(env) // 40,000 steps
	require.NoError(t, err)
	assert.Equal(t, true, got)
}

func TestComputed(t *testing.T) {
	c, err := NewComputed(`rows[0] * factor`)
	require.NoError(t, err)
	assert.Equal(t, []string{"factor", "rows"}, c.Inputs())
	out, err := c.Compute(map[string]any{"rows": []any{3}, "factor": 2.5})
	require.NoError(t, err)
	assert.Equal(t, 7.5, out)
	_, err = NewComputed(`now()`)
	assert.ErrorContains(t, err, "now(), which reads the clock, is not allowed")
}

func BenchmarkExprEval(b *testing.B) {
	e, err := Parse(`a + 1`)
	require.NoError(b, err)
	env := map[string]any{"a": 1}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.Eval(env); err != nil {
			b.Fatal(err)
		}
	}
}

// TestAnalyze: what an expression reads, with the constant member paths
// patterns check against node outputs. The one analysis of Parse: a let
// binds its name within the let only.
func TestAnalyze(t *testing.T) {
	tests := []struct {
		src  string
		want []Read
	}{
		{"x", []Read{{Name: "x"}}},
		{"x + y * 2", []Read{{Name: "x"}, {Name: "y"}}},
		{`clean.result.files["/w/out.csv"]`, []Read{{Name: "clean", Path: []string{"result", "files", "/w/out.csv"}}}},
		{`a.b[k].c`, []Read{{Name: "a", Path: []string{"b"}}, {Name: "k"}}},
		{`a?.b`, []Read{{Name: "a", Path: []string{"b"}}}},
		{`repl.history[0].stdout`, []Read{{Name: "repl", Path: []string{"history"}}}},
		{`len(xs) > 0 ? upper(s) : ""`, []Read{{Name: "xs"}, {Name: "s"}}},
		{`filter(xs, .price > min)`, []Read{{Name: "xs"}, {Name: "min"}}},
		{`map(xs, # * n)`, []Read{{Name: "xs"}, {Name: "n"}}},
		{`let y = x; y + 1`, []Read{{Name: "x"}}},
		{`(let y = 1; y) + y`, []Read{{Name: "y"}}},
		{`let y = x; y.a + z.b`, []Read{{Name: "x"}, {Name: "z", Path: []string{"b"}}}},
		{`foo(1, a)`, []Read{{Name: "foo", Call: true}, {Name: "a"}}},
		{`keys(m)`, []Read{{Name: "m"}}},
		{`"literal" + 'x'`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.src, func(t *testing.T) {
			got, err := Analyze(tt.src)
			require.NoError(t, err)
			assert.ElementsMatch(t, tt.want, got)
		})
	}
	for _, bad := range []string{"a +", "(", "a.b.", "1 ? 2"} {
		_, err := Analyze(bad)
		assert.Error(t, err, bad)
	}
}

// The closures of a straight-line expression give what the VM gives: the
// same value (type included) or the same error, on values of every JSON
// type and on the mixes the VM refuses.
func TestExprFastMatchesVM(t *testing.T) {
	type obj = map[string]any
	envs := []map[string]any{
		{"a": 7, "b": 2, "s": "x", "f": 2.5, "t": true, "l": []any{1, "x"}, "m": obj{"k": 3, "n": obj{"k": "deep"}}},
		{"a": -3, "b": 0, "s": "", "f": -0.5, "t": false, "l": []any{}, "m": obj{}},
		{"a": "str", "b": nil, "s": 4, "f": obj{}, "t": 1, "l": nil, "m": []any{1}},
		{"a": math.MaxInt, "b": -1, "s": []any{"x"}, "f": 1e300, "t": nil, "l": "l", "m": nil},
		{"a": int64(3), "b": new(int), "s": uint8(2), "f": float32(1.5)}, // not JSON: the VM's business
		{},
		nil,
	}
	srcs := []string{
		"a + 1", "a + b", "a - b", "a * b", "a / b", "a % b", "a ** b", "-a", "!t", "not t",
		"(a + b) / 2", "a + f", "f * 2.5", "s + s", "s + a", "a + s", "a == b", "a != b", "a < b", "a >= f",
		"s <= s", "m.k + 1", "m.n.k", "m.missing", `m["k"]`, "l[0]", "l[5]", "a in l", `"x" in l`, "1 + 2",
		"t == true", "nil", "a", "missing + 1", "-f", "a / 0", "a % 0", "2 ** 0.5", "b", "b == 0", "f",
		"a - 1", "f - 1", "s - 1", "t + 1", "b + a", "a + b + 1", "missing - 2", "missing + a", "a + 2.5", "a - -1",
	}
	for _, src := range srcs {
		e, err := Parse(src)
		require.NoError(t, err, src)
		// The bound form (runtime.BindArgs) reads the same names from
		// slots, in an order of the runtime's; "zz" is bound but not read,
		// and a name left unbound reads as nil.
		names := []string{"zz", "t", "s", "m", "l", "f", "b", "a"}
		slot := map[string]int{}
		for k, n := range names {
			slot[n] = k
		}
		require.NotNil(t, compileFast(e.program, slot), "%s: expected a straight-line program", src)
		bound := e.BindArgs(names)
		for i, env := range envs {
			vmOut, vmErr := e.Eval(env)
			args := make([]any, len(names))
			for k, n := range names {
				args[k] = env[n]
			}
			boundOut, boundErr := bound(args)
			if vmErr != nil {
				require.Error(t, boundErr, "%s, env %d", src, i)
				assert.Equal(t, vmErr.Error(), boundErr.Error(), "%s, env %d", src, i)
				continue
			}
			require.NoError(t, boundErr, "%s, env %d", src, i)
			assert.Equal(t, vmOut, boundOut, "%s, env %d", src, i) // assert.Equal compares types too
		}
	}
	for _, src := range []string{`x > 1 ? "big" : "small"`, "filter(l, # > 1)", "a ?? 1", "len(l)", "let y = a; y + 1", "a and t"} {
		e := MustParse(src)
		assert.Nil(t, compileFast(e.program, nil), "%s: jumps, calls and variables run on the VM", src)
		env := map[string]any{"x": 2, "l": []any{1, 2, 3}, "a": 1, "t": true}
		want, wantErr := e.Eval(env)
		got, err := e.BindArgs([]string{"a", "l", "t", "x"})([]any{1, []any{1, 2, 3}, true, 2})
		assert.Equal(t, wantErr, err, src)
		assert.Equal(t, want, got, "%s: bound, on the VM", src)
	}
}
