package sandbox_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/boxtest"
	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/backend"
)

// TestSleepAllRealBoxes: on bubblewrap, SleepAll ends the processes of
// every session's boxes and unmounts their disks (what a server that
// shuts down must leave: nothing running, a data dir that can be
// removed), and the next call wakes a box with its files.
func TestSleepAllRealBoxes(t *testing.T) {
	svc, _ := boxtest.Service(t, boxtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	call := func(session, tool string, in map[string]any) map[string]any {
		t.Helper()
		raw, err := json.Marshal(in)
		require.NoError(t, err)
		res, err := svc.CallToolAs(ctx, session, "", tool, raw)
		require.NoError(t, err)
		var out map[string]any
		require.NoError(t, json.Unmarshal(res, &out))
		require.Equal(t, false, out["is_error"], "%s %s: %v", tool, raw, out)
		return out
	}
	sessions := map[string]string{} // box id -> session
	for _, content := range []string{"one", "two"} {
		sess, _, err := svc.NewSession(ctx)
		require.NoError(t, err)
		id := call(sess, "sandbox_create", map[string]any{"sandbox": "work"})["id"].(string)
		call(sess, "write_file", map[string]any{"sandbox": "work", "path": "kept.txt", "content": content})
		sessions[id] = sess
	}

	require.NoError(t, svc.SleepAll(ctx))
	for id := range sessions {
		info, err := svc.Backend().Inspect(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, backend.StateStopped, info.State, "box %s: its processes ended", id)
		assert.Empty(t, testenv.Mounts(t, id), "box %s: its disk is unmounted", id)
	}
	for id, sess := range sessions {
		out := call(sess, "read_file", map[string]any{"sandbox": "work", "path": "kept.txt"})
		assert.Contains(t, []string{"one", "two"}, out["content"], "box %s woke with its files", id)
	}
}
