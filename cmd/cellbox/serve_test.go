package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/sandboxtest"
	"github.com/cellbox/cellbox/server"
	"github.com/cellbox/cellbox/server/runapi"
)

// TestServeSessionTool drives the real binary: serve on the local backend,
// session new, tool calls, session rm, and a graceful stop.
func TestServeSessionTool(t *testing.T) {
	testenv.RequireBwrap(t)
	bin := testenv.CellboxBinary(t)
	data := t.TempDir()

	srv := startServe(t, data, "--pool", "1")
	url := srv.url

	run := func(env []string, args ...string) (string, error) {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(cleanEnv(), env...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		return out.String() + errb.String(), err
	}

	// --data alone finds the server on its --addr (a free port here): it
	// went to the default address and failed to connect.
	out, err := run(nil, "session", "new", "--data", data)
	require.NoError(t, err, out)
	var env []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		kv, ok := strings.CutPrefix(line, "export ")
		require.True(t, ok, line)
		env = append(env, kv)
	}
	require.Len(t, env, 3)
	assert.Equal(t, "CELLBOX_SERVER="+url, env[0])

	out, err = run(env, "tool", "shell", `{"command":"echo hi from $(pwd)"}`)
	require.NoError(t, err, out)
	var res map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	assert.Equal(t, "hi from /workspace\n", res["stdout"])
	assert.Equal(t, false, res["is_error"])

	out, err = run(env, "tool", "read_file", `{"path":"missing.txt"}`)
	require.Error(t, err, "is_error exits 1")
	assert.Contains(t, out, `"is_error": true`)
	assert.Contains(t, out, "no such file")

	out, err = run(env, "tool", "nosuchtool", `{}`)
	require.Error(t, err)
	assert.Contains(t, out, `unknown tool "nosuchtool"`)
	out, err = run(env, "tool", "shel", `{}`)
	require.Error(t, err)
	assert.Contains(t, out, `unknown tool "shel" in profile cellbox (did you mean "shell"?)`, "a typo gets the suggestion cellbox runn gets")

	out, err = run(env, "tool")
	require.NoError(t, err, out)
	assert.Contains(t, out, "str_replace")

	// A session's box defaults, from session new's flags.
	out, err = run(nil, "session", "new", "--server", url, "--data", data, "--env", "GREETING=hi there", "--env", "WHO=cli", "--workspace-dir", "/workspace/app", "--destroy-on-close")
	require.NoError(t, err, out)
	var env2 []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		env2 = append(env2, strings.TrimPrefix(line, "export "))
	}
	out, err = run(env2, "tool", "shell", `{"command":"echo $GREETING $WHO $(pwd)"}`)
	require.NoError(t, err, out)
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	assert.Equal(t, "hi there cli /workspace/app\n", res["stdout"])
	out, err = run(env2, "tool", "sandbox_list", `{}`)
	require.NoError(t, err, out)
	assert.Contains(t, out, `"destroy_on_close": true`)
	for _, bad := range []struct{ flag, value, want string }{
		{"--workspace-dir", "/etc", `workspace_dir "/etc" is outside the box's writable disk`},
		{"--env", "NOEQUALS", `"NOEQUALS": want KEY=VALUE`},
	} {
		out, err = run(nil, "session", "new", "--server", url, "--data", data, bad.flag, bad.value)
		require.Error(t, err, "%s %s: %s", bad.flag, bad.value, out)
		assert.Contains(t, out, bad.want)
	}

	id := strings.TrimPrefix(env[1], "CELLBOX_SESSION=")
	out, err = run(env, "session", "rm", id)
	require.NoError(t, err, out)
	out, err = run(env, "tool", "shell", `{"command":"true"}`)
	require.Error(t, err)
	assert.Contains(t, out, "no such session")

	assert.NoError(t, srv.stop(t), "graceful stop exits 0")
	assert.NoFileExists(t, filepath.Join(data, server.URLFile), "a stopped server takes its URL back")
}

// serveProc is a running `cellbox serve`.
type serveProc struct {
	cmd    *exec.Cmd
	url    string
	key    string      // the server key, from the page address of the banner
	done   chan error  // Wait's result, once
	stderr *syncBuffer // all it printed there
}

// startServe starts `cellbox serve` on the local backend over data, on a
// free loopback port, with args added (--pool N, --backend docker), and
// returns once it prints its URL. Cleanup stops it as a user would
// (SIGTERM).
func startServe(t *testing.T, data string, args ...string) *serveProc {
	t.Helper()
	return startServeEnv(t, data, nil, args...)
}

// startServeEnv is startServe with env added to serve's environment.
func startServeEnv(t *testing.T, data string, env []string, args ...string) *serveProc {
	t.Helper()
	return startServeIn(t, nil, data, env, args...)
}

// startServeIn is startServeEnv run under wrap (ip netns exec NS: a
// server in a network namespace), whose --addr args give.
func startServeIn(t *testing.T, wrap []string, data string, env []string, args ...string) *serveProc {
	t.Helper()
	argv := append(append(wrap, testenv.CellboxBinary(t), "serve", "--backend", "local", "--data", data, "--addr", "127.0.0.1:0"), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(cleanEnv(), env...)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &serveProc{cmd: cmd, done: make(chan error, 1), stderr: &syncBuffer{}}
	urls := make(chan [2]string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		re := regexp.MustCompile(`page: (http://[0-9.]+:\d+)/#token=([0-9a-f]+) `)
		for sc.Scan() {
			fmt.Fprintln(p.stderr, sc.Text())
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				urls <- [2]string{m[1], m[2]}
			}
		}
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		p.stop(t)
		sandboxtest.RemoveBoxes(t, data) // boxes a killed server left running, or asleep
	})
	select {
	case u := <-urls:
		p.url, p.key = u[0], u[1]
	case err := <-p.done:
		p.done <- err
		t.Fatalf("serve exited before serving: %v; it said:\n%s", err, p.stderr)
	case <-time.After(time.Minute):
		t.Fatal("serve printed no URL within a minute")
	}
	return p
}

// stop sends SIGTERM and returns serve's exit error (killing it after 30 s).
func (p *serveProc) stop(t *testing.T) error {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
		return err
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		t.Error("serve did not stop on SIGTERM")
		return <-p.done
	}
}

// TestServeResumesPatterns restarts `cellbox serve` over the same data
// directory: the patterns it had loaded run again, with their cells.
func TestServeResumesPatterns(t *testing.T) {
	testenv.RequireBwrap(t)
	data := t.TempDir()
	ctx := context.Background()
	srv := startServe(t, data, "--pool", "0")
	c := runapi.NewClient(srv.url).WithKey(srv.key)
	_, err := c.Load(ctx, writePattern(t, sumPattern), "", "")
	require.NoError(t, err)
	_, err = c.Set(ctx, "a", json.RawMessage(`10`))
	require.NoError(t, err)
	require.NoError(t, srv.stop(t))

	srv = startServe(t, data, "--pool", "0")
	c = runapi.NewClient(srv.url).WithKey(srv.key)
	ins, err := c.Patterns(ctx)
	require.NoError(t, err)
	require.Len(t, ins, 1, "the loaded pattern is back")
	assert.Equal(t, "calc", ins[0].Name)
	cell, err := c.Get(ctx, "double")
	require.NoError(t, err)
	assert.Equal(t, "24", string(cell.Value), "with its cells as they stood")
	_, err = c.Set(ctx, "b", json.RawMessage(`0`))
	require.NoError(t, err)
	cell, err = c.Get(ctx, "double")
	require.NoError(t, err)
	assert.Equal(t, "20", string(cell.Value), "and it runs")
}
