package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
)

// TestServeSessionTool drives the real binary: serve on the local backend,
// session new, tool calls, session rm, and a graceful stop.
func TestServeSessionTool(t *testing.T) {
	testenv.RequireBwrap(t)
	bin := testenv.CellboxBinary(t)
	data := t.TempDir()

	srv := exec.Command(bin, "serve", "--backend", "local", "--data", data, "--addr", "127.0.0.1:0", "--pool", "1")
	stderr, err := srv.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, srv.Start())
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	url := ""
	sc := bufio.NewScanner(stderr)
	re := regexp.MustCompile(`serving on (http://127\.0\.0\.1:\d+)`)
	for url == "" && sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			url = m[1]
		}
	}
	require.NotEmpty(t, url, "serve printed its URL")
	go func() {
		for sc.Scan() {
		}
	}()

	run := func(env []string, args ...string) (string, error) {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), env...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		return out.String() + errb.String(), err
	}

	out, err := run(nil, "session", "new", "--server", url)
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

	out, err = run(env, "tool")
	require.NoError(t, err, out)
	assert.Contains(t, out, "str_replace")

	id := strings.TrimPrefix(env[1], "CELLBOX_SESSION=")
	out, err = run(env, "session", "rm", id)
	require.NoError(t, err, out)
	out, err = run(env, "tool", "shell", `{"command":"true"}`)
	require.Error(t, err)
	assert.Contains(t, out, "no such session")

	require.NoError(t, srv.Process.Signal(syscall.SIGTERM))
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	select {
	case err := <-done:
		assert.NoError(t, err, "graceful stop exits 0")
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop on SIGTERM")
	}
}
