package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/runtime"
	"github.com/cellbox/cellbox/server"
)

// exitCode is the exit status of a finished cellbox (0 for nil).
func exitCode(t *testing.T, err error) int {
	t.Helper()
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	return ee.ExitCode()
}

// TestCLIFirstSteps runs the commands a newcomer types first.
func TestCLIFirstSteps(t *testing.T) {
	for _, tc := range []struct {
		name           string
		args           []string
		code           int
		stdout, stderr []string // each contained
	}{
		{"--help", []string{"--help"}, 0, []string{"usage: cellbox COMMAND", "  run ", "  version "}, nil},
		{"help", []string{"help"}, 0, []string{"usage: cellbox COMMAND"}, nil},
		{"bare", nil, 2, nil, []string{"usage: cellbox COMMAND", "  run "}},
		{"version", []string{"version"}, 0, []string{"cellbox ", "commit", "go1."}, nil},
		{"--version", []string{"--version"}, 0, []string{"cellbox ", "commit", "go1."}, nil},
		{"typo", []string{"runn"}, 2, nil, []string{`unknown command "runn" (did you mean "run"?)`}},
		{"chat with no turns", []string{"chat", "--model", "m", "--max-turns", "0"}, 1, nil, []string{"--max-turns 0: give at least 1"}},
		{"run a folder of patterns", []string{"run", "../../examples"}, 1, nil,
			[]string{"../../examples is not a pattern (it holds no pattern.yaml); the patterns in it:", "\n  cellbox run ../../examples/repl\n"}},
		{"chat with a bad box name", []string{"chat", "--model", "m", "--box", "../x"}, 1, nil, []string{`--box: invalid sandbox name "../x"`}},
		{"no images", []string{"image", "ls", "--images", "/nonexistent"}, 0, nil,
			[]string{"no images built in /nonexistent (build one: cellbox image build NAME --images /nonexistent"}},
		{"a server that is not there", []string{"cell", "get", "x", "--server", "http://127.0.0.1:1"}, 1, nil,
			[]string{"nothing answers at http://127.0.0.1:1 (start `cellbox run PATTERN` or `cellbox serve` there, or give --data DIR"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, err := cellbox(t, tc.args...)
			assert.Equal(t, tc.code, exitCode(t, err), "stdout:\n%s\nstderr:\n%s", out, errOut)
			for _, s := range tc.stdout {
				assert.Contains(t, out, s)
			}
			for _, s := range tc.stderr {
				assert.Contains(t, errOut, s)
			}
		})
	}
}

// TestRowTimeCached: a node whose result came from the memo cache did not
// run now; its row says so instead of the time of the run that made it.
func TestRowTimeCached(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name  string
		state string
		nv    nodeView
		last  time.Duration // NodeInfo.Last: the run that made the result
		want  string
	}{
		{"cached", "done", nodeView{note: "cached"}, 3 * time.Second, "cached"},
		{"ran", "done", nodeView{last: 2 * time.Second}, 2 * time.Second, "2s"},
		{"running", "running", nodeView{started: now.Add(-5 * time.Second)}, 0, "5s…"},
		{"resumed, not run yet", "done", nodeView{}, 4 * time.Second, "4s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, rowTime(tc.state, &tc.nv, runtime.NodeInfo{Last: tc.last}, now))
		})
	}
}

// TestViewStateWaiting: an exec node that has not run (its inputs are not
// there yet) is "waiting" in the table, as on the page, not "done".
func TestViewStateWaiting(t *testing.T) {
	v := &view{nodes: map[string]*nodeView{}, cells: map[string]cells.Cell{}}
	info := runtime.NodeInfo{State: runtime.Idle, Shape: "async"}
	for _, tc := range []struct{ value, want string }{
		{`{"pending":false,"result":null,"error":null}`, "waiting"},
		{`{"pending":true,"result":null,"error":null}`, "pending"},
		{`{"pending":false,"result":{"exit_code":0},"error":null}`, "done"},
	} {
		v.cells["x"] = cells.Cell{Value: json.RawMessage(tc.value)}
		assert.Equal(t, tc.want, v.state(info, true, "x"), tc.value)
	}
	v.cells["c"] = cells.Cell{Value: json.RawMessage(`null`)}
	assert.Equal(t, "done", v.state(runtime.NodeInfo{State: runtime.Idle, Shape: "compute"}, true, "c"))
}

// TestStop stops a pattern of a running `cellbox run` from the CLI: its
// box is destroyed (no directory, no process left) and the command names it.
func TestStop(t *testing.T) {
	testenv.RequireBwrap(t)
	data := t.TempDir()
	pattern := writePattern(t, `name: repl
nodes:
  box:
    sandbox: {}
`)
	startRun(t, pattern, "--data", data, "--backend", "local")
	poll(t, "the box to run", func() bool {
		out, _, err := cellbox(t, "cell", "get", "box", "--data", data)
		return err == nil && strings.Contains(out, `"status": "running"`)
	})
	boxes, err := os.ReadDir(filepath.Join(data, "boxes"))
	require.NoError(t, err)
	require.NotEmpty(t, boxes)

	_, errOut, err := cellbox(t, "stop", "nope", "--data", data)
	require.Error(t, err)
	assert.Contains(t, errOut, "repl", "an unknown name: the error names the loaded patterns")

	out, errOut, err := cellbox(t, "stop", "repl", "--data", data)
	require.NoError(t, err, errOut)
	assert.Regexp(t, `(?m)^stopped pattern default/repl\ndestroyed its boxes: sandbox-\S+ \(node box\)$`, out)
	boxes, err = os.ReadDir(filepath.Join(data, "boxes"))
	require.NoError(t, err)
	assert.Empty(t, boxes, "the box's directory is gone")
	assert.Empty(t, boxProcesses(t, data), "and no process of it runs on")
	_, errOut, err = cellbox(t, "stop", "repl", "--data", data)
	require.Error(t, err, "stopped once: not loaded any more")
	assert.Contains(t, errOut, "repl")
}

// TestImagesShared: an image built once (into the default data dir's
// images) serves a run over any other data dir, as Docker's images serve
// every container.
func TestImagesShared(t *testing.T) {
	testenv.RequireBwrap(t)
	home := t.TempDir()
	t.Setenv("CELLBOX_DATA", home) // the default data dir of the processes below
	t.Setenv(server.ImagesEnv, "")
	makeRootfs(t, filepath.Join(home, "images", "tiny", "rootfs"))
	out, errOut, err := cellbox(t, "run", writePattern(t, `name: shared
nodes:
  job:
    exec:
      image: cellbox/tiny
      command: echo from the shared image
`), "--once", "--backend", "local", "--data", t.TempDir())
	require.NoError(t, err, errOut)
	assert.Contains(t, out, `"stdout":"from the shared image\n"`)
}

// TestImageRebuiltRunsAgain: under `cellbox run`, an exec node's memo
// key holds the build of its image, so a stage whose image was rebuilt
// under the same name runs again rather than answering from the memo
// (before, the key held the image's name alone under run and serve: the
// second run printed the first build's answer).
func TestImageRebuiltRunsAgain(t *testing.T) {
	testenv.RequireBwrap(t)
	home := t.TempDir()
	t.Setenv("CELLBOX_DATA", home)
	t.Setenv(server.ImagesEnv, "")
	rootfs := filepath.Join(home, "images", "tiny", "rootfs")
	build := func(id string) {
		next := rootfs + ".new"
		makeRootfs(t, next)
		require.NoError(t, os.WriteFile(filepath.Join(next, "build-id"), []byte(id+"\n"), 0o644))
		require.NoError(t, os.RemoveAll(rootfs))
		require.NoError(t, os.Rename(next, rootfs)) // as a build puts a new rootfs in place
	}
	pattern := writePattern(t, `name: rebuilt
nodes:
  job:
    exec:
      image: cellbox/tiny
      command: read id < /build-id; echo "build $id"
`)
	data := t.TempDir()
	run := func() string {
		out, errOut, err := cellbox(t, "run", pattern, "--once", "--backend", "local", "--data", data)
		require.NoError(t, err, errOut)
		return out
	}
	build("one")
	assert.Contains(t, run(), `"stdout":"build one\n"`)
	build("two")
	out := run()
	assert.Contains(t, out, `"stdout":"build two\n"`, "the stage runs again in the rebuilt image")
	assert.NotContains(t, out, "build one")
}

// TestBoxesRunTheAgentBinary: boxes run cellbox-agent (the agent alone,
// built beside cellbox by the test harness as by the README) when both
// binaries are of one source; cellbox itself when the agent beside it is
// older than a build together allows (cellbox rebuilt alone since: the
// agent may be of other code).
func TestBoxesRunTheAgentBinary(t *testing.T) {
	testenv.RequireBwrap(t)
	pattern := writePattern(t, "name: agentbin\nnodes:\n  job:\n    exec:\n      command: /.cellbox/cellbox version\n      cache: false\n")
	run := func() string {
		out, errOut, err := cellbox(t, "run", pattern, "--once", "--backend", "local", "--data", t.TempDir())
		require.NoError(t, err, errOut)
		return out
	}
	assert.Contains(t, run(), `"stdout":"cellbox-agent (devel)`, "boxes run cellbox-agent")

	agentBin := filepath.Join(filepath.Dir(testenv.CellboxBinary(t)), server.AgentName)
	fi, err := os.Stat(agentBin)
	require.NoError(t, err)
	require.NoError(t, os.Chtimes(agentBin, fi.ModTime(), fi.ModTime().Add(-time.Hour)))
	t.Cleanup(func() { os.Chtimes(agentBin, fi.ModTime(), fi.ModTime()) })
	assert.Contains(t, run(), `"stdout":"cellbox (devel)`, "an agent older than its cellbox is not run")
}

// TestMissingImageHintDocker: a box whose cellbox image the engine lacks,
// one that `cellbox image build` does not make, fails saying which it
// makes (it proposed `cellbox image build NAME`, which was then refused).
func TestMissingImageHintDocker(t *testing.T) {
	testenv.RequireDocker(t)
	name := "missing" + randomHex(t)
	t.Cleanup(func() { removeContainers(t, name) })
	out, errOut, err := cellbox(t, "run", writePattern(t, `name: `+name+`
nodes:
  job:
    exec:
      image: cellbox/`+name+`
      command: echo never
`), "--once", "--backend", "docker", "--data", t.TempDir())
	require.Error(t, err)
	assert.Contains(t, out+errOut, "`cellbox image build` makes only cellbox/base, cellbox/node, cellbox/python; load cellbox/"+name+" into the engine")
	assert.NotContains(t, out+errOut, "cellbox image build "+name)
}

// TestBadBackend: the commands that run boxes refuse a --backend they do
// not know before doing anything; before, cellbox run started, every exec
// node failed to open the backend and those failures were stored (a later
// run with the right backend ran none of them again).
func TestBadBackend(t *testing.T) {
	pattern := writePattern(t, "name: fail\nnodes:\n  x:\n    exec:\n      command: echo hi\n")
	for _, args := range [][]string{
		{"run", pattern, "--once"},
		{"serve"},
		{"mcp"},
	} {
		t.Run(args[0], func(t *testing.T) {
			data := filepath.Join(t.TempDir(), "data")
			out, errOut, err := cellbox(t, append(args, "--backend", "bogus", "--data", data)...)
			assert.Equal(t, 1, exitCode(t, err), "stdout:\n%s\nstderr:\n%s", out, errOut)
			assert.Contains(t, errOut, `cellbox `+args[0]+`: invalid value "bogus" for flag -backend: unknown backend "bogus": want docker, docker-remote, kubernetes, local or auto`)
			assert.NoDirExists(t, data, "nothing was done")
		})
	}
}

// TestHelpShowsNoSecrets: the help of every command and subcommand, and
// the usage a wrong flag prints, name the environment variables a flag
// defaults to, never their values (help lands in logs), and say a flag's
// default once; before, -token showed CELLBOX_TOKEN's value and run's
// -addr had "(default: a free port on 127.0.0.1) (default "127.0.0.1:0")".
func TestHelpShowsNoSecrets(t *testing.T) {
	secrets := map[string]string{
		"CELLBOX_TOKEN":   "tok-secret-1",
		"CELLBOX_KEY":     "key-secret-2",
		"CELLBOX_SESSION": "s-secret-3",
		"CELLBOX_SERVER":  "http://user:pw-secret-4@127.0.0.1:1",
	}
	for k, v := range secrets {
		t.Setenv(k, v)
	}
	testenv.BenchBinary(t) // beside cellbox: `cellbox bench` runs it
	runs := [][]string{{"tool", "--bogus"}, {"mcp", "--nope"}}
	for _, name := range commandNames() {
		runs = append(runs, []string{name, "--help"})
	}
	for _, sub := range []string{"cell get", "cell set", "cell watch", "cell ls", "session new", "session rm",
		"image build", "image ls", "bench boxes", "bench pipeline", "bench runtime"} {
		runs = append(runs, append(strings.Fields(sub), "--help"))
	}
	for _, args := range runs {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			out, errOut, _ := cellbox(t, args...)
			all := out + errOut
			for k, v := range secrets {
				assert.NotContains(t, all, v, "the value of %s", k)
			}
			// A flag's entry: "  -name type" and its indented help lines.
			for _, entry := range strings.Split(all, "\n  -") {
				assert.LessOrEqual(t, strings.Count(entry, "(default"), 1, "a default said twice:\n  -%s", entry)
			}
		})
	}
	out, errOut, _ := cellbox(t, "tool", "--help")
	assert.Contains(t, out+errOut, "session token (default: $CELLBOX_TOKEN)")
	assert.Contains(t, out+errOut, "server URL (default: $CELLBOX_SERVER, else http://127.0.0.1:7077)")
}

// TestBenchRunsCellboxBench: `cellbox bench` runs cellbox-bench, which is
// not part of the agent binary, from beside it, with the same arguments;
// without one there it says how to build it.
func TestBenchRunsCellboxBench(t *testing.T) {
	testenv.BenchBinary(t)
	out, errOut, err := cellbox(t, "bench", "disks")
	assert.Equal(t, 1, exitCode(t, err), "stdout:\n%s\nstderr:\n%s", out, errOut)
	assert.Contains(t, errOut, `cellbox-bench: unknown subcommand "disks": want boxes, pipeline, runtime or cluster`)

	alone := filepath.Join(t.TempDir(), "cellbox")
	data, err := os.ReadFile(testenv.CellboxBinary(t))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(alone, data, 0o755))
	outb, err := exec.Command(alone, "bench", "boxes").CombinedOutput()
	assert.Equal(t, 1, exitCode(t, err), "%s", outb)
	assert.Contains(t, string(outb), "cellbox bench: the benchmarks are the binary cellbox-bench, and there is none beside "+alone+": build it there (CGO_ENABLED=0 go build -o "+filepath.Join(filepath.Dir(alone), "cellbox-bench")+" ./cmd/cellbox-bench)")
}
