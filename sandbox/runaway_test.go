package sandbox_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/sandboxtest"
)

// TestShellLeftoversAndKillAll: through the tools, in a real box: what a
// shell call leaves running ends with it (and a notice says so); a profile
// tool without a background mode keeps it, as its seed does; process
// kill_all ends every process of the box, background jobs included.
func TestShellLeftoversAndKillAll(t *testing.T) {
	svc, _ := sandboxtest.Service(t, sandboxtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id, _, err := svc.NewSession(ctx)
	require.NoError(t, err)
	call := func(profile, tool string, in map[string]any) map[string]any {
		t.Helper()
		raw, err := json.Marshal(in)
		require.NoError(t, err)
		res, err := svc.CallToolAs(ctx, id, profile, tool, raw)
		require.NoError(t, err)
		var out map[string]any
		require.NoError(t, json.Unmarshal(res, &out))
		require.Equal(t, false, out["is_error"], "%s %s: %v", tool, raw, out)
		return out
	}
	sleeps := func() string {
		out := call("", "shell", map[string]any{"command": "ps -eo args= | grep -c '^sleep 99' || true"})
		return out["stdout"].(string)
	}

	out := call("", "shell", map[string]any{"command": "sleep 991 & echo hi"})
	assert.Equal(t, "hi\n", out["stdout"])
	assert.Contains(t, out["notice"], "ended 1 process the command left running")
	assert.Equal(t, "0\n", sleeps())

	call("deerflow", "bash", map[string]any{"description": "start", "command": "nohup sleep 992 >/dev/null 2>&1 &"})
	call("", "shell", map[string]any{"command": "sleep 993", "background": true})
	// A background job is started when the call returns, but its shell
	// may not have become `sleep` yet (seen in a loaded CI run): wait for
	// it, with a safety net.
	got := sleeps()
	for deadline := time.Now().Add(30 * time.Second); got != "2\n" && time.Now().Before(deadline); got = sleeps() {
		time.Sleep(50 * time.Millisecond)
	}
	assert.Equal(t, "2\n", got, "the profile tool's leftover and the background job live on")

	k := call("", "process", map[string]any{"action": "kill_all"})
	assert.Equal(t, true, k["ok"])
	assert.EqualValues(t, 2, k["ended"])
	assert.Equal(t, "0\n", sleeps())
}
