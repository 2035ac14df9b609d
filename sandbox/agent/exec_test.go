package agent

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestExec(t *testing.T) {
	a := startAgent(t)
	tests := []struct {
		name     string
		req      ExecRequest
		stdout   string
		stderr   string
		exitCode int
	}{
		{"shell", ExecRequest{Command: "echo hello; echo oops >&2; exit 3"}, "hello\n", "oops\n", 3},
		{"argv", ExecRequest{Argv: []string{"printf", "%s|", "a b", "c"}}, "a b|c|", "", 0},
		{"bash features", ExecRequest{Command: "a=(x y); echo ${#a[@]}"}, "2\n", "", 0},
		{"default cwd is the workspace", ExecRequest{Command: "pwd"}, a.workspace + "\n", "", 0},
		{"relative cwd", ExecRequest{Command: "mkdir -p sub && cd sub && pwd"}, a.workspace + "/sub\n", "", 0},
		{"env", ExecRequest{Command: "echo $FOO-$HOME_X", Env: map[string]string{"FOO": "bar", "HOME_X": "y"}}, "bar-y\n", "", 0},
		{"env overrides", ExecRequest{Command: "echo $PATH", Env: map[string]string{"PATH": "/bin:/usr/bin"}}, "/bin:/usr/bin\n", "", 0},
		{"stdin", ExecRequest{Command: "tr a-z A-Z", Stdin: []byte("shout\n")}, "SHOUT\n", "", 0},
		{"no stdin reads EOF", ExecRequest{Command: "cat; echo done"}, "done\n", "", 0},
		{"invalid utf-8 replaced", ExecRequest{Command: `printf 'a\377b'`}, "a\uFFFDb", "", 0},
		{"killed by signal", ExecRequest{Command: "kill -9 $$"}, "", "", -1},
		{"command not found", ExecRequest{Command: "nosuchcommand-xyz"}, "", "", 127},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := a.c.Exec(ctxT(t), tt.req, nil)
			require.NoError(t, err)
			assert.Equal(t, tt.stdout, res.Stdout)
			if tt.name != "command not found" {
				assert.Equal(t, tt.stderr, res.Stderr)
			}
			assert.Equal(t, tt.exitCode, res.ExitCode)
			assert.False(t, res.Truncated)
			assert.False(t, res.TimedOut)
			assert.NotEmpty(t, res.ProcessID)
		})
	}
	t.Run("relative cwd exists", func(t *testing.T) {
		res, err := a.c.Exec(ctxT(t), ExecRequest{Command: "pwd", Cwd: "sub"}, nil)
		require.NoError(t, err)
		assert.Equal(t, a.workspace+"/sub\n", res.Stdout)
	})
}

func TestExecBadRequests(t *testing.T) {
	a := startAgent(t)
	tests := []struct {
		name string
		req  ExecRequest
		code string
		msg  string
	}{
		{"empty", ExecRequest{}, CodeInvalid, "exec: command is empty"},
		{"both", ExecRequest{Command: "true", Argv: []string{"true"}}, CodeInvalid, "exec: give either command or argv, not both"},
		{"missing cwd", ExecRequest{Command: "true", Cwd: "/nonexistent/dir"}, CodeNotFound, "exec: working directory /nonexistent/dir does not exist"},
		{"missing executable", ExecRequest{Argv: []string{"no-such-binary-xyz"}}, CodeNotFound, "exec no-such-binary-xyz: executable file not found in $PATH"},
		{"bad env", ExecRequest{Command: "true", Env: map[string]string{"A=B": "c"}}, CodeInvalid, `exec: bad environment variable "A=B"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := a.c.Exec(ctxT(t), tt.req, nil)
			e := requireCode(t, err, tt.code)
			assert.Equal(t, tt.msg, e.Message)
		})
	}
}

func TestExecStream(t *testing.T) {
	a := startAgent(t)
	got := map[string]string{}
	firstChunk := make(chan struct{})
	var once sync.Once
	res, err := a.c.Exec(ctxT(t), ExecRequest{Command: "echo one; echo two >&2; sleep 0.2; echo three", MaxOutput: 8}, func(stream string, data []byte) {
		got[stream] += string(data)
		once.Do(func() { close(firstChunk) })
	})
	require.NoError(t, err)
	assert.Equal(t, "one\nthre", res.Stdout)
	assert.Equal(t, "two\n", res.Stderr)
	assert.True(t, res.Truncated)
	assert.Equal(t, 0, res.ExitCode)
	assert.Equal(t, map[string]string{"stdout": "one\nthre", "stderr": "two\n"}, got, "the stream carries what the result keeps")

	// output arrives while the command runs
	ctx := ctxT(t)
	firstChunk = make(chan struct{})
	once = sync.Once{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.c.Exec(ctx, ExecRequest{Command: "echo early; sleep 5"}, func(string, []byte) { once.Do(func() { close(firstChunk) }) })
	}()
	select {
	case <-firstChunk:
	case <-time.After(4 * time.Second):
		t.Fatal("no output streamed before the command ended")
	}

	_, err = a.c.Exec(ctxT(t), ExecRequest{}, func(string, []byte) {})
	requireCode(t, err, CodeInvalid)
}

// processGone reports whether no process with pid exists (zombies count as
// gone: they have exited).
func processGone(pid int) bool {
	b, err := readFileString("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// pid (comm) STATE ...
	i := strings.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}

func TestExecTimeoutKillsTheGroup(t *testing.T) {
	a := startAgent(t)
	res, err := a.c.Exec(ctxT(t), ExecRequest{Command: "sleep 100 & echo $!; sleep 100", TimeoutMs: 300}, nil)
	require.NoError(t, err)
	assert.True(t, res.TimedOut)
	assert.Equal(t, -1, res.ExitCode)
	bg, err := strconv.Atoi(strings.TrimSpace(res.Stdout))
	require.NoError(t, err, "stdout %q", res.Stdout)
	require.Eventually(t, func() bool { return processGone(bg) }, 5*time.Second, 10*time.Millisecond, "background sleep %d survived the timeout", bg)
	// no `sleep 100` of this group left at all
	out, _ := a.c.Exec(ctxT(t), ExecRequest{Command: "pgrep -f '^sleep 100$' || true"}, nil)
	assert.Empty(t, strings.TrimSpace(out.Stdout))
}

func TestExecYesIsCappedAndKilled(t *testing.T) {
	a := startAgent(t)
	res, err := a.c.Exec(ctxT(t), ExecRequest{Command: "yes", TimeoutMs: 500, MaxOutput: 64 << 10}, nil)
	require.NoError(t, err)
	assert.True(t, res.TimedOut)
	assert.True(t, res.Truncated)
	assert.Equal(t, -1, res.ExitCode)
	assert.Len(t, res.Stdout, 64<<10)
	assert.Equal(t, strings.Repeat("y\n", 32<<10), res.Stdout)
}

func TestExecLargeOutputIsDrained(t *testing.T) {
	a := startAgent(t)
	// 200 MiB on stdout, more than the cap: the command must not block on a
	// full pipe, and the result holds the default 1 MiB.
	res, err := a.c.Exec(ctxT(t), ExecRequest{Command: "head -c 209715200 /dev/zero | tr '\\0' x; echo done >&2"}, nil)
	require.NoError(t, err)
	assert.False(t, res.TimedOut)
	assert.Equal(t, 0, res.ExitCode)
	assert.True(t, res.Truncated)
	assert.Len(t, res.Stdout, DefaultMaxOutput)
	assert.Equal(t, "done\n", res.Stderr)
}

func TestExecTenMegabyteLine(t *testing.T) {
	a := startAgent(t)
	res, err := a.c.Exec(ctxT(t), ExecRequest{Command: "head -c 10485760 /dev/zero | tr '\\0' a; echo"}, nil)
	require.NoError(t, err)
	assert.True(t, res.Truncated)
	assert.Len(t, res.Stdout, DefaultMaxOutput)

	// and through a file: write it, read it (line cut), grep it (excerpt)
	_, err = a.c.Exec(ctxT(t), ExecRequest{Command: "{ head -c 5000000 /dev/zero | tr '\\0' a; printf NEEDLE; head -c 5000000 /dev/zero | tr '\\0' b; echo; echo second; } > long.txt"}, nil)
	require.NoError(t, err)
	rr, err := a.c.ReadFile(ctxT(t), ReadRequest{Path: "long.txt"})
	require.NoError(t, err)
	assert.Equal(t, 2, rr.TotalLines)
	assert.True(t, rr.Truncated)
	assert.Equal(t, strings.Repeat("a", MaxReadLineChars)+LineCutMarker+"\nsecond\n", rr.Content)
	gr, err := a.c.Grep(ctxT(t), GrepRequest{Pattern: "NEEDLE"})
	require.NoError(t, err)
	require.Len(t, gr.Hits, 1)
	assert.Equal(t, 1, gr.Hits[0].Line)
	assert.Contains(t, gr.Hits[0].Text, "NEEDLE")
	assert.LessOrEqual(t, len(gr.Hits[0].Text), DefaultGrepLineLen+2*len("…"))
}

func TestExecCancelKillsTheGroup(t *testing.T) {
	a := startAgent(t)
	pidFile := a.path("pids")
	ctx, cancel := context.WithCancel(ctxT(t))
	errc := make(chan error, 1)
	go func() {
		_, err := a.c.Exec(ctx, ExecRequest{Command: "sleep 100 & echo $! > " + pidFile + "; echo $$ >> " + pidFile + "; wait"}, nil)
		errc <- err
	}()
	var pids []int
	require.Eventually(t, func() bool {
		b, err := readFileString(pidFile)
		pids = pids[:0]
		for _, f := range strings.Fields(b) {
			p, _ := strconv.Atoi(f)
			pids = append(pids, p)
		}
		return err == nil && len(pids) == 2
	}, 5*time.Second, 5*time.Millisecond)
	procs, err := a.c.Processes(ctxT(t))
	require.NoError(t, err)
	require.Len(t, procs, 1, "the running exec is listed")
	assert.True(t, procs[0].Running)
	assert.Equal(t, pids[1], procs[0].PID)

	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	for _, p := range pids {
		require.Eventually(t, func() bool { return processGone(p) }, 5*time.Second, 10*time.Millisecond, "pid %d survived the cancel", p)
	}
	require.Eventually(t, func() bool {
		procs, err := a.c.Processes(ctxT(t))
		return err == nil && len(procs) == 0
	}, 5*time.Second, 10*time.Millisecond, "a finished exec leaves the table")
}

func TestExecBackgroundChildDoesNotHoldTheCall(t *testing.T) {
	a := startAgent(t)
	res, err := a.c.Exec(ctxT(t), ExecRequest{Command: "sleep 30 & echo started $!"}, nil)
	require.NoError(t, err)
	// Only the sleep this test started is ended (never a host-wide pkill).
	var pid int
	_, scanErr := fmt.Sscanf(res.Stdout, "started %d\n", &pid)
	require.NoError(t, scanErr, "stdout %q", res.Stdout)
	require.Greater(t, pid, 1)
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	assert.NoError(t, syscall.Kill(pid, 0), "the call returned while its background child still runs")
	assert.Equal(t, 0, res.ExitCode)
}

func TestBackgroundProcess(t *testing.T) {
	a := startAgent(t)
	ctx := ctxT(t)
	p, err := a.c.Start(ctx, ExecRequest{Command: "for i in 1 2 3; do echo line$i; echo err$i >&2; sleep 0.05; done; exit 7"})
	require.NoError(t, err)
	assert.True(t, p.Running)
	assert.NotZero(t, p.PID)

	var buf bytes.Buffer
	next, err := a.c.Logs(ctx, p.ID, 0, true, &buf)
	require.NoError(t, err)
	assert.Equal(t, "line1\nerr1\nline2\nerr2\nline3\nerr3\n", buf.String())
	assert.Equal(t, int64(buf.Len()), next)

	done, err := a.c.Wait(ctx, p.ID)
	require.NoError(t, err)
	assert.False(t, done.Running)
	require.NotNil(t, done.ExitCode)
	assert.Equal(t, 7, *done.ExitCode)
	require.NotNil(t, done.Ended)

	buf.Reset()
	next2, err := a.c.Logs(ctx, p.ID, 6, false, &buf)
	require.NoError(t, err)
	assert.Equal(t, "err1\nline2\nerr2\nline3\nerr3\n", buf.String())
	assert.Equal(t, next, next2)

	list, err := a.c.Processes(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, p.ID, list[0].ID)
	assert.False(t, list[0].Running)

	err = a.c.Signal(ctx, p.ID, syscall.SIGTERM)
	e := requireCode(t, err, CodeInvalid)
	assert.Contains(t, e.Message, "already exited with code 7")
	_, err = a.c.Wait(ctx, "p999")
	requireCode(t, err, CodeNotFound)
	_, err = a.c.Logs(ctx, "p999", 0, false, &buf)
	requireCode(t, err, CodeNotFound)

	p, err = a.c.Start(ctx, ExecRequest{Command: "sleep 100"})
	require.NoError(t, err)
	requireCode(t, a.c.Signal(ctx, p.ID, syscall.Signal(0)), CodeInvalid)
	require.NoError(t, a.c.Signal(ctx, p.ID, syscall.SIGKILL))
	_, err = a.c.Wait(ctx, p.ID)
	require.NoError(t, err)
}

func TestBackgroundSignalKillsTheGroup(t *testing.T) {
	a := startAgent(t)
	ctx := ctxT(t)
	p, err := a.c.Start(ctx, ExecRequest{Command: "sleep 100 & echo $!; wait"})
	require.NoError(t, err)
	var child int
	require.Eventually(t, func() bool {
		var buf bytes.Buffer
		a.c.Logs(ctx, p.ID, 0, false, &buf)
		child, _ = strconv.Atoi(strings.TrimSpace(buf.String()))
		return child > 0
	}, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, a.c.Signal(ctx, p.ID, syscall.SIGTERM))
	done, err := a.c.Wait(ctx, p.ID)
	require.NoError(t, err)
	assert.Equal(t, -1, *done.ExitCode)
	require.Eventually(t, func() bool { return processGone(child) }, 5*time.Second, 10*time.Millisecond)
}

func TestBackgroundTimeoutAndFollowCancel(t *testing.T) {
	a := startAgent(t)
	ctx := ctxT(t)
	p, err := a.c.Start(ctx, ExecRequest{Command: "echo hi; sleep 100", TimeoutMs: 200})
	require.NoError(t, err)
	done, err := a.c.Wait(ctx, p.ID)
	require.NoError(t, err)
	assert.Equal(t, -1, *done.ExitCode)

	p, err = a.c.Start(ctx, ExecRequest{Command: "echo hi; sleep 100"})
	require.NoError(t, err)
	fctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	var buf bytes.Buffer
	_, err = a.c.Logs(fctx, p.ID, 0, true, &buf)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, "hi\n", buf.String())
	require.NoError(t, a.c.Signal(ctx, p.ID, syscall.SIGKILL))
}

func TestRingBuffer(t *testing.T) {
	r := newRing(10)
	r.Write([]byte("abcdef"))
	got, off, _, _ := r.read(0)
	assert.Equal(t, "abcdef", string(got))
	assert.Equal(t, int64(0), off)
	r.Write([]byte("ghijkl")) // 12 written, 10 kept
	got, off, _, _ = r.read(0)
	assert.Equal(t, "cdefghijkl", string(got))
	assert.Equal(t, int64(2), off)
	got, off, _, _ = r.read(8)
	assert.Equal(t, "ijkl", string(got))
	assert.Equal(t, int64(8), off)
	r.Write([]byte("0123456789ABC")) // longer than the ring
	got, off, _, _ = r.read(0)
	assert.Equal(t, "3456789ABC", string(got))
	assert.Equal(t, int64(15), off)
	got, _, _, _ = r.read(100)
	assert.Empty(t, got)
}

func TestFinishedProcessesAreBounded(t *testing.T) {
	a := startAgent(t)
	ctx := ctxT(t)
	var last Process
	for i := 0; i < maxFinished+6; i++ {
		p, err := a.c.Start(ctx, ExecRequest{Argv: []string{"true"}})
		require.NoError(t, err)
		_, err = a.c.Wait(ctx, p.ID)
		require.NoError(t, err)
		last = p
	}
	list, err := a.c.Processes(ctx)
	require.NoError(t, err)
	assert.Len(t, list, maxFinished)
	assert.Equal(t, last.ID, list[len(list)-1].ID)
	_, err = a.c.Wait(ctx, "p1")
	requireCode(t, err, CodeNotFound)
}

func TestToUTF8(t *testing.T) {
	assert.Equal(t, "héllo", toUTF8([]byte("héllo"), false))
	assert.Equal(t, "h", toUTF8([]byte("h\xc3"), true), "a rune cut by truncation is dropped")
	assert.Equal(t, "h\uFFFD", toUTF8([]byte("h\xc3"), false))
	assert.Equal(t, "a\uFFFDb", toUTF8([]byte("a\xffb"), true))
}

func readFileString(p string) (string, error) {
	b, err := os.ReadFile(p)
	return string(b), err
}
