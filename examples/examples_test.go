// Package examples_test checks the example patterns the way a user runs
// them: each loads and compiles, and runs in real boxes (bubblewrap) with the
// results a user would look at.
package examples_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	osexec "os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/builtins"
	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/patterns"
	"github.com/cellbox/cellbox/runtime"
	"github.com/cellbox/cellbox/sandbox/httpapi"
	"github.com/cellbox/cellbox/sandbox/image"
	"github.com/cellbox/cellbox/sandbox/sandboxtest"
	"github.com/cellbox/cellbox/sandboxclient"
)

// TestExamplesLoad: every example loads, and its graph is the one its README
// describes (which node reads what decides what reruns).
func TestExamplesLoad(t *testing.T) {
	tests := []struct {
		dir   string
		cells []string
		reads map[string][]string // node -> what it reads
	}{
		{"csv-pipeline", []string{"raw", "threshold"}, map[string][]string{
			"min_revenue": {"threshold"},
			"clean":       {"raw"},
			"keep":        {"clean", "min_revenue"},
			"summarize":   {"keep"},
			"summary":     {"summarize"},
			"report":      {"summary"},
		}},
		{"python-runner", []string{"code", "stdin", "args"}, map[string][]string{
			"run":    {"args", "code", "stdin"},
			"output": {"run"},
		}},
		{"typescript", []string{"main_ts", "shapes_ts"}, map[string][]string{
			"compile":     {"main_ts", "shapes_ts"},
			"diagnostics": {"compile"},
			"main_js":     {"compile"},
			"run":         {"compile"},
			"output":      {"run"},
		}},
		{"repl", nil, map[string][]string{
			"repl":        nil,
			"last_output": {"repl"},
			"commands":    {"repl"},
			"notes":       {"repl"},
		}},
		{"dev-server", []string{"config"}, map[string][]string{
			"web":         {"config"},
			"last_output": {"web"},
			"log":         {"web"},
		}},
		{"coding-agent", []string{"task", "model"}, map[string][]string{
			"workspace":  nil,
			"agent":      {"model", "task", "workspace"},
			"answer":     {"agent"},
			"code":       {"workspace"},
			"tool_calls": {"workspace"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.dir, func(t *testing.T) {
			p := load(t, tt.dir)
			assert.Equal(t, tt.dir, p.Name, "the pattern is named after its folder")
			var cellNames []string
			for _, c := range p.Cells {
				cellNames = append(cellNames, c.Name)
			}
			assert.Equal(t, tt.cells, cellNames)
			reads := map[string][]string{}
			for _, n := range p.Nodes {
				reads[n.Name] = n.Reads
			}
			assert.Equal(t, tt.reads, reads)

			readme, err := os.ReadFile(filepath.Join(tt.dir, "README.md"))
			require.NoError(t, err, "every example has a README")
			assert.Contains(t, string(readme), "cellbox run examples/"+tt.dir, "the README says how to run it")
		})
	}
}

// TestExamplesCompile: every example compiles onto the runtime.
func TestExamplesCompile(t *testing.T) {
	// Compiling binds exec and sandbox nodes to a client; nothing calls it.
	env := builtins.Env{Client: sandboxclient.New("http://127.0.0.1:1", "no-session", "no-token")}
	for _, dir := range []string{"csv-pipeline", "python-runner", "typescript", "repl", "dev-server", "coding-agent"} {
		t.Run(dir, func(t *testing.T) {
			rp, err := patterns.Compile(load(t, dir), env)
			require.NoError(t, err)
			assert.Equal(t, dir, rp.Name)
			assert.Len(t, rp.Nodes, len(load(t, dir).Nodes))
		})
	}
}

func TestPythonRunner(t *testing.T) {
	w := newWorld(t, "")
	in := w.load(load(t, "python-runner"))
	in.wait()
	out := in.str("output")
	assert.True(t, strings.HasPrefix(out, "11 words, args ['--verbose']\n"), "output: %q", out)
	assert.Contains(t, out, "  3 the\n")

	// Edit the code cell: the program reruns, in a new box.
	in.set("code", "import sys\nprint('v2 read', len(sys.stdin.read().split()), 'words')\n")
	in.wait()
	assert.Equal(t, "v2 read 11 words\n", in.str("output"))

	// Edit stdin and args: it reruns with them.
	in.set("stdin", "a b c\n")
	in.set("args", "-x 'two words'")
	in.set("code", "import sys\nprint(sys.argv[1:], sys.stdin.read().split())\n")
	in.wait()
	assert.Equal(t, "['-x', 'two words'] ['a', 'b', 'c']\n", in.str("output"))

	// A program that fails: the error names the exit code and the last
	// line of stderr; what it printed is kept.
	in.set("code", "print('before')\n1/0\n")
	in.wait()
	run := in.exec("run")
	require.NotNil(t, run.Error)
	assert.Contains(t, *run.Error, "exited with 1")
	assert.Contains(t, *run.Error, "ZeroDivisionError: division by zero")
	require.NotNil(t, run.Result, "a failed run keeps what it printed")
	assert.Contains(t, run.Result.Stderr, "Traceback")
	assert.Equal(t, "before\n", in.str("output"))

	// Back to the original program: served from the cache, no box.
	before := w.be.boxes("exec-")
	m := in.mark()
	in.set("code", "import sys\nprint(sys.argv[1:], sys.stdin.read().split())\n")
	in.wait()
	assert.Equal(t, []runtime.StatusKind{runtime.Cached}, in.since(m)["run"])
	assert.Equal(t, before, w.be.boxes("exec-"), "a cache hit starts no box")
	assert.Equal(t, "['-x', 'two words'] ['a', 'b', 'c']\n", in.str("output"))
}

// csvReport is the report line of csv-pipeline for each threshold (checked
// against the scripts run by hand; see the README).
var csvReport = map[float64]string{
	50:  "13 sales, 1727.25 in all (smallest 50)",
	100: "7 sales, 1304.83 in all (smallest 119.94)",
	80:  "8 sales, 1404.78 in all (smallest 99.95)",
}

// TestCSVPipeline is the README's main job and the "done means".
func TestCSVPipeline(t *testing.T) {
	w := newWorld(t, "")
	in := w.load(load(t, "csv-pipeline"))
	in.wait()
	require.Equal(t, csvReport[50], in.str("report"))
	for _, stage := range []string{"clean", "keep", "summarize"} {
		assert.Equal(t, 1, in.count(stage, runtime.Finished), "%s ran once", stage)
		assert.Equal(t, 1, w.be.boxes("exec-csv-pipeline."+stage+"-"), "%s started one box", stage)
	}
	clean := in.exec("clean")
	require.NotNil(t, clean.Result)
	assert.Equal(t, "clean: kept 17 rows, dropped 3\n", clean.Result.Stdout)
	summary := in.exec("summarize").Result.Files["/workspace/summary.json"]
	assert.Equal(t, map[string]any{"sales": 4.0, "revenue": 584.95}, summary.(map[string]any)["by_region"].(map[string]any)["East"],
		"summary.json comes back parsed")

	step(t, w, "threshold change reruns only downstream", func(t *testing.T) {
		m := in.mark()
		in.set("threshold", 100)
		in.wait()
		got := in.since(m)
		assert.NotContains(t, got, "clean", "clean does not read the threshold")
		assert.Equal(t, []runtime.StatusKind{runtime.Started, runtime.Finished}, got["keep"])
		assert.Equal(t, []runtime.StatusKind{runtime.Started, runtime.Finished}, got["summarize"])
		assert.Equal(t, 1, w.be.boxes("exec-csv-pipeline.clean-"))
		assert.Equal(t, csvReport[100], in.str("report"))
	})

	step(t, w, "change back is served from the cache", func(t *testing.T) {
		boxes := w.be.boxes("")
		m := in.mark()
		in.set("threshold", 50)
		in.wait()
		got := in.since(m)
		assert.Equal(t, []runtime.StatusKind{runtime.Cached}, got["keep"])
		assert.Equal(t, []runtime.StatusKind{runtime.Cached}, got["summarize"])
		assert.Equal(t, boxes, w.be.boxes(""), "no box started")
		assert.Equal(t, csvReport[50], in.str("report"))
	})

	step(t, w, "a change below a cent changes nothing downstream", func(t *testing.T) {
		m := in.mark()
		in.set("threshold", 50.001)
		in.wait()
		got := in.since(m)
		for _, n := range []string{"clean", "keep", "summarize", "report"} {
			assert.NotContains(t, got, n)
		}
		assert.Equal(t, csvReport[50], in.str("report"))
	})

	step(t, w, "two quick changes abort the first run", func(t *testing.T) {
		from := w.store.Version()
		m := in.mark()
		in.set("threshold", 70)
		in.set("threshold", 80)
		in.wait()
		got := in.since(m)
		assert.Equal(t, 1, countKind(got["keep"], runtime.Aborted), "keep: %v", got["keep"])
		assert.Equal(t, 1, countKind(got["keep"], runtime.Finished), "keep: %v", got["keep"])
		assert.Equal(t, []runtime.StatusKind{runtime.Started, runtime.Finished}, got["summarize"], "summarize ran for 80 only")
		assert.Equal(t, csvReport[80], in.str("report"))
		for _, v := range in.history("keep", from) {
			assert.NotContains(t, string(v), ">= 70", "the aborted run's result was never written")
		}
		for _, v := range in.history("report", from) {
			assert.NotContains(t, string(v), "10 sales", "70 would keep 10 sales")
		}
	})
}

func countKind(ks []runtime.StatusKind, k runtime.StatusKind) int {
	n := 0
	for _, x := range ks {
		if x == k {
			n++
		}
	}
	return n
}

// history returns every value the cell took in commits after version from
// (the watch replays them, then follows live: it is read until it is quiet).
func (in *instance) history(name string, from uint64) []json.RawMessage {
	t := in.w.t
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr := in.addr(name)
	ch, err := in.w.store.Watch(ctx, addr.String(), from)
	require.NoError(t, err)
	var out []json.RawMessage
	for {
		select {
		case b := <-ch:
			require.False(t, b.Snapshot, "the change log reaches back to version %d", from)
			for _, c := range b.Changes {
				if c.Cell.Addr == addr {
					out = append(out, c.Cell.Value)
				}
			}
		case <-time.After(300 * time.Millisecond):
			return out
		}
	}
}

// TestCSVPipelineResume: a runtime shut down while a stage runs resumes on
// restart, rerunning only the stage that was in flight.
func TestCSVPipelineResume(t *testing.T) {
	w := newWorld(t, "")
	p := load(t, "csv-pipeline")
	first := w.load(p)
	first.wait()
	require.Equal(t, csvReport[50], first.str("report"))

	first.set("threshold", 100)
	first.waitStatus("summarize", runtime.Started, 2)
	first.close(runtime.Shutdown) // at once, as a dying runner would: summarize stays pending
	assert.Equal(t, 1, first.count("summarize", runtime.Finished), "summarize was stopped mid-run")

	second := w.load(p)
	second.wait()
	assert.Equal(t, csvReport[100], second.str("report"))
	assert.Zero(t, second.count("clean", runtime.Started), "clean is not repeated")
	assert.Zero(t, second.count("keep", runtime.Started), "keep is not repeated")
	assert.Zero(t, second.count("keep", runtime.Cached), "keep had finished: nothing to do")
	assert.Equal(t, 1, second.count("summarize", runtime.Finished))
}

func TestREPL(t *testing.T) {
	w := newWorld(t, "")
	in := w.load(load(t, "repl"))
	in.wait()
	var out sandboxOut
	in.get("repl", &out)
	require.Equal(t, "running", out.Status, "the box is up when the pattern loads: %+v", out)

	in.send("repl", "run", map[string]string{"command": "echo first > notes.txt && echo wrote"})
	in.wait()
	in.send("repl", "run", map[string]string{"command": "cat notes.txt; ls"})
	in.wait()
	in.get("repl", &out)
	require.Len(t, out.History, 2)
	assert.Equal(t, "wrote\n", out.History[0].Stdout)
	assert.Equal(t, 0, out.History[0].ExitCode)
	assert.True(t, strings.HasPrefix(out.History[1].Stdout, "first\n"), "the second command sees the first's file: %q", out.History[1].Stdout)
	assert.Contains(t, out.History[1].Stdout, "session.py", "the input file is in the workspace")
	assert.Equal(t, 2.0, in.num("commands"))
	assert.Equal(t, out.History[1].Stdout, in.str("last_output"))
	eventually(t, 5*time.Second, "the notes cell to follow notes.txt", func() bool { return in.str("notes") == "first\n" })

	// The Python session keeps its variables between commands.
	in.send("repl", "run", map[string]string{"command": `python3 session.py "import math; r = 2"`})
	in.send("repl", "run", map[string]string{"command": `python3 session.py "print(round(math.pi * r ** 2, 3))"`})
	in.wait()
	in.get("repl", &out)
	require.Len(t, out.History, 4)
	assert.Equal(t, "12.566\n", out.History[3].Stdout, "stderr: %s", out.History[3].Stderr)
	assert.Equal(t, "12.566\n", in.str("last_output"))

	// A failing command is history, not a failure.
	in.send("repl", "run", map[string]string{"command": "ls /nonexistent"})
	in.wait()
	in.get("repl", &out)
	require.Len(t, out.History, 5)
	assert.NotZero(t, out.History[4].ExitCode)
	assert.Contains(t, out.History[4].Stderr, "No such file")
}

type sandboxOut struct {
	Pending bool   `json:"pending"`
	Status  string `json:"status"`
	Box     string `json:"box"`
	Error   string `json:"error"`
	History []struct {
		Command  string `json:"command"`
		Stdout   string `json:"stdout"`
		Stderr   string `json:"stderr"`
		ExitCode int    `json:"exit_code"`
	} `json:"history"`
	Files    map[string]any `json:"files"`
	Previews map[string]struct {
		URL     string `json:"url"`
		HostURL string `json:"host_url"`
	} `json:"previews"`
	Server builtins.ServerStatus `json:"server"`
}

func (in *instance) num(name string) float64 {
	in.w.t.Helper()
	var f float64
	in.get(name, &f)
	return f
}

func TestDevServer(t *testing.T) {
	w := newWorld(t, "")
	// The preview proxy is part of the sandbox service's HTTP API, served
	// here as `cellbox run` serves it.
	srv := httptest.NewServer(httpapi.Handler(w.svc))
	t.Cleanup(srv.Close)
	w.svc.SetBaseURL(srv.URL)

	in := w.load(load(t, "dev-server"))
	in.wait()
	// The node publishes the preview URL of its port as soon as the box
	// runs, and starts the server itself (start:): no run event.
	var out sandboxOut
	in.get("web", &out)
	require.Equal(t, "running", out.Status, "%+v", out)
	assert.Empty(t, out.Error)
	url := out.Previews["8000"].URL
	require.Regexp(t, `^http://p[0-9a-f]{32}\.localhost:\d+/$`, url, "previews: %+v", out.Previews)
	// Ready is the port accepting; the line the server prints as it starts
	// may reach the node's output a moment after.
	eventually(t, 20*time.Second, "the server to be ready and say so", func() bool {
		in.get("web", &out)
		return out.Server.State == builtins.ServerReady && strings.Contains(out.Server.Output, "serving on 127.0.0.1:8000")
	})
	assert.Empty(t, out.History, "no command was needed")
	assert.Equal(t, url, out.Previews["8000"].URL, "the URL stays while the box lives")

	page := fetch(t, url)
	assert.Contains(t, page, `<h1 style="color:teal">Hello from cellbox</h1>`)

	in.set("config", map[string]any{"title": "Changed live", "message": "no restart", "color": "crimson"})
	in.wait()
	eventually(t, 5*time.Second, "the page to show the new config", func() bool {
		return strings.Contains(fetch(t, url), `<h1 style="color:crimson">Changed live</h1>`)
	})
	assert.JSONEq(t, `{"title": "Changed live", "message": "no restart", "color": "crimson"}`, fetch(t, url+"config"))
	eventually(t, 5*time.Second, "the log cell to show the requests", func() bool {
		return strings.Contains(in.str("log"), `"GET /config HTTP/1.1" 200`)
	})

	// A config the schema refuses is not written (the page keeps the last good one).
	raw, _ := json.Marshal(map[string]any{"title": 42})
	err := in.rt.Set(context.Background(), in.addr("config"), raw)
	require.Error(t, err)
	var se *cells.SchemaError
	assert.ErrorAs(t, err, &se)
	assert.Contains(t, fetch(t, url), "Changed live")
}

func fetch(t *testing.T, url string) string {
	t.Helper()
	resp, body := testenv.HTTPGet(t, url, "") // resolves ID.localhost as browsers do
	require.Equal(t, http.StatusOK, resp.StatusCode, "GET %s: %s", url, body)
	return body
}

// nodeImages returns the images directory `cellbox image build` uses
// ($CELLBOX_IMAGES, else the default data dir's images) holding the
// cellbox/node rootfs, building it when it is missing and CI or
// CELLBOX_TEST_IMAGES=1 is set (it takes a minute or two: debootstrap from
// the configured Debian mirror), and skipping otherwise.
func nodeImages(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("CELLBOX_IMAGES")
	if dir == "" {
		data := os.Getenv("CELLBOX_DATA")
		if data == "" {
			home, err := os.UserHomeDir()
			require.NoError(t, err)
			data = filepath.Join(home, ".local", "share", "cellbox")
		}
		dir = filepath.Join(data, "images")
	}
	if _, err := os.Stat(filepath.Join(image.RootfsDir(dir, "node"), ".cellbox-image.json")); err == nil {
		return dir
	}
	if !testenv.InCI() && os.Getenv("CELLBOX_TEST_IMAGES") != "1" {
		t.Skipf("the cellbox/node image is not built in %s: run `cellbox image build node --images %s` (or set CELLBOX_TEST_IMAGES=1 to build it here)", dir, dir)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	_, _, err := image.Build(ctx, image.BuildOptions{ImagesDir: dir, Name: "node"})
	require.NoError(t, err, "build the cellbox/node image")
	t.Logf("built cellbox/node in %s", time.Since(start).Round(time.Second))
	return dir
}

func TestTypeScript(t *testing.T) {
	testenv.RequireBwrap(t)
	w := newWorld(t, nodeImages(t))
	in := w.load(load(t, "typescript"))
	in.wait()
	compile := in.exec("compile")
	require.Nil(t, compile.Error)
	js := in.str("main_js")
	assert.Contains(t, js, `require("./shapes")`, "main.js is CommonJS, as tsconfig.json says")
	assert.Contains(t, js, "console.log((0, shapes_1.greet)(\"cellbox\"));")
	assert.NotContains(t, js, "Shape[]", "types are gone")
	shapes, _ := compile.Result.Files["/workspace/out/shapes.js"].(string)
	assert.Contains(t, shapes, "function area(s)")
	assert.Equal(t, "hello, cellbox\ncircle: 3.14\nsquare: 9.00\nrect: 10.00\n", in.str("output"))

	// Change a source: it compiles and runs again.
	src := in.str("main_ts")
	in.set("main_ts", strings.Replace(src, `greet("cellbox")`, `greet("TypeScript")`, 1))
	in.wait()
	assert.True(t, strings.HasPrefix(in.str("output"), "hello, TypeScript\n"), in.str("output"))

	// A type error fails compile with tsc's message; its diagnostics are
	// kept in the result, and main_js has no value.
	in.set("main_ts", src+"\nconst n: number = \"not a number\";\n")
	in.wait()
	compile = in.exec("compile")
	require.NotNil(t, compile.Error)
	assert.Contains(t, *compile.Error, "error TS2322")
	assert.Contains(t, in.str("diagnostics"), "src/main.ts(14,7): error TS2322: Type 'string' is not assignable to type 'number'.")
	var js2 any
	in.get("main_js", &js2)
	assert.Nil(t, js2)
	run := in.exec("run")
	require.NotNil(t, run.Error, "run does not start on a failed compile")
	assert.Contains(t, *run.Error, "upstream compile failed")
}

// TestCSVPipelineKillRestart runs the real `cellbox run`, kills it (SIGKILL)
// while the last stage runs, and starts it again over the same data
// directory: it finishes that stage without repeating the finished ones.
func TestCSVPipelineKillRestart(t *testing.T) {
	testenv.RequireBwrap(t)
	bin := testenv.CellboxBinary(t)
	data, err := os.MkdirTemp("", "cbx-")
	require.NoError(t, err)
	t.Cleanup(func() {
		sandboxtest.RemoveBoxes(t, data) // a box left by a failed run holds a mounted disk
		os.RemoveAll(data)
	})
	// A copy whose last stage takes a second, so that the kill lands while
	// it runs.
	dir := t.TempDir()
	for _, f := range []string{"pattern.yaml", "data.csv", "clean.py", "keep.py", "summarize.py"} {
		b, err := os.ReadFile(filepath.Join("csv-pipeline", f))
		require.NoError(t, err)
		if f == "summarize.py" {
			b = append([]byte("import time; time.sleep(1)\n"), b...)
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o644))
	}
	cellbox := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := osexec.CommandContext(ctx, bin, args...).CombinedOutput()
		require.NoError(t, err, "cellbox %s: %s", strings.Join(args, " "), out)
		return string(out)
	}

	run := osexec.Command(bin, "run", dir, "--data", data, "--backend", "local")
	stdout, err := run.StdoutPipe()
	require.NoError(t, err)
	run.Stderr = run.Stdout
	require.NoError(t, run.Start())
	killed := false
	t.Cleanup(func() {
		if !killed {
			run.Process.Kill()
			run.Wait()
		}
	})
	lines := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var seen []string
	waitFor := func(re string) {
		t.Helper()
		rx := regexp.MustCompile(re)
		timeout := time.After(time.Minute)
		for {
			select {
			case l, ok := <-lines:
				require.True(t, ok, "cellbox run ended before %q; it printed:\n%s", re, strings.Join(seen, "\n"))
				seen = append(seen, l)
				if rx.MatchString(l) {
					return
				}
			case <-timeout:
				t.Fatalf("no line matching %q within a minute; cellbox run printed:\n%s", re, strings.Join(seen, "\n"))
			}
		}
	}
	waitFor(`node report = "13 sales`)
	cellbox("cell", "set", "threshold", "100", "--data", data)
	waitFor(`node summarize started`)
	require.NoError(t, run.Process.Kill())
	killed = true
	run.Wait()

	// Start it again: it resumes summarize, and only summarize.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	again := osexec.CommandContext(ctx, bin, "run", dir, "--data", data, "--backend", "local", "--once")
	var progress strings.Builder
	again.Stderr = &progress
	final, err := again.Output()
	require.NoError(t, err, "cellbox run --once after the kill: %s", progress.String())
	assert.Contains(t, string(final), `report = "7 sales, 1304.83 in all (smallest 119.94)"`)
	assert.Regexp(t, `node summarize started`, progress.String())
	for _, stage := range []string{"clean", "keep"} {
		assert.NotRegexp(t, `node `+stage+` started`, progress.String(), "%s had finished before the kill", stage)
	}
	out := cellbox("cell", "get", "keep", "--data", data)
	assert.Contains(t, out, ">= 100", "the store can be read once the run has exited")
	// No box is left behind: the run the kill orphaned was replaced and
	// removed. (A box directory the kill caught half-made, before its
	// spec.json, is not a box the backend lists; it is logged, not failed.)
	dirs, err := filepath.Glob(filepath.Join(data, "local", "cb-*"))
	require.NoError(t, err)
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "spec.json")); err != nil {
			t.Logf("a half-made box directory is left: %s", d)
			continue
		}
		t.Errorf("box %s is left behind", d)
	}
}
