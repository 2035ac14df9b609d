package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
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

const sumPattern = `name: calc
cells:
  a: 1
  b:
    value: 2
    schema: {type: integer, minimum: 0}
nodes:
  total: {computed: '${a + b}'}
  double: {computed: '${total * 2}'}
`

const failingPattern = `name: broken
cells:
  a: 1
nodes:
  bad: {computed: '${int("x") + a}'}
  after: {computed: '${bad + 1}'}
`

// writePattern writes a pattern folder and returns its path.
func writePattern(t *testing.T, yaml string) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "pattern.yaml"), []byte(yaml), 0o644))
	return dir
}

// cellbox runs the real binary to completion.
func cellbox(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, testenv.CellboxBinary(t), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	return out.String(), errb.String(), err
}

// runProc is a `cellbox run` in the background; out collects its output.
type runProc struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan error
}

// startRun starts `cellbox run` and returns once its API answers.
func startRun(t *testing.T, args ...string) *runProc {
	t.Helper()
	cmd := exec.Command(testenv.CellboxBinary(t), append([]string{"run"}, args...)...)
	out := &syncBuffer{}
	cmd.Stdout = out
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &runProc{cmd: cmd, out: out, done: make(chan error, 1)}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			out.Write([]byte(sc.Text() + "\n"))
			if strings.Contains(sc.Text(), "API: unix:") {
				close(ready)
			}
		}
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		// Ctrl-C, as a user stops it (its boxes go to sleep); kill it if
		// that does not do within a while.
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-p.done
		}
	})
	select {
	case <-ready:
	case err := <-p.done:
		p.done <- err
		t.Fatalf("cellbox run exited before serving: %v\n%s", err, out.String())
	case <-time.After(time.Minute):
		t.Fatalf("cellbox run did not serve within a minute:\n%s", out.String())
	}
	return p
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestRunOnce(t *testing.T) {
	for _, tc := range []struct {
		name, pattern string
		ok            bool
		stdout        []string
		stderr        []string
	}{
		{"computed", sumPattern, true,
			[]string{"a = 1\nb = 2\ntotal = 3\ndouble = 6\n"},
			[]string{"cell a = 1", "node total = 3"}},
		{"failing", failingPattern, false,
			[]string{"a = 1\n", "bad = null  # error: expression", "after = null  # error: upstream bad failed"},
			[]string{"node bad (computed) failed: expression \"int(\\\"x\\\") + a\"", "node after (computed) failed: upstream bad failed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := t.TempDir()
			out, errOut, err := cellbox(t, "run", writePattern(t, tc.pattern), "--once", "--data", data)
			key, kerr := os.ReadFile(filepath.Join(data, server.KeyFile))
			require.NoError(t, kerr)
			assert.NotContains(t, errOut, strings.TrimSpace(string(key)), "the server key stays out of a --once run's log")
			if tc.ok {
				require.NoError(t, err, errOut)
				assert.Equal(t, tc.stdout[0], out, "stdout holds exactly the final cells")
			} else {
				var ee *exec.ExitError
				require.ErrorAs(t, err, &ee, "a failed node fails the run")
				assert.Equal(t, 1, ee.ExitCode())
				for _, s := range tc.stdout {
					assert.Contains(t, out, s)
				}
			}
			for _, s := range tc.stderr {
				assert.Contains(t, errOut, s)
			}
		})
	}
}

// TestRunOnceStoredFailure: --once fails whenever a node stands failed
// when the run settles, also when an earlier run over the data dir stored
// the failure (the node does not run again: its inputs did not change),
// and says how to run it again; before, the second run exited 0.
func TestRunOnceStoredFailure(t *testing.T) {
	testenv.RequireBwrap(t)
	pattern := writePattern(t, "name: fail\nnodes:\n  x:\n    exec:\n      command: echo out; exit 3\n")
	data := t.TempDir()
	for _, run := range []string{"first", "second"} {
		out, errOut, err := cellbox(t, "run", pattern, "--once", "--data", data, "--backend", "local")
		assert.Equal(t, 1, exitCode(t, err), "%s run: a failed node fails it\nstdout:\n%s\nstderr:\n%s", run, out, errOut)
		assert.Contains(t, out, `"error":"command exited with 3: out"`)
		assert.Contains(t, errOut, "node x (exec) failed: command exited with 3: out", run)
		assert.Contains(t, errOut, "to run it again as it stands: cellbox run "+pattern+" --data "+data+" (without --once), and while that runs: cellbox retry x --data "+data, run)
	}
}

// TestRunOnceEditedPattern: a pattern edited between two runs over one
// data dir starts each changed cell from its new definition and says so;
// a removed node is gone (not shown, not listed), never a stored leftover.
func TestRunOnceEditedPattern(t *testing.T) {
	dir := writePattern(t, "name: edit\ncells:\n  n: 3\nnodes:\n  both: {computed: '${n + 1}'}\n  slow: {computed: '${n * 2}'}\n")
	data := t.TempDir()
	out, errOut, err := cellbox(t, "run", dir, "--once", "--data", data)
	require.NoError(t, err, errOut)
	require.Equal(t, "n = 3\nboth = 4\nslow = 6\n", out)

	require.NoError(t, os.WriteFile(filepath.Join(dir, "pattern.yaml"), []byte(`name: edit
cells:
  n: {value: "3", schema: {type: string}}
  both: {value: 7, schema: {type: integer}}
nodes:
  twice: {computed: '${both * 2}'}
`), 0o644))
	out, errOut, err = cellbox(t, "run", dir, "--once", "--data", data)
	require.NoError(t, err, errOut)
	assert.Equal(t, "n = \"3\"\nboth = 7\ntwice = 14\n", out)
	assert.Contains(t, errOut, "warning: cell both reset: it was the output of a node (computed) and is now an input cell")
	assert.Contains(t, errOut, "warning: cell n reset: its stored value 3 does not satisfy the cell's schema ((root): must be string (got number)): replaced by the initial value")
	assert.NotContains(t, errOut, "slow", "the removed node is not shown as stored")
	out, errOut, err = cellbox(t, "cell", "ls", "--data", data)
	require.NoError(t, err, errOut)
	assert.NotContains(t, out, "slow")
	_, errOut, err = cellbox(t, "cell", "get", "edit/slow", "--data", data)
	assert.Error(t, err)
	assert.Contains(t, errOut, `no cell "slow"`)
}

// TestRunRemovedSandboxNodeLeavesNoBox: a sandbox node removed from the
// pattern between runs takes its box with it (its files stayed on disk,
// and a node of its name added back found them).
func TestRunRemovedSandboxNodeLeavesNoBox(t *testing.T) {
	testenv.RequireBwrap(t)
	dir := writePattern(t, "name: gone\nnodes:\n  box: {sandbox: {}}\n")
	data := t.TempDir()
	t.Cleanup(func() { sandboxtest.RemoveBoxes(t, data) })
	_, errOut, err := cellbox(t, "run", dir, "--once", "--data", data, "--backend", "local")
	require.NoError(t, err, errOut)
	boxes, err := os.ReadDir(filepath.Join(data, "boxes"))
	require.NoError(t, err)
	require.Len(t, boxes, 1, "the node's box sleeps with the runner")

	require.NoError(t, os.WriteFile(filepath.Join(dir, "pattern.yaml"), []byte("name: gone\ncells:\n  n: 1\n"), 0o644))
	_, errOut, err = cellbox(t, "run", dir, "--once", "--data", data, "--backend", "local")
	require.NoError(t, err, errOut)
	boxes, err = os.ReadDir(filepath.Join(data, "boxes"))
	require.NoError(t, err)
	assert.Empty(t, boxes, "the removed node's box is gone: %s", errOut)
}

// A run remembers the cell schemas that passed the metaschema in the data
// dir, so that the next run over it skips that check; a schema that breaks
// the metaschema is refused, run after run, and never remembered.
func TestRunRemembersValidSchemas(t *testing.T) {
	data := t.TempDir()
	pat := writePattern(t, sumPattern)
	cache := filepath.Join(data, server.SchemaCacheFile)
	_, errOut, err := cellbox(t, "run", pat, "--once", "--data", data)
	require.NoError(t, err, errOut)
	first, err := os.ReadFile(cache)
	require.NoError(t, err)
	assert.NotEmpty(t, first)
	out, errOut, err := cellbox(t, "run", pat, "--once", "--data", data)
	require.NoError(t, err, errOut)
	assert.Equal(t, "a = 1\nb = 2\ntotal = 3\ndouble = 6\n", out)
	again, err := os.ReadFile(cache)
	require.NoError(t, err)
	assert.Equal(t, string(first), string(again), "nothing checked or added again")

	bad := writePattern(t, strings.Replace(sumPattern, "type: integer", "type: integr", 1))
	for range 2 {
		_, errOut, err = cellbox(t, "run", bad, "--once", "--data", data)
		require.Error(t, err)
		assert.Contains(t, errOut, "metaschema")
	}
	again, err = os.ReadFile(cache)
	require.NoError(t, err)
	assert.Equal(t, string(first), string(again), "the broken schema is not remembered")
}

func TestRunCellSetGet(t *testing.T) {
	data := t.TempDir()
	pattern := writePattern(t, sumPattern)
	run := startRun(t, pattern, "--data", data)

	out, errOut, err := cellbox(t, "cell", "set", "a", "41", "--data", data)
	require.NoError(t, err, errOut)
	assert.Regexp(t, `^default/calc/a = 41  \(version \d+\)\n$`, out)
	out, errOut, err = cellbox(t, "cell", "get", "total", "--data", data)
	require.NoError(t, err, errOut)
	assert.Equal(t, "43\n", out, "the computed cell was recomputed")
	out, _, err = cellbox(t, "cell", "get", "calc/double", "--data", data)
	require.NoError(t, err)
	assert.Equal(t, "86\n", out)

	for _, tc := range []struct {
		name string
		args []string
		msg  string
	}{
		{"bare word", []string{"cell", "set", "a", "hello"}, `a string needs quotes: '"hello"'`},
		{"schema", []string{"cell", "set", "b", "-1"}, "must be >= 0 (got -1)"},
		{"unknown cell", []string{"cell", "get", "totl"}, `did you mean "total"?`},
		{"node output", []string{"cell", "set", "total", "3"}, "is the output of node total"},
		{"send to a cell", []string{"send", "a", "1"}, "is not a stream"},
		{"watch nothing", []string{"cell", "watch", "totl"}, `no cell or pattern matches "totl"`},
		{"ls nothing", []string{"cell", "ls", "totl"}, `did you mean "total"?`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, errOut, err := cellbox(t, append(tc.args, "--data", data)...)
			require.Error(t, err)
			assert.Contains(t, errOut, tc.msg)
		})
	}

	t.Run("short names", func(t *testing.T) {
		// As the example READMEs write them: a cell's name alone.
		out, errOut, err := cellbox(t, "cell", "ls", "total", "--data", data)
		require.NoError(t, err, errOut)
		assert.Equal(t, "default/calc/total  43\n", out)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, testenv.CellboxBinary(t), "cell", "watch", "double", "--data", data)
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
		lines := bufio.NewScanner(stdout)
		require.True(t, lines.Scan(), "the watch of a cell by its name prints its snapshot")
		assert.Regexp(t, `^\d+ default/calc/double = 86$`, lines.Text())
	})

	t.Run("watch", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, testenv.CellboxBinary(t), "cell", "watch", "calc", "--data", data)
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
		lines := bufio.NewScanner(stdout)
		readUntil := func(want string) {
			for lines.Scan() {
				if strings.HasSuffix(lines.Text(), want) {
					return
				}
			}
			t.Fatalf("watch ended before %q", want)
		}
		readUntil("default/calc/total = 43") // the snapshot
		_, errOut, err := cellbox(t, "cell", "set", "b", "10", "--data", data)
		require.NoError(t, err, errOut)
		readUntil("default/calc/double = 102")
	})

	assert.Contains(t, run.out.String(), "cell a = 41", "the run shows the change")
	assert.Contains(t, run.out.String(), "node double = 86")
	// A big value is cut in the confirmation (it was printed whole).
	big := `[` + strings.Repeat(`"BBBBBBBB",`, 10000) + `1]`
	out, errOut, err = cellbox(t, "cell", "set", "a", big, "--data", data)
	require.NoError(t, err, errOut)
	assert.Regexp(t, `^default/calc/a = \["BBBB.+…  \(version \d+\)\n$`, out)
	assert.Less(t, len(out), 400)
}

func TestRunRestartKeepsValues(t *testing.T) {
	data := t.TempDir()
	pattern := writePattern(t, sumPattern)
	run := startRun(t, pattern, "--data", data)
	_, errOut, err := cellbox(t, "cell", "set", "a", "5", "--data", data)
	require.NoError(t, err, errOut)
	require.NoError(t, run.cmd.Process.Signal(syscall.SIGKILL))
	<-run.done
	run.done <- nil

	// Nothing serves the data dir: reads go to the store, writes are refused.
	out, errOut, err := cellbox(t, "cell", "get", "total", "--data", data)
	require.NoError(t, err, errOut)
	assert.Equal(t, "7\n", out)
	_, errOut, err = cellbox(t, "cell", "set", "a", "6", "--data", data)
	require.Error(t, err)
	assert.Contains(t, errOut, "no cellbox run is serving data dir "+data+"; start one with `cellbox run PATTERN --data "+data+"`")
	_, errOut, err = cellbox(t, "send", "x.run", "{}", "--data", data)
	require.Error(t, err)
	assert.Contains(t, errOut, "no cellbox run is serving")
	out, errOut, err = cellbox(t, "cell", "watch", "calc", "--from", "0", "--data", data)
	require.NoError(t, err, errOut)
	assert.Contains(t, out, " default/calc/a = 1\n", "the stored history replays")
	assert.Regexp(t, `\d+ default/calc/a = 5\n\d+ default/calc/total = 7\n\d+ default/calc/double = 14\n$`, out, "up to the last change, then the watch ends")

	run = startRun(t, pattern, "--data", data)
	out, errOut, err = cellbox(t, "cell", "get", "a", "--data", data)
	require.NoError(t, err, errOut)
	assert.Equal(t, "5\n", out, "the restarted run keeps the cell's value, not the initial one")
	out, _, err = cellbox(t, "cell", "get", "double", "--data", data)
	require.NoError(t, err)
	assert.Equal(t, "14\n", out)
	assert.Contains(t, run.out.String(), "cell a = 5  (stored)")

	// A second run over the same data dir is refused while the first holds it.
	_, errOut, err = cellbox(t, "run", pattern, "--data", data, "--once")
	require.Error(t, err)
	assert.Contains(t, errOut, "data dir "+data+" is in use")

	// Ctrl-C stops cleanly and removes the socket.
	require.NoError(t, run.cmd.Process.Signal(os.Interrupt))
	select {
	case err := <-run.done:
		run.done <- err
		assert.NoError(t, err, run.out.String())
	case <-time.After(30 * time.Second):
		t.Fatal("cellbox run did not stop on SIGINT")
	}
	assert.NoFileExists(t, filepath.Join(data, server.RunSocketFile))
}

func TestGraphCommand(t *testing.T) {
	pattern := writePattern(t, sumPattern)
	for _, tc := range []struct {
		format string
		want   []string
	}{
		{"dot", []string{`digraph "calc" {`, `"a" -> "total";`, `"total" -> "double";`}},
		{"mermaid", []string{"flowchart LR", "c_a --> n_total", "n_total --> n_double"}},
	} {
		t.Run(tc.format, func(t *testing.T) {
			out, errOut, err := cellbox(t, "graph", pattern, "--format", tc.format)
			require.NoError(t, err, errOut)
			for _, w := range tc.want {
				assert.Contains(t, out, w)
			}
		})
	}
	_, errOut, err := cellbox(t, "graph", pattern, "--format", "svg")
	require.Error(t, err)
	assert.Contains(t, errOut, "want dot or mermaid")

	// A folder of patterns: they are named (it said "stat DIR/pattern.yaml:
	// no such file or directory").
	_, errOut, err = cellbox(t, "graph", "../../examples")
	require.Error(t, err)
	assert.Contains(t, errOut, "holds no pattern.yaml); the patterns in it:")
	assert.Contains(t, errOut, "\n  cellbox graph ../../examples/repl\n")
}

// TestServeRuntimeAPI loads a pattern into `cellbox serve` over HTTP and
// reaches it from the CLI through the data dir's socket.
func TestServeRuntimeAPI(t *testing.T) {
	testenv.RequireBwrap(t)
	data := t.TempDir()
	srv := startServe(t, data, "--pool", "0")
	url := srv.url

	ctx := context.Background()
	c := runapi.NewClient(url).WithKey(srv.key)
	in, err := c.Load(ctx, writePattern(t, sumPattern), "", "")
	require.NoError(t, err)
	assert.Equal(t, "calc", in.Name)
	_, err = c.Set(ctx, "a", json.RawMessage(`10`))
	require.NoError(t, err)
	cell, err := c.Get(ctx, "double")
	require.NoError(t, err)
	assert.Equal(t, "24", string(cell.Value))

	out, errOut, err := cellbox(t, "cell", "get", "total", "--data", data)
	require.NoError(t, err, errOut)
	assert.Equal(t, "12\n", out, "the CLI reaches serve over DATA/run.sock")
	out, errOut, err = cellbox(t, "cell", "set", "b", "0", "--server", url, "--data", data) // the key: DATA/server.key
	require.NoError(t, err, errOut)
	assert.Contains(t, out, "default/calc/b = 0")

	// The tool API is still there.
	_, errOut, err = cellbox(t, "tool", "--server", url)
	require.NoError(t, err, errOut)
}

// TestRunSandbox drives a sandbox node of a running pattern from the CLI:
// send commands to its run stream, change the cell bound to one of its
// files, Ctrl-C: the box is put to sleep, not destroyed, and the next run
// finds it again with its files and the node's history.
func TestRunSandbox(t *testing.T) {
	testenv.RequireBwrap(t)
	data := t.TempDir()
	pattern := writePattern(t, `name: repl
cells:
  greeting: hello
nodes:
  box:
    sandbox:
      files:
        /workspace/greeting.txt: ${greeting}
`)
	run := startRun(t, pattern, "--data", data, "--backend", "local")
	history := func() []map[string]any {
		out, errOut, err := cellbox(t, "cell", "get", "box", "--data", data)
		require.NoError(t, err, errOut)
		var v struct{ History []map[string]any }
		require.NoError(t, json.Unmarshal([]byte(out), &v), out)
		return v.History
	}
	send := func(cmd string, n int) map[string]any {
		out, errOut, err := cellbox(t, "send", "box.run", `{"command": "`+cmd+`"}`, "--data", data)
		require.NoError(t, err, errOut)
		assert.Regexp(t, `^sent event \d+ to default/repl/box.run\n$`, out)
		var h []map[string]any
		poll(t, "the command's history entry", func() bool { h = history(); return len(h) >= n })
		return h[n-1]
	}
	entry := send("cat greeting.txt", 1)
	assert.Equal(t, "hello", entry["stdout"])
	assert.EqualValues(t, 0, entry["exit_code"])
	boxes, err := os.ReadDir(filepath.Join(data, "boxes"))
	require.NoError(t, err)
	assert.NotEmpty(t, boxes, "the box lives while the pattern runs")

	_, errOut, err := cellbox(t, "cell", "set", "greeting", `"bye"`, "--data", data)
	require.NoError(t, err, errOut)
	poll(t, "the cell change to rewrite the file in the box", func() bool {
		return send("cat greeting.txt", len(history())+1)["stdout"] == "bye"
	})

	send("echo kept > kept.txt", len(history())+1)
	before := len(history())

	require.NoError(t, run.cmd.Process.Signal(os.Interrupt))
	select {
	case err := <-run.done:
		run.done <- err
		require.NoError(t, err, run.out.String())
	case <-time.After(30 * time.Second):
		t.Fatal("cellbox run did not stop on SIGINT")
	}
	assert.Contains(t, run.out.String(), "node box handled a run event")
	boxes, err = os.ReadDir(filepath.Join(data, "boxes"))
	require.NoError(t, err)
	assert.NotEmpty(t, boxes, "Ctrl-C keeps the box")
	assert.Empty(t, boxProcesses(t, data), "but no process of it runs on")

	startRun(t, pattern, "--data", data, "--backend", "local")
	entry = send("cat kept.txt", before+1)
	assert.Equal(t, "kept\n", entry["stdout"], "the restarted run found the box with its files")
	assert.Len(t, history(), before+1, "and the node kept its history")
}

// boxProcesses lists the processes that run a local box of data (their
// command line names a box directory of DATA/local).
func boxProcesses(t *testing.T, data string) []string {
	t.Helper()
	dirs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	require.NoError(t, err)
	var found []string
	for _, f := range dirs {
		b, err := os.ReadFile(f)
		if err == nil && strings.Contains(string(b), filepath.Join(data, "local")) {
			found = append(found, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return found
}

// TestRunPreview opens the preview URL a sandbox node publishes for its
// port in a browser's stead: `cellbox run` serves it (and the tool API and
// the runtime API) on the address its banner prints, and the URL answers
// once a server listens in the box.
func TestRunPreview(t *testing.T) {
	testenv.RequireBwrap(t)
	data := t.TempDir()
	pattern := writePattern(t, `name: site
nodes:
  web:
    sandbox:
      ports: [8000, 8001]
      start: {command: cd /workspace/site && python3 -m http.server 8000 --bind 127.0.0.1, port: 8000}
      files:
        /workspace/site/index.html: hello through the preview
`)
	run := startRun(t, pattern, "--data", data, "--backend", "local")
	m := regexp.MustCompile(`API: (http://127\.0\.0\.1:(\d+)) `).FindStringSubmatch(run.out.String())
	require.NotNil(t, m, "the banner names the HTTP address:\n%s", run.out.String())
	base, port := m[1], m[2]

	var out struct {
		Status   string
		Previews map[string]struct{ URL, HostURL string }
	}
	poll(t, "the preview URL in the node's output", func() bool {
		stdout, errOut, err := cellbox(t, "cell", "get", "web", "--data", data)
		require.NoError(t, err, errOut)
		require.NoError(t, json.Unmarshal([]byte(stdout), &out), stdout)
		return out.Previews["8000"].URL != ""
	})
	u := out.Previews["8000"].URL
	assert.Regexp(t, `^http://p[0-9a-f]{32}\.localhost:`+port+`/$`, u, "a preview has an origin of its own")
	poll(t, "the live view to show the URL", func() bool {
		return strings.Contains(run.out.String(), "node web preview of port 8000: "+u)
	})

	get := func(url string) (int, string) {
		resp, body := testenv.HTTPGet(t, url, "")
		return resp.StatusCode, body
	}
	status, _ := get(out.Previews["8001"].URL)
	assert.Equal(t, http.StatusBadGateway, status, "nothing listens on 8001 in the box")
	poll(t, "the server in the box to answer through the preview URL", func() bool {
		status, body := get(u)
		return status == http.StatusOK && body == "hello through the preview"
	})

	// The same address serves the tool API and the runtime API.
	status, body := get(base + "/v1/tools")
	assert.Equal(t, http.StatusOK, status)
	assert.Contains(t, body, `"browse"`)
	cell, err := runapi.NewClient(base).WithKey(readServerKey(t, data)).Get(context.Background(), "web")
	require.NoError(t, err)
	assert.Contains(t, string(cell.Value), u)
}

// readServerKey reads the server key a server made in data.
func readServerKey(t *testing.T, data string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(data, "server.key"))
	require.NoError(t, err)
	return strings.TrimSpace(string(b))
}

// poll calls cond (in the test's goroutine, so it may use require) until it
// holds, for at most 30 seconds.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestRunServerState: the live view of `cellbox run` says how a sandbox
// node's server (start:) goes: starting, then ready once its port answers.
func TestRunServerState(t *testing.T) {
	testenv.RequireBwrap(t)
	data := t.TempDir()
	pattern := writePattern(t, `name: served
nodes:
  web:
    sandbox:
      start: {command: "python3 -m http.server 8001 --bind 127.0.0.1", port: 8001}
`)
	run := startRun(t, pattern, "--data", data, "--backend", "local")
	poll(t, "the live view to show the server ready", func() bool {
		return strings.Contains(run.out.String(), "node web server (python3 -m http.server 8001 --bind 127.0.0.1): ready")
	})
	assert.Contains(t, run.out.String(), "node web server (python3 -m http.server 8001 --bind 127.0.0.1): starting")
}

// TestRunOpensNoBackendWithoutBoxes: a run whose nodes need no box never
// opens (or probes) its backend — before, `run` opened it first thing,
// so an unreachable Docker Engine failed a pattern of computed cells and
// the local backend set up its directory for nothing. Once a node needs
// a box, an unreachable backend is that node's error.
func TestRunOpensNoBackendWithoutBoxes(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
	data := t.TempDir()
	out, errOut, err := cellbox(t, "run", writePattern(t, sumPattern), "--once", "--data", data, "--backend", "docker")
	require.NoError(t, err, errOut)
	assert.Equal(t, "a = 1\nb = 2\ntotal = 3\ndouble = 6\n", out)

	_, errOut, err = cellbox(t, "run", writePattern(t, sumPattern), "--once", "--data", data, "--backend", "local")
	require.NoError(t, err, errOut)
	assert.NoDirExists(t, filepath.Join(data, "local"), "the local backend was not set up")

	out, errOut, err = cellbox(t, "run", writePattern(t, "name: one\nnodes:\n  stage:\n    exec:\n      command: \"true\"\n"), "--once", "--data", t.TempDir(), "--backend", "docker")
	require.Error(t, err, "a stage needs the backend")
	assert.Contains(t, out+errOut, "start the sandbox service")
}

// TestRunBeginsBoxesOverANewDataDir: over a new data dir, where every
// stage runs, the boxes of a run's exec stages are begun while the
// pattern loads, and the first stage takes one of them (run.log says
// "from warm pool"); over a data dir that has run before, the first stage
// that reruns makes its own (a run with nothing to do must make none). A
// pattern whose stage never runs (its input failed) leaves no box behind
// when --once exits.
func TestRunBeginsBoxesOverANewDataDir(t *testing.T) {
	testenv.RequireBwrap(t)
	data := t.TempDir()
	name := "begin" + randomHex(t)
	yaml := func(word string) string {
		return "name: " + name + "\nnodes:\n  head:\n    exec:\n      command: echo " + word +
			"\n  tail:\n    exec:\n      command: echo ${trim(head.result.stdout)} again\n"
	}
	pattern := writePattern(t, yaml("one"))
	log := func() string {
		b, err := os.ReadFile(filepath.Join(data, "run.log"))
		require.NoError(t, err)
		return string(b)
	}
	out, errOut, err := cellbox(t, "run", pattern, "--once", "--data", data, "--backend", "local")
	require.NoError(t, err, errOut)
	assert.Contains(t, out, `one again`)
	assert.Contains(t, log(), `msg="box created from warm pool" session=`)
	assert.Regexp(t, `msg="box created from warm pool" session=\S+ name=exec-`+name+`\.head-1 `, log(), "the first stage took a box begun while the pattern loaded")

	require.NoError(t, os.WriteFile(filepath.Join(pattern, "pattern.yaml"), []byte(yaml("two")), 0o644))
	before := len(log())
	out, errOut, err = cellbox(t, "run", pattern, "--once", "--data", data, "--backend", "local")
	require.NoError(t, err, errOut)
	assert.Contains(t, out, `two again`)
	second := log()[before:]
	assert.Regexp(t, `msg="box created" session=\S+ name=exec-`+name+`\.head-\d+ `, second, "a data dir that ran before: the first stage makes its box")
	assert.Empty(t, dataDirBoxes(t, "local", data), "no box is left")

	fresh := t.TempDir()
	_, errOut, err = cellbox(t, "run", writePattern(t, "name: never"+randomHex(t)+"\nnodes:\n  bad: {computed: '${int(\"x\")}'}\n  stage:\n    exec:\n      command: echo ${bad}\n"),
		"--once", "--data", fresh, "--backend", "local")
	require.Error(t, err, "the failed node fails the run")
	assert.NotContains(t, errOut, "panic")
	assert.Empty(t, dataDirBoxes(t, "local", fresh), "the boxes begun for a stage that never ran are removed")
	entries, err := os.ReadDir(filepath.Join(fresh, "boxes"))
	if err == nil {
		assert.Empty(t, entries, "no box directory is left")
	}
}
