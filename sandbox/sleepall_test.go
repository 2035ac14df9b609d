package sandbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/sandboxtest"
)

// TestSleepAllRealBoxes: on bubblewrap, SleepAll ends the processes of
// every session's boxes and unmounts their disks (what a server that
// shuts down must leave: nothing running, a data dir that can be
// removed); no later call of that service starts a box again, and the
// next service's first call wakes a box with its files.
func TestSleepAllRealBoxes(t *testing.T) {
	svc, dir := sandboxtest.Service(t, sandboxtest.Options{})
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
	// The process is shutting down: no call starts a box again.
	for id := range sessions {
		raw, err := svc.CallToolAs(ctx, sessions[id], "", "shell", json.RawMessage(`{"sandbox": "work", "command": "true"}`))
		require.NoError(t, err)
		assert.Contains(t, string(raw), "the server is shutting down")
		assert.Contains(t, string(raw), `"code":"unavailable"`, "a call to make again once the server is back, not a fault")
		info, err := svc.Backend().Inspect(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, backend.StateStopped, info.State, "box %s stays asleep", id)
	}
	// The next service over the data dir wakes each box with its files.
	require.NoError(t, svc.Close())
	svc, err := sandbox.New(ctx, sandbox.Config{Backend: svc.Backend(), DataDir: dir, AgentBinary: testenv.CellboxBinary(t),
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))})
	require.NoError(t, err)
	t.Cleanup(func() { svc.Close() })
	for id, sess := range sessions {
		out := call(sess, "read_file", map[string]any{"sandbox": "work", "path": "kept.txt"})
		assert.Contains(t, []string{"one", "two"}, out["content"], "box %s woke with its files", id)
	}
}

// A box asked for after SleepAll is not made, not even from the warm pool
// (whose boxes run already): it would run on after the process exited,
// with nobody left to put it to sleep.
func TestSleepAllThenWarmBox(t *testing.T) {
	svc, _ := sandboxtest.Service(t, sandboxtest.Options{Pool: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sess, _, err := svc.NewSession(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		ready := svc.Metrics().PoolReady
		return len(ready) == 1 && ready[0].N == 1
	}, time.Minute, 10*time.Millisecond, "the pool fills")
	require.NoError(t, svc.SleepAll(ctx))
	raw, err := svc.CallToolAs(ctx, sess, "", "sandbox_create", json.RawMessage(`{"sandbox": "late"}`))
	require.NoError(t, err)
	assert.Contains(t, string(raw), "the server is shutting down")
	assert.Contains(t, string(raw), `"code":"unavailable"`)
	list, err := svc.CallToolAs(ctx, sess, "", "sandbox_list", nil)
	require.NoError(t, err)
	assert.NotContains(t, string(list), `"late"`, "no box was handed out")
}

// TestCallEndedWithCause: a call whose caller ends it with a reason (a
// server whose stop's grace ran out) is answered with that reason and the
// code unavailable — call again once the server is back — not internal,
// which says the service or its backend failed.
func TestCallEndedWithCause(t *testing.T) {
	svc, _ := sandboxtest.Service(t, sandboxtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sess, _, err := svc.NewSession(ctx)
	require.NoError(t, err)
	raw, err := svc.CallToolAs(ctx, sess, "", "shell", json.RawMessage(`{"command": "true"}`)) // the box is up
	require.NoError(t, err)
	require.Contains(t, string(raw), `"is_error":false`)

	callCtx, end := context.WithCancelCause(ctx)
	done := make(chan json.RawMessage, 1)
	go func() {
		raw, err := svc.CallToolAs(callCtx, sess, "", "shell", json.RawMessage(`{"command": "touch started; sleep 600", "timeout_ms": 900000}`))
		assert.NoError(t, err)
		done <- raw
	}()
	require.Eventually(t, func() bool {
		raw, err := svc.CallToolAs(ctx, sess, "", "read_file", json.RawMessage(`{"path": "started"}`))
		return err == nil && strings.Contains(string(raw), `"is_error":false`)
	}, time.Minute, 20*time.Millisecond, "the long call runs")
	end(errors.New("the server is shutting down: the call was ended"))
	var out struct {
		IsError bool   `json:"is_error"`
		Error   string `json:"error"`
		Code    string `json:"code"`
	}
	select {
	case raw = <-done:
	case <-ctx.Done():
		t.Fatal("the call did not end")
	}
	require.NoError(t, json.Unmarshal(raw, &out), string(raw))
	assert.True(t, out.IsError)
	assert.Equal(t, "the server is shutting down: the call was ended", out.Error)
	assert.Equal(t, "unavailable", out.Code)
}
