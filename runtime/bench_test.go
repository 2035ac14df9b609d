package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/builtins"
	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/runtime"
)

const benchNodes = 10000

// shapes builds 10,000-node computed graphs over the cell "root".
var shapes = []struct {
	name  string
	build func() []runtime.Node
}{
	{"chain", func() []runtime.Node { // n0 = root+1, n1 = n0+1, ...
		nodes := make([]runtime.Node, benchNodes)
		for i := range nodes {
			in := "root"
			if i > 0 {
				in = "n" + strconv.Itoa(i-1)
			}
			nodes[i] = benchNode("n"+strconv.Itoa(i), in+" + 1")
		}
		return nodes
	}},
	{"fanout", func() []runtime.Node { // every node reads root
		nodes := make([]runtime.Node, benchNodes)
		for i := range nodes {
			nodes[i] = benchNode("n"+strconv.Itoa(i), "root + "+strconv.Itoa(i))
		}
		return nodes
	}},
	{"diamonds", func() []runtime.Node { // top -> left, right -> bottom = next top
		var nodes []runtime.Node
		top := "root"
		for i := 0; len(nodes)+3 <= benchNodes; i++ {
			l, r, b := fmt.Sprintf("l%d", i), fmt.Sprintf("r%d", i), fmt.Sprintf("b%d", i)
			nodes = append(nodes, benchNode(l, top+" + 1"), benchNode(r, top+" - 1"), benchNode(b, "("+l+" + "+r+") / 2"))
			top = b
		}
		return nodes
	}},
}

func benchNode(name, src string) runtime.Node {
	c := mustComputed(src)
	return runtime.Node{Name: name, Inputs: c.Inputs(), Kind: c}
}

// BenchmarkPropagation sets the root of a 10,000-node computed graph and
// propagates through every node. It reports ns per node, and the ratio to a
// baseline measured in the same run: evaluating the same expressions
// directly, in order, with no runtime or store.
func BenchmarkPropagation(b *testing.B) {
	for _, shape := range shapes {
		for _, backend := range []string{"memory", "bolt"} {
			b.Run(shape.name+"/"+backend, func(b *testing.B) {
				nodes := shape.build()
				base := baseline(b, nodes)
				opts := cells.Options{LogLimit: 16}
				var s cells.Store
				if backend == "memory" {
					s = cells.NewMemory(opts)
				} else {
					var err error
					s, err = cells.OpenBolt(filepath.Join(b.TempDir(), "cells.db"), opts)
					require.NoError(b, err)
				}
				defer s.Close()
				rt := runtime.New(s, runtime.Options{})
				defer rt.Close(context.Background())
				p := runtime.Pattern{Space: "bench", Name: shape.name, Cells: []runtime.Cell{{Name: "root", Initial: json.RawMessage(`0`)}}, Nodes: nodes}
				require.NoError(b, rt.Load(context.Background(), p))
				root := cells.Address{Space: "bench", Pattern: shape.name, Name: "root"}
				b.ResetTimer()
				start := time.Now()
				for i := 0; i < b.N; i++ {
					if err := rt.Set(context.Background(), root, json.RawMessage(strconv.Itoa(i+1))); err != nil {
						b.Fatal(err)
					}
				}
				perNode := float64(time.Since(start).Nanoseconds()) / float64(b.N*len(nodes))
				b.ReportMetric(perNode, "ns/node")
				b.ReportMetric(perNode/base, "x-baseline")
			})
		}
	}
}

// baseline returns ns per node to evaluate the graph's expressions directly.
func baseline(b *testing.B, nodes []runtime.Node) float64 {
	vals := map[string]any{}
	fns := make([]func([]any) (any, error), len(nodes))
	for i, n := range nodes {
		fns[i] = n.Kind.(*builtins.Computed).BindArgs(n.Inputs)
	}
	var args []any
	run := func(root int) {
		vals["root"] = root
		for k, n := range nodes {
			args = args[:0]
			for _, in := range n.Inputs {
				args = append(args, vals[in])
			}
			out, err := fns[k](args)
			if err != nil {
				b.Fatal(err)
			}
			vals[n.Name] = out
		}
	}
	const rounds = 20
	start := time.Now()
	for i := range rounds {
		run(i)
	}
	return float64(time.Since(start).Nanoseconds()) / float64(rounds*len(nodes))
}
