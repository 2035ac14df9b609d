package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/cellbox/cellbox/server/runapi"
)

// TestLiveBoxes: stop names the boxes it destroys: the sandbox nodes' live
// boxes and those a model made from them (made), even when the node's own
// box is gone.
func TestLiveBoxes(t *testing.T) {
	in := runapi.Instance{
		Nodes: []runapi.Node{
			{Address: "default/p/ws", Builtin: "sandbox"},
			{Address: "default/p/gone", Builtin: "sandbox"},
			{Address: "default/p/agent", Builtin: "llm"},
		},
		Cells: []runapi.Cell{
			{Address: "default/p/ws", Value: json.RawMessage(`{"status":"running","box":"sandbox-p.ws","made":["sandbox-p.ws-1","sandbox-p.ws-2"]}`)},
			{Address: "default/p/gone", Value: json.RawMessage(`{"status":"destroyed","box":"sandbox-p.gone","made":["x"]}`)},
		},
	}
	assert.Equal(t, []string{
		"sandbox-p.ws (node ws)",
		"sandbox-p.ws-1 (made by a model from node ws's box)",
		"sandbox-p.ws-2 (made by a model from node ws's box)",
		"x (made by a model from node gone's box)",
	}, liveBoxes(in))
}
