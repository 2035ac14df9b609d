package agent

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testAgent is an agent served in-process on a temp socket, with a temp
// workspace and a second allowed root standing in for /tmp.
type testAgent struct {
	c         *Client
	socket    string
	workspace string // resolved
	tmp       string // the second allowed root
	outside   string // a directory outside every allowed root
}

func startAgent(t testing.TB) *testAgent { return startAgentIn(t, nil) }

// startAgentIn is startAgent with a working directory of setup's choosing
// (a box's workspace_dir), made before the agent starts; the allowed roots
// stay the workspace and tmp.
func startAgentIn(t testing.TB, setup func(a *testAgent) string) *testAgent {
	t.Helper()
	// Unix socket paths are short (108 bytes): not under t.TempDir().
	sockDir, err := os.MkdirTemp("", "cbag")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	base, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	a := &testAgent{
		socket:    filepath.Join(sockDir, "agent.sock"),
		workspace: filepath.Join(base, "workspace"),
		tmp:       filepath.Join(base, "tmp"),
		outside:   filepath.Join(base, "outside"),
	}
	require.NoError(t, os.MkdirAll(a.tmp, 0o755))
	require.NoError(t, os.MkdirAll(a.outside, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(a.outside, "secret"), []byte("top secret\n"), 0o644))

	workdir := a.workspace
	if setup != nil {
		workdir = setup(a)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	go func() {
		done <- Serve(ctx, Options{Socket: a.socket, Workspace: workdir, AllowedRoots: []string{a.workspace, a.tmp}, Logger: log})
	}()
	a.c = Dial(a.socket)
	t.Cleanup(func() {
		a.c.Close()
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Error("agent did not stop within 10s")
		}
	})
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	defer rcancel()
	require.NoError(t, a.c.WaitReady(rctx))
	return a
}

func (a *testAgent) path(rel string) string { return filepath.Join(a.workspace, rel) }

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// requireCode asserts err is an *Error with the code.
func requireCode(t *testing.T, err error, code string) *Error {
	t.Helper()
	require.Error(t, err)
	var e *Error
	require.True(t, errors.As(err, &e), "want *Error with code %s, got %T: %v", code, err, err)
	require.Equal(t, code, e.Code, "message: %s", e.Message)
	return e
}

func TestVersion(t *testing.T) {
	a := startAgent(t)
	v, err := a.c.Version(ctxT(t))
	require.NoError(t, err)
	require.Equal(t, ProtocolVersion, v.Protocol)
	require.Equal(t, os.Getpid(), v.PID)
	require.Equal(t, a.workspace, v.Workspace)
	fi, err := os.Stat(a.workspace)
	require.NoError(t, err)
	require.True(t, fi.IsDir(), "Serve creates the workspace")
}

func TestErrorIsNotExist(t *testing.T) {
	a := startAgent(t)
	_, err := a.c.Stat(ctxT(t), "nope")
	require.ErrorIs(t, err, fs.ErrNotExist)
	e := requireCode(t, err, CodeNotFound)
	require.Equal(t, "stat "+a.path("nope")+": no such file or directory", e.Message)
}

func cancelCtx(t testing.TB) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx, cancel
}

// TestWorkdirSymlinkedOut: a box's working directory (workspace_dir) that
// the box replaced by a symlink out of its disk (it is made again from it
// on the next wake) does not carry the file tools out: relative paths
// resolve there, then are refused.
func TestWorkdirSymlinkedOut(t *testing.T) {
	a := startAgentIn(t, func(a *testAgent) string {
		require.NoError(t, os.MkdirAll(a.workspace, 0o755))
		require.NoError(t, os.Symlink(a.outside, filepath.Join(a.workspace, "app")))
		return filepath.Join(a.workspace, "app")
	})
	_, err := a.c.ReadFile(ctxT(t), ReadRequest{Path: "secret"})
	e := requireCode(t, err, CodeOutsideWorkspace)
	assert.Contains(t, e.Message, "resolves to "+filepath.Join(a.outside, "secret"))
	_, err = a.c.WriteFile(ctxT(t), WriteRequest{Path: "planted", Data: []byte("x")})
	requireCode(t, err, CodeOutsideWorkspace)
	_, err = os.Stat(filepath.Join(a.outside, "planted"))
	assert.ErrorIs(t, err, os.ErrNotExist)
}
