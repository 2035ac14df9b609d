package patterns_test

import (
	"context"
	"encoding/json"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/builtins"
	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/patterns"
	"github.com/cellbox/cellbox/runtime"
	"github.com/cellbox/cellbox/sandboxclient"
)

// noBoxes is a sandbox client for compiling: the tests here start no box.
type noBoxes struct{ sandboxclient.Client }

func TestCompileCSV(t *testing.T) {
	p, err := patterns.Load("testdata/csv")
	require.NoError(t, err)
	rp, err := patterns.Compile(p, builtins.Env{Client: noBoxes{}})
	require.NoError(t, err)

	assert.Equal(t, "default", rp.Space)
	assert.Equal(t, "csv-pipeline", rp.Name)
	cellsByName := map[string]runtime.Cell{}
	for _, c := range rp.Cells {
		cellsByName[c.Name] = c
	}
	assert.JSONEq(t, `10`, string(cellsByName["threshold"].Initial))
	assert.JSONEq(t, `"a,b\n1,20\n2,5\n"`, string(cellsByName["raw"].Initial), "a file cell starts with the file's text")
	assert.JSONEq(t, `{"type":"object","properties":{"port":{"type":"integer"}},"required":["port"]}`, string(cellsByName["config"].Schema))

	type node struct {
		inputs  []string
		builtin string
		streams []string
		kind    any
	}
	want := map[string]node{
		"clean":   {[]string{"raw"}, "exec", nil, &builtins.Exec{}},
		"big":     {[]string{"clean", "threshold"}, "exec", nil, &builtins.Exec{}},
		"ok":      {[]string{"big", "clean"}, "computed", nil, &builtins.Computed{}},
		"summary": {[]string{"big", "threshold"}, "computed", nil, builtins.ComputeFunc(nil)},
		"repl":    {[]string{"config"}, "sandbox", []string{"run", "destroy", "snapshot"}, &builtins.Sandbox{}},
	}
	require.Len(t, rp.Nodes, len(want))
	for _, n := range rp.Nodes {
		w, ok := want[n.Name]
		require.True(t, ok, n.Name)
		assert.Equal(t, w.inputs, n.Inputs, n.Name)
		assert.Equal(t, w.builtin, n.Builtin, n.Name)
		assert.Equal(t, w.streams, n.Streams, n.Name)
		assert.IsType(t, w.kind, n.Kind, n.Name)
	}

	rp, err = patterns.CompileInstance(p, builtins.Env{Client: noBoxes{}}, "team", "csv-2")
	require.NoError(t, err)
	assert.Equal(t, "team", rp.Space)
	assert.Equal(t, "csv-2", rp.Name)
}

func TestCompileErrors(t *testing.T) {
	p, err := patterns.Load("testdata/csv")
	require.NoError(t, err)
	_, err = patterns.Compile(p, builtins.Env{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "pattern.yaml:15: nodes.clean: exec node clean: no sandbox client")
	assert.Contains(t, err.Error(), "nodes.repl: sandbox node repl: no sandbox client")

	for _, bad := range [][2]string{{"a/b", "x"}, {"team", "a b"}, {"team", "../x"}, {"", "x"}, {"team", ""}} {
		_, err = patterns.CompileInstance(p, builtins.Env{Client: noBoxes{}}, bad[0], bad[1])
		assert.ErrorContains(t, err, "use letters, digits", "%q", bad)
	}
}

// TestCompileValues runs computed nodes: expressions keep their JSON type,
// templates format values as text.
func TestCompileValues(t *testing.T) {
	p, err := patterns.Parse("pattern.yaml", []byte(`
name: values
cells:
  s: text
  n:
  i: 3
  f: 1.5
  b: true
  l: [1, a]
  o: {value: {b: 1, a: [2]}}
nodes:
  expr: {computed: '${o}'}
  tmpl: {computed: 's=${s} n=[${n}] i=${i} f=${f} b=${b} l=${l} o=${o} $${not} ${i * 2}'}
  doubled: {computed: '${expr.a[0] * i}'}
`), fstest.MapFS{})
	require.NoError(t, err)
	rp, err := patterns.Compile(p, builtins.Env{})
	require.NoError(t, err, "computed nodes need no sandbox client")
	store := cells.NewMemory(cells.Options{})
	defer store.Close()
	rt := runtime.New(store, runtime.Options{})
	require.NoError(t, rt.Load(context.Background(), rp))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	defer rt.Close(ctx)
	require.NoError(t, rt.Wait(ctx))
	get := func(name string) string {
		c, err := store.Get(context.Background(), cells.Address{Space: "default", Pattern: "values", Name: name})
		require.NoError(t, err)
		require.Empty(t, c.Error, name)
		return string(c.Value)
	}
	assert.JSONEq(t, `{"a":[2],"b":1}`, get("expr"))
	var tmpl string
	require.NoError(t, json.Unmarshal([]byte(get("tmpl")), &tmpl))
	assert.Equal(t, `s=text n=[] i=3 f=1.5 b=true l=[1,"a"] o={"a":[2],"b":1} ${not} 6`, tmpl)
	assert.Equal(t, `6`, get("doubled"))
}
