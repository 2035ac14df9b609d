package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
)

// TestBenchBoxesLocal runs the boxes bench with tiny numbers on the local
// backend and checks the table a user would paste into the README: every
// row, with sane numbers and a baseline, and no box left behind.
func TestBenchBoxesLocal(t *testing.T) {
	testenv.RequireBwrap(t)
	bin := testenv.CellboxBinary(t)
	data := t.TempDir()

	var out bytes.Buffer
	err := runBench(context.Background(), []string{"boxes", "--backend", "local", "--n", "3", "--tree-mib", "2", "--storm", "5",
		"--data", data, "--agent-binary", bin}, &out)
	require.NoError(t, err, out.String())
	t.Log("\n" + out.String())

	checkBenchRows(t, out.String(), "local", `^< \d+ ms [✔✘]$`, []benchRowWant{
		{"create → first result, warm pool", "bwrap … true", true},
		{"create → first result, cold (no pool)", "bwrap … true", false},
		{"warm `shell` `true`", "bwrap … true", true},
		{"write 1 MiB file (upload endpoint)", "host os.WriteFile (no box)", false},
		{"read 1 MiB file (download endpoint)", "host os.ReadFile (no box)", false},
		{"write 1 MiB file (`write_file`)", "host os.WriteFile (no box)", false},
		{"read 1 MiB file (`read_file`, 4 calls)", "host os.ReadFile (no box)", false},
		{"`run_code` python `1 + 1` in a context", "`shell` `python3 -c …`", false},
		{"`run_code` python `1 + 1` stateless", "`shell` `python3 -c …`", false},
		{"transfer 2 MiB tree (2 files) box → box", "host cp -r (no box)", false},
		{"fork a 2 MiB / 1000-file workspace into 10 boxes, all answering (clone)", "host cp -a of the tree (one copy, no box)", true},
		{"sleep → wake (first `shell` `true` on a sleeping box)", "bwrap … true", false},
		{"storm: 5 boxes at once (one per session), all answering", "5 × bwrap … true at once", false},
	})
	assert.Contains(t, out.String(), "load average")
	assertNoBoxesLeft(t, data)
}

// TestBenchBoxesOnly measures only the groups of rows --only names (the
// file transfers here), and says only what those rows are.
func TestBenchBoxesOnly(t *testing.T) {
	testenv.RequireBwrap(t)
	bin := testenv.CellboxBinary(t)
	data := t.TempDir()
	var out bytes.Buffer
	err := runBench(context.Background(), []string{"boxes", "--backend", "local", "--n", "3", "--only", "files",
		"--data", data, "--agent-binary", bin}, &out)
	require.NoError(t, err, out.String())
	checkBenchRows(t, out.String(), "local", "", []benchRowWant{
		{"write 1 MiB file (upload endpoint)", "host os.WriteFile (no box)", false},
		{"read 1 MiB file (download endpoint)", "host os.ReadFile (no box)", false},
		{"write 1 MiB file (`write_file`)", "host os.WriteFile (no box)", false},
		{"read 1 MiB file (`read_file`, 4 calls)", "host os.ReadFile (no box)", false},
	})
	assert.Contains(t, out.String(), "1 MiB file: raw bytes")
	assert.NotContains(t, out.String(), "fork:")
	assertNoBoxesLeft(t, data)
}

// TestBenchBoxesInterrupted stops the bench midway, as ctrl-C does, and
// checks that it leaves no box running.
func TestBenchBoxesInterrupted(t *testing.T) {
	testenv.RequireBwrap(t)
	bin := testenv.CellboxBinary(t)
	data := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	var out bytes.Buffer
	err := runBench(ctx, []string{"boxes", "--backend", "local", "--n", "50", "--data", data, "--agent-binary", bin}, &out)
	require.Error(t, err, "the bench was cut short")
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assertNoBoxesLeft(t, data)
}

// TestBenchRuntime runs the runtime bench with small graphs, the file
// bindings on the local backend, and checks its JSON.
func TestBenchRuntime(t *testing.T) {
	testenv.RequireBwrap(t)
	bin := testenv.CellboxBinary(t)
	var out bytes.Buffer
	err := runBench(context.Background(), []string{"runtime", "--nodes", "300", "--n", "3", "--watch-n", "5", "--js=false",
		"--backend", "local", "--agent-binary", bin, "--json"}, &out)
	require.NoError(t, err, out.String())
	var rep benchReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep), out.String())
	assert.Equal(t, "runtime", rep.Bench)
	assert.NotEmpty(t, rep.Host.LoadStart)

	var got []string
	for _, r := range rep.Rows {
		got = append(got, r.Backend+": "+r.What)
		assert.Positive(t, r.N, r.What)
		assert.Positive(t, r.P50, r.What)
		assert.GreaterOrEqual(t, r.P95, r.P50, r.What)
		assert.Positive(t, r.Mean, r.What)
		assert.NotEmpty(t, r.Baseline, r.What)
		assert.Positive(t, r.BaselineP50, r.What)
		assert.Positive(t, r.Ratio, r.What)
	}
	var want []string
	for _, st := range []string{"memory", "bbolt"} {
		want = append(want,
			st+": propagate chain of 300 computed nodes, per node",
			st+": propagate fan-out of 300 computed nodes, per node",
			st+": propagate diamonds of 300 computed nodes, per node",
			st+": propagate 50-level chain, whole write")
		if st == "bbolt" {
			want = append(want, "bbolt, no fsync: propagate 50-level chain, whole write")
		}
		want = append(want, st+": cell write → watcher notified")
	}
	want = append(want,
		"local: cell written → file in the box (sandbox node)",
		"local: file written in the box → output cell (sandbox node)")
	assert.Equal(t, want, got)
	for _, i := range []int{0, 1, 2, 8, 11, 12} {
		assert.NotNil(t, rep.Rows[i].Met, "%s has a target", rep.Rows[i].What)
	}
}

// TestBenchRuntimeNoNode: without node, the alien-signals rows are
// skipped with the reason, and the rest of the bench runs.
func TestBenchRuntimeNoNode(t *testing.T) {
	var out bytes.Buffer
	err := runBench(context.Background(), []string{"runtime", "--nodes", "30", "--n", "2", "--watch-n", "2",
		"--backend", "none", "--node", filepath.Join(t.TempDir(), "no-node"), "--json"}, &out)
	require.NoError(t, err, out.String())
	var rep benchReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep), out.String())
	for _, r := range rep.Rows {
		assert.NotContains(t, r.Backend, "alien-signals")
	}
	assert.Contains(t, strings.Join(rep.Notes, "\n"), "alien-signals rows skipped: no node to run it")
}

// TestBenchCluster runs the cluster bench with tiny numbers (its own
// three-member etcd, servers on the local backend) and checks its JSON:
// every figure, the etcd ones against their bbolt ones with the target,
// and the notes on the target and the etcd requests.
func TestBenchCluster(t *testing.T) {
	testenv.RequireBwrap(t)
	testenv.RequireCommand(t, "etcd")
	bin := testenv.CellboxBinary(t)
	var out bytes.Buffer
	err := runBench(context.Background(), []string{"cluster", "--n", "3", "--agent-binary", bin, "--json"}, &out)
	require.NoError(t, err, out.String())
	var rep benchReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep), out.String())
	assert.Equal(t, "cluster", rep.Bench)

	var got []string
	for _, r := range rep.Rows {
		got = append(got, r.Backend+": "+r.What)
		assert.Equal(t, 3, r.N, r.What)
		assert.Positive(t, r.P50, r.What)
		assert.GreaterOrEqual(t, r.P95, r.P50, r.What)
		assert.Positive(t, r.Mean, r.What)
		assert.NotEmpty(t, r.Baseline, r.What)
		assert.Positive(t, r.BaselineP50, r.What)
		assert.Positive(t, r.Ratio, r.What)
		if strings.Contains(r.Backend, "etcd") && strings.HasPrefix(r.Baseline, "clientv3") {
			assert.Nil(t, r.Met, r.What)
		}
	}
	assert.Equal(t, []string{
		"etcd ×3: clientv3 Put of one key (a write's round trip)",
		"etcd ×3: clientv3 Get of one key (linearizable: a read's round trip)",
		"bbolt: cell write → watcher notified (the same store)",
		"etcd ×3: cell write → watcher notified (a second store, on another client)",
		"bbolt: propagate a 50-level chain of computed nodes, per node",
		"etcd ×3: propagate a 50-level chain of computed nodes, per node",
		"local, one machine: session create (sandbox service NewSession)",
		"local, etcd ×3: session create (sandbox service NewSession)",
		"local, one machine: warm `shell` `true` over HTTP",
		"local, etcd ×3: warm `shell` `true` over HTTP to the session's server",
		"local, etcd ×3: warm `shell` `true` over HTTP to another server (forwarded)",
	}, got)
	for i, r := range rep.Rows {
		if i == 3 || i == 5 || i == 7 || i == 9 || i == 10 {
			require.NotNil(t, r.Met, "%s has a target", r.What)
			assert.Greater(t, r.Target, time.Duration(float64(r.BaselineP50)*clusterFactor), r.What)
		} else {
			assert.Nil(t, r.Met, "%s has no target", r.What)
		}
	}
	notes := strings.Join(rep.Notes, "\n")
	assert.Contains(t, notes, "target: holds for ")
	assert.Contains(t, notes, "of 5 figures")
	assert.Regexp(t, "`shell` `true` to another server: [^;]*Range [0-9.]+", notes, "the forwarded call reads etcd (leases renewed meanwhile may be counted too)")
	assert.NotContains(t, notes, "stopped early")
}

// TestBenchPipelineLocal runs the pipeline bench with tiny numbers on the
// local backend: every scenario under cellbox beside make + bwrap, and
// make + bwrap beside plain make, with sane numbers and targets; the
// first full run beside make from clean, and the rerun under `cellbox
// serve` beside `cellbox run` through the same API.
func TestBenchPipelineLocal(t *testing.T) {
	testenv.RequireBwrap(t)
	bin := testenv.CellboxBinary(t)
	var out bytes.Buffer
	err := runBench(context.Background(), []string{"pipeline", "--backend", "local", "--n", "2",
		"--example", "../../examples/csv-pipeline", "--agent-binary", bin}, &out)
	require.NoError(t, err, out.String())
	t.Log("\n" + out.String())

	checkBenchRows(t, out.String(), "local", `^< [\d.]+ (ms|s) [✔✘]$`, []benchRowWant{
		{"csv rerun after a threshold change (2 stages), `cellbox run`", "make + bwrap", true},
		{"csv rerun after a threshold change (2 stages), make + bwrap", "make, no sandbox", false},
		{"one stage running `true` with one input file, `cellbox run`", "make + bwrap", true},
		{"one stage running `true` with one input file, make + bwrap", "make, no sandbox", false},
		{"nothing to do, `cellbox run --once`", "`make`, nothing to do", true},
		{"first full run of the csv pipeline (3 stages), `cellbox run --once`, fresh data dir", "make + bwrap from clean", true},
		{"first full run of the csv pipeline (3 stages), make + bwrap from clean", "make, no sandbox from clean", false},
		{"csv rerun after a threshold change (2 stages), through the HTTP API, `cellbox serve --pool 2`", "`cellbox run`, same loop", true},
		{"csv rerun after a threshold change (2 stages), through the HTTP API, `cellbox run`", "make + bwrap", false},
	})
}

func TestBenchBadInput(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{nil, "want a subcommand: boxes, pipeline, runtime or cluster"},
		{[]string{"disks"}, `unknown subcommand "disks"`},
		{[]string{"boxes", "--backend", "podman"}, `--backend "podman": want docker, local, kubernetes or both (docker and local)`},
		{[]string{"boxes", "--n", "0"}, "--n 0: want a positive number"},
		{[]string{"boxes", "--budget", "-1s"}, "--budget -1s: want a positive duration"},
		{[]string{"boxes", "local"}, `unexpected arguments ["local"]`},
		{[]string{"boxes", "--only", "files,disks"}, `--only files,disks: no group "disks"; groups: create, shell, files, code, transfer, fork`},
		{[]string{"runtime", "--nodes", "2"}, "--nodes 2: want at least 3"},
		{[]string{"pipeline", "--backend", "podman"}, `--backend "podman": want docker, local or both`},
		{[]string{"pipeline", "--example", "/nonexistent"}, "--example /nonexistent: "},
		{[]string{"pipeline", "--n", "-1"}, "--n -1: want a positive number"},
		{[]string{"runtime", "--watch-n", "-5"}, "--watch-n -5: want a positive number"},
		{[]string{"runtime", "--backend", "k8s"}, `--backend "k8s": want docker, local, both or none`},
		{[]string{"cluster", "--backend", "docker"}, "--backend docker: the cluster bench runs boxes on the local backend only: want local or none"},
		{[]string{"cluster", "--members", "0"}, "--members 0: want a positive number"},
		// The test binary has no cellbox beside it: --agent-binary is needed.
		{[]string{"boxes", "--backend", "local", "--n", "1"}, "no cellbox binary beside "},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			var out bytes.Buffer
			err := runBench(context.Background(), c.args, &out)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			assert.Empty(t, out.String(), "nothing measured, nothing printed")
		})
	}
}

func TestPercentilesAndFormat(t *testing.T) {
	var s []time.Duration
	for i := 100; i >= 1; i-- {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	p50, p95, mean := percentiles(s)
	assert.Equal(t, 50*time.Millisecond, p50)
	assert.Equal(t, 95*time.Millisecond, p95)
	assert.Equal(t, 50500*time.Microsecond, mean)
	p50, p95, mean = percentiles([]time.Duration{7})
	assert.Equal(t, []time.Duration{7, 7, 7}, []time.Duration{p50, p95, mean})

	for d, want := range map[time.Duration]string{
		850:                       "850 ns",
		1530:                      "1.53 µs",
		45 * time.Millisecond:     "45 ms",
		208400 * time.Microsecond: "208 ms",
		2500 * time.Millisecond:   "2.5 s",
		999700 * time.Microsecond: "1 s",
	} {
		assert.Equal(t, want, fmtDur(d))
	}
}

// benchRowWant is a table row a bench test expects: its measurement, its
// baseline, and whether it has a target.
type benchRowWant struct {
	what, baseline string
	target         bool
}

// checkBenchRows checks that out's table has exactly the rows of wants, in
// order, on backend, with sane numbers, and a target p50 matching
// targetRe where one is wanted (and none elsewhere).
func checkBenchRows(t *testing.T, out, backend, targetRe string, wants []benchRowWant) {
	t.Helper()
	rows := parseBenchTable(t, out)
	require.Len(t, rows, len(wants), "one row per measurement")
	for i, w := range wants {
		t.Run(w.what, func(t *testing.T) {
			r := rows[i]
			assert.Equal(t, backend, r["backend"])
			assert.Equal(t, w.what, r["what"])
			assert.Equal(t, w.baseline, r["baseline"])
			checkSaneRow(t, r)
			if w.target {
				assert.Regexp(t, targetRe, r["target p50"])
			} else {
				assert.Empty(t, r["target p50"])
			}
		})
	}
}

// parseBenchTable returns the rows of the Markdown table, keyed by column.
func parseBenchTable(t *testing.T, out string) []map[string]string {
	t.Helper()
	var header []string
	var rows []map[string]string
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "| ") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if header == nil {
			header = cells
			continue
		}
		require.Len(t, cells, len(header), line)
		row := map[string]string{}
		for i, h := range header {
			row[h] = cells[i]
		}
		rows = append(rows, row)
	}
	require.NotNil(t, header, "a Markdown table in:\n%s", out)
	return rows
}

// checkSaneRow checks the numbers of a table row.
func checkSaneRow(t *testing.T, r map[string]string) {
	t.Helper()
	n, err := strconv.Atoi(r["n"])
	require.NoError(t, err)
	assert.Positive(t, n)
	p50, p95, mean := parseBenchDur(t, r["p50"]), parseBenchDur(t, r["p95"]), parseBenchDur(t, r["mean"])
	assert.Positive(t, p50)
	assert.GreaterOrEqual(t, p95, p50)
	assert.Positive(t, mean)
	assert.Less(t, p95, time.Minute)
	assert.Positive(t, parseBenchDur(t, r["baseline p50"]))
	ratio, err := strconv.ParseFloat(strings.TrimSuffix(r["ratio"], "×"), 64)
	require.NoError(t, err, r["ratio"])
	assert.Positive(t, ratio)
}

func parseBenchDur(t *testing.T, s string) time.Duration {
	t.Helper()
	num, unit, ok := strings.Cut(s, " ")
	require.True(t, ok, "duration %q", s)
	v, err := strconv.ParseFloat(num, 64)
	require.NoError(t, err, s)
	scale := map[string]float64{"ns": 1, "µs": 1e3, "ms": 1e6, "s": 1e9}[unit]
	require.NotZero(t, scale, "unit of %q", s)
	return time.Duration(v * scale)
}

// assertNoBoxesLeft checks that no box of the bench under data exists or
// runs any more.
func assertNoBoxesLeft(t *testing.T, data string) {
	t.Helper()
	entries, _ := os.ReadDir(filepath.Join(data, "local"))
	for _, e := range entries {
		assert.True(t, strings.HasPrefix(e.Name(), "."), "box directory left behind: %s", e.Name())
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		cmd, err := os.ReadFile(p)
		if err == nil && bytes.Contains(cmd, []byte(data)) {
			assert.Fail(t, "process left running", "%s: %s", p, bytes.ReplaceAll(cmd, []byte{0}, []byte{' '}))
		}
	}
}
