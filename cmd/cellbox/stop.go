package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"strings"

	"github.com/cellbox/cellbox/server/runapi"
)

func init() {
	register(command{
		name:  "stop",
		usage: "PATTERN [--data DIR | --server URL]  stop a loaded pattern and destroy its boxes (sandbox nodes' boxes, exec runs in flight); its cells are kept",
		run:   runStop,
	})
}

// runStop stops a pattern of a running `cellbox run` or `cellbox serve`
// (DELETE /v1/patterns/NAME), saying which boxes went with it: the
// boxes of its sandbox nodes, read from their cells before the stop.
func runStop(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("stop", flag.ContinueOnError)
	af := addAPIFlags(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("want one PATTERN (the name of a loaded pattern, or space/name), got %d arguments", len(pos))
	}
	c, err := af.client()
	if err != nil {
		return err
	}
	loaded, err := c.Patterns(ctx)
	if err != nil {
		return err
	}
	var boxes []string
	name := pos[0]
	for _, in := range loaded {
		if name == in.Name || name == in.Space+"/"+in.Name {
			name, boxes = in.Space+"/"+in.Name, liveBoxes(in)
			break
		}
	}
	if err := c.Stop(ctx, name); err != nil { // an unknown name: its error lists the loaded ones
		return err
	}
	fmt.Printf("stopped pattern %s\n", name)
	if len(boxes) == 0 {
		fmt.Println("it had no live sandbox boxes")
	} else {
		fmt.Printf("destroyed its boxes: %s\n", strings.Join(boxes, ", "))
	}
	fmt.Printf("its cells are kept (cellbox cell ls %s%s); load it again with cellbox run or POST /v1/patterns\n", name, dataFlag(*af.data))
	return nil
}

// liveBoxes lists the boxes of an instance's sandbox nodes that are not
// destroyed, as "BOX (node NODE)", and those a model made from them
// (fork, branch), which go with them.
func liveBoxes(in runapi.Instance) []string {
	values := map[string]json.RawMessage{}
	for _, c := range in.Cells {
		values[c.Address] = c.Value
	}
	var out []string
	for _, n := range in.Nodes {
		if n.Builtin != "sandbox" {
			continue
		}
		var v struct {
			Box, Status string
			Made        []string
		}
		if json.Unmarshal(values[n.Address], &v) != nil {
			continue
		}
		node := n.Address[strings.LastIndex(n.Address, "/")+1:]
		if v.Box != "" && v.Status != "destroyed" {
			out = append(out, fmt.Sprintf("%s (node %s)", v.Box, node))
		}
		for _, m := range v.Made {
			out = append(out, fmt.Sprintf("%s (made by a model from node %s's box)", m, node))
		}
	}
	return out
}
