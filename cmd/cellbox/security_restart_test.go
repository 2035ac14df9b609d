package main

import (
	"context"
	"encoding/json"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandboxclient"
)

// TestServerKilledMidCall kills `cellbox serve` with SIGKILL while a shell
// call runs in a box, then starts it again over the same data directory:
// the session, its token and its box's files are all still there, and the
// box answers again. Nothing a user had is lost to a dead server.
func TestServerKilledMidCall(t *testing.T) {
	testenv.RequireBwrap(t)
	data := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	srv := startServe(t, data, "--pool", "0")
	c, err := sandboxclient.NewSessionWithKey(ctx, srv.url, srv.key)
	require.NoError(t, err)
	id, token := c.Session()
	_, err = c.Tool(ctx, "write_file", map[string]any{"sandbox": "work", "path": "kept.txt", "content": "written before the kill"})
	require.NoError(t, err)

	// A call in flight: it has started when its marker file exists.
	inFlight := make(chan error, 1)
	go func() {
		_, err := c.Tool(ctx, "shell", map[string]any{"sandbox": "work", "command": "touch started; sleep 30"})
		inFlight <- err
	}()
	require.Eventually(t, func() bool {
		_, err := c.Tool(ctx, "read_file", map[string]any{"sandbox": "work", "path": "started"})
		return err == nil
	}, 30*time.Second, 20*time.Millisecond, "the shell call started")
	require.NoError(t, srv.cmd.Process.Signal(syscall.SIGKILL))
	select {
	case err := <-inFlight:
		assert.Error(t, err, "the call in flight fails: its server died")
	case <-time.After(30 * time.Second):
		t.Fatal("the call in flight did not end when its server was killed")
	}
	<-srv.done
	srv.done <- nil // stop() of the cleanup finds it ended

	srv = startServe(t, data, "--pool", "0")
	c = sandboxclient.New(srv.url, id, token)
	out, err := c.Tool(ctx, "read_file", map[string]any{"sandbox": "work", "path": "kept.txt"})
	require.NoError(t, err, "the session and its token survive the kill")
	var rf api.ReadFileOutput
	require.NoError(t, json.Unmarshal(out, &rf))
	assert.Equal(t, "written before the kill", rf.Content, "and so do the box's files")
	out, err = c.Tool(ctx, "shell", map[string]any{"sandbox": "work", "command": "echo again"})
	require.NoError(t, err, "the box answers again")
	var sh api.ShellOutput
	require.NoError(t, json.Unmarshal(out, &sh))
	assert.Equal(t, "again\n", sh.Stdout)
	out, err = c.Tool(ctx, "sandbox_list", map[string]any{})
	require.NoError(t, err)
	assert.Contains(t, string(out), `"work"`)
}
