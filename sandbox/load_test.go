package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hogCPUs keeps every core busy (two spinning processes a core) until the
// test ends: the machine of a loaded CI run, or of a user with a build
// going on.
func hogCPUs(t *testing.T) {
	for range 2 * runtime.NumCPU() {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		require.NoError(t, cmd.Start())
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
		})
	}
}

// Every byte a command wrote reaches its result while the agents are
// starved of CPU: many concurrent shell calls, each checked (an agent that
// ran late answered a successful echo with an empty stdout).
func TestShellOutputUnderLoad(t *testing.T) {
	for _, kind := range []string{"local", "docker"} {
		t.Run(kind, func(t *testing.T) {
			rb := newRealService(t, kind, nil)
			boxes := []string{"a", "b", "c", "d"}
			for _, b := range boxes {
				rb.ok("shell", map[string]any{"sandbox": b, "command": "true"})
			}
			hogCPUs(t)
			const calls = 200
			var wg sync.WaitGroup
			sem := make(chan struct{}, 40)
			for i := range calls {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					want := fmt.Sprintf("call %03d says hello", i)
					raw, _ := json.Marshal(map[string]any{"sandbox": boxes[i%len(boxes)], "command": "echo " + want + "; echo " + want + " >&2"})
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
					defer cancel()
					out, err := rb.s.CallTool(ctx, rb.sess, "shell", raw)
					if !assert.NoError(t, err) {
						return
					}
					var res struct {
						IsError  bool   `json:"is_error"`
						Error    string `json:"error"`
						Stdout   string `json:"stdout"`
						Stderr   string `json:"stderr"`
						ExitCode int    `json:"exit_code"`
					}
					require.NoError(t, json.Unmarshal(out, &res))
					if assert.False(t, res.IsError, res.Error) {
						assert.Equal(t, want+"\n", res.Stdout, "call %d", i)
						assert.Equal(t, want+"\n", res.Stderr, "call %d", i)
						assert.Equal(t, 0, res.ExitCode, "call %d", i)
					}
				}()
			}
			wg.Wait()
		})
	}
}
