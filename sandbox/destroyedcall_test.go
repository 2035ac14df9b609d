package sandbox_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/sandboxtest"
)

// TestCallOnDestroyedBox: a shell call running in a box that sandbox_destroy
// (from another client) or the session's deletion destroys answers that the
// box was destroyed while it ran, with the code of a missing box or session
// — not that the box "died" and "the next call restarts it", which nothing
// does.
func TestCallOnDestroyedBox(t *testing.T) {
	svc, _ := sandboxtest.Service(t, sandboxtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	call := func(id, tool string, in map[string]any) map[string]any {
		raw, err := json.Marshal(in)
		require.NoError(t, err)
		res, err := svc.CallTool(ctx, id, tool, raw)
		if err != nil {
			return map[string]any{"is_error": true, "error": err.Error(), "code": sandbox.ErrorCode(err)}
		}
		var out map[string]any
		require.NoError(t, json.Unmarshal(res, &out))
		return out
	}
	tests := []struct {
		name    string
		destroy func(t *testing.T, id string)
		code    string
		msg     string
	}{
		{"sandbox_destroy", func(t *testing.T, id string) {
			out := call(id, "sandbox_destroy", map[string]any{"sandbox": "victim"})
			require.Equal(t, false, out["is_error"], "%v", out)
		}, api.CodeNoBox, `sandbox "victim"`},
		{"session deleted", func(t *testing.T, id string) {
			require.NoError(t, svc.DeleteSession(ctx, id))
		}, api.CodeNoSession, "was deleted while this call ran"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, _, err := svc.NewSession(ctx)
			require.NoError(t, err)
			done := make(chan map[string]any, 1)
			go func() {
				done <- call(id, "shell", map[string]any{"sandbox": "victim", "command": "touch started; sleep 60"})
			}()
			require.Eventually(t, func() bool {
				out := call(id, "read_file", map[string]any{"sandbox": "victim", "path": "started"})
				return out["is_error"] == false
			}, time.Minute, 50*time.Millisecond, "the shell call started")
			tt.destroy(t, id)
			var out map[string]any
			select {
			case out = <-done:
			case <-ctx.Done():
				t.Fatal("the running call did not end when its box was destroyed")
			}
			assert.Equal(t, true, out["is_error"], "%v", out)
			assert.Equal(t, tt.code, out["code"], "%v", out["error"])
			msg, _ := out["error"].(string)
			assert.Contains(t, msg, "destroyed")
			assert.Contains(t, msg, tt.msg)
			assert.NotContains(t, msg, "restarts")
			assert.NotContains(t, msg, "died")
		})
	}
}
