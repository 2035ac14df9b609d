package builtins_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/builtins"
	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/runtime"
	"github.com/cellbox/cellbox/sandbox/api"
)

func TestExecBasic(t *testing.T) {
	b := newBox(t)
	r := b.load(t, `
name: basic
cells:
  name: world
  steps: ["echo one", "echo two"]
nodes:
  hello:
    exec:
      command: echo hello ${name}; echo oops >&2
  list:
    exec:
      command: ["echo first", '${steps}', echo last]
  chatty:
    exec:
      command: head -c 3000000 /dev/zero | tr '\\0' y
`, nil)
	assert.True(t, r.exec("hello").Pending, "the batch that decides a run writes pending before the run")
	r.settle()

	out := r.exec("hello")
	assert.False(t, out.Pending)
	assert.Nil(t, out.Error)
	require.NotNil(t, out.Result)
	assert.Equal(t, builtins.ExecResult{Stdout: "hello world\n", Stderr: "oops\n", Files: map[string]any{}}, *out.Result)
	assert.Equal(t, "first\none\ntwo\nlast\n", r.exec("list").Result.Stdout, "a list from an expression is spliced in")
	chatty := r.exec("chatty").Result
	assert.True(t, chatty.Truncated, "3 MB of output is cut, and the result says so")
	assert.Len(t, chatty.Stdout, 1<<20)
	assert.Len(t, b.client.boxesCreated(), 3, "one fresh box per run")
	assert.Empty(t, b.list(t), "run boxes are destroyed after the run")
}

// TestExecPublishesBeforeTeardown: with Env.Teardowns (cellbox run), a
// run's result is in its cell while its box is still being destroyed (the
// destroy is held here); the host's Teardowns.Wait waits for the destroy.
func TestExecPublishesBeforeTeardown(t *testing.T) {
	b := newBox(t)
	b.teardowns = &builtins.Teardowns{}
	release := b.client.holdDestroys(t)
	r := b.load(t, `
name: early
nodes:
  hello:
    exec:
      command: echo hello
`, nil)
	r.settle() // before: blocked on the held destroy
	out := r.exec("hello")
	require.NotNil(t, out.Result)
	assert.Equal(t, "hello\n", out.Result.Stdout)
	assert.Len(t, b.list(t), 1, "the box is still being torn down")

	waited := make(chan error, 1)
	go func() { waited <- b.teardowns.Wait(context.Background()) }()
	select {
	case err := <-waited:
		t.Fatalf("Teardowns.Wait returned (%v) while a destroy was held", err)
	case <-time.After(50 * time.Millisecond):
	}
	release()
	require.NoError(t, <-waited)
	assert.Empty(t, b.list(t), "the box is gone once the teardowns are waited for")
}

func TestExecFiles(t *testing.T) {
	b := newBox(t)
	r := b.load(t, `
name: files
cells:
  csv: "a,b\n1,2\n"
  cfg: {value: {port: 8080, tags: [x, y]}}
  empty:
nodes:
  job:
    exec:
      command:
        - cat in.csv cfg.json note.txt script.sh t.txt; echo "$GREETING $PORT"
        - >-
          mkdir -p out && printf hello > out/o.txt &&
          printf '{"n": 3, "big": 12345678901234567890, "l": [1.5]}' > out/o.json
      env: {GREETING: hi, PORT: '${cfg.port}'}
      files:
        /workspace/in.csv: ${csv}
        /workspace/cfg.json: ${cfg}
        /workspace/note.txt: "static text\n"
        /workspace/script.sh: {file: script.sh}
        /workspace/t.txt: "port=${cfg.port} tags=${cfg.tags} empty=[${empty}]\n"
        /workspace/out/o.txt: text
        /workspace/out/o.json: json
`, map[string]string{"script.sh": "echo from the pattern folder\n"})
	r.settle()
	out := r.exec("job")
	require.Nil(t, out.Error)
	assert.Equal(t, "a,b\n1,2\n"+`{"port":8080,"tags":["x","y"]}`+"static text\necho from the pattern folder\nport=8080 tags=[\"x\",\"y\"] empty=[]\nhi 8080\n", out.Result.Stdout)
	raw, _ := json.Marshal(out.Result.Files)
	assert.JSONEq(t, `{"/workspace/out/o.txt": "hello", "/workspace/out/o.json": {"n": 3, "big": 12345678901234567890, "l": [1.5]}}`, string(raw))
	c := r.get("job", nil)
	assert.Contains(t, string(c.Value), `"big":12345678901234567890`, "JSON numbers keep their precision")
}

func TestExecFailures(t *testing.T) {
	b := newBox(t)
	r := b.load(t, `
name: failures
nodes:
  list:
    exec:
      command: [echo one, "echo two; echo bad >&2; exit 3", echo three]
  badjson:
    exec:
      command: echo '{"a":' > /workspace/o.json
      files: {/workspace/o.json: json}
  missing:
    exec:
      command: "true"
      files: {/workspace/never.txt: text}
  toobig:
    exec:
      command: head -c 16777217 /dev/zero > /workspace/big.txt
      files: {/workspace/big.txt: text}
  slow:
    exec:
      command: sleep infinity
      timeout: 1s
`, nil)
	r.settle() // the 1s timeout ends slow's run (it would never end)
	for node, want := range map[string]string{
		"list":    "command 2 of 3 exited with 3: bad",
		"badjson": "output file /workspace/o.json is not JSON",
		"missing": "output file /workspace/never.txt (text) was not written by the command",
		"toobig":  "output file /workspace/big.txt is larger than 16 MiB, the cap on an output file: it was not read",
		// On a loaded machine the second may be spent making the box:
		// the command then did not start, and that is a timeout too.
		"slow": "timed out after",
	} {
		out := r.exec(node)
		require.NotNil(t, out.Error, node)
		assert.Contains(t, *out.Error, want, node)
		assert.False(t, out.Pending, node)
	}
	assert.Contains(t, *r.exec("slow").Error, "(timeout 1s)")
	assert.Empty(t, b.list(t), "failed runs destroy their boxes too")
	for _, n := range r.rt.Nodes() {
		assert.Equal(t, runtime.Error, n.State, n.Addr.String())
	}
}

// TestExecExitError runs the kind directly to see the result an exit error
// carries (the runtime stores the error).
func TestExecExitError(t *testing.T) {
	b := newBox(t)
	x, err := builtins.NewExec(builtins.Env{Client: b.client, Logger: quiet()}, builtins.ExecSpec{
		Node: cells.Address{Space: "s", Pattern: "p", Name: "x"},
		Command: []builtins.Field{
			builtins.Const("echo one"),
			builtins.Const("echo two; echo bad >&2; exit 3"),
			builtins.Const("echo three > /workspace/o.txt"),
		},
		Files: map[string]builtins.File{"/workspace/o.txt": {Output: builtins.OutputText}},
	})
	require.NoError(t, err)
	_, err = x.Run(context.Background(), runtime.Inputs{})
	var ee *builtins.ExitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, "command 2 of 3 exited with 3: bad", ee.Error())
	assert.Equal(t, builtins.ExecResult{Stdout: "one\ntwo\n", Stderr: "bad\n", ExitCode: 3, Files: map[string]any{"/workspace/o.txt": nil}}, ee.Result,
		"the list stops at the failure: the third command never wrote its file")
	assert.Equal(t, ee.Result, ee.PartialResult())
}

// TestExecRerunAndAbort changes an exec node's input while it runs: the
// aborted run's command is held until the newer run has finished and then
// completes, so its result comes back late, as from a slow agent: it must
// never be written. Then a run that sleeps is aborted: its command is
// killed and its box destroyed.
func TestExecRerunAndAbort(t *testing.T) {
	b := newBox(t)
	r := b.load(t, `
name: abort
cells:
  n: 1
nodes:
  job:
    exec:
      command: 'sleep ${n == 4 ? 300 : 0}; echo n=${n}'
  shout: {computed: '${upper(job.result.stdout ?? "")}'}
`, nil)
	r.settle()
	assert.Equal(t, "n=1\n", r.exec("job").Result.Stdout)
	var shout string
	r.get("shout", &shout)
	assert.Equal(t, "N=1\n", shout)

	from := r.store.Version()
	release := b.client.holdCommand(t, "sleep 0; echo n=2")
	r.set("n", "2")
	select {
	case <-b.client.reached:
	case <-time.After(30 * time.Second):
		t.Fatal("the n=2 run never reached its command")
	}
	slowBox := b.client.boxesCreated()[1]
	r.set("n", "3")
	waitFor(t, "the n=3 run's result", func() bool {
		o := r.exec("job")
		return !o.Pending && o.Result != nil && o.Result.Stdout == "n=3\n"
	})
	release() // the aborted run's command runs now, and its run returns
	r.settle()
	b.client.mu.Lock()
	late := slices.Clone(b.client.late)
	b.client.mu.Unlock()
	require.Len(t, late, 1)
	assert.Equal(t, "n=2\n", late[0].Stdout, "the aborted run did get its result back")
	assert.Equal(t, "n=3\n", r.exec("job").Result.Stdout)
	r.get("shout", &shout)
	assert.Equal(t, "N=3\n", shout, "dependents rerun")

	// Every value job had since: never the aborted run's.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := r.store.Watch(ctx, r.addr("job").Prefix(), from)
	require.NoError(t, err)
	var seen []string
	for done := false; !done; {
		select {
		case batch := <-ch:
			for _, c := range batch.Changes {
				if c.Cell.Addr.Name == "job" {
					var o execOut
					require.NoError(t, json.Unmarshal(c.Cell.Value, &o))
					if o.Result != nil {
						seen = append(seen, o.Result.Stdout)
					}
				}
			}
			done = batch.Version >= r.store.Version()
		case <-time.After(5 * time.Second):
			t.Fatalf("job's changes: %q, the watch never reached the store's version", seen)
		}
	}
	assert.Contains(t, seen, "n=3\n")
	assert.NotContains(t, seen, "n=2\n", "the aborted run's result is never written")
	assert.NotContains(t, b.list(t), slowBox, "the aborted run's box is destroyed")
	assert.Empty(t, b.list(t))

	// A run whose command sleeps for 300 s is aborted: its command is
	// killed (the runtime settles) and its box destroyed.
	r.set("n", "4")
	waitFor(t, "the sleeping run's box", func() bool { return len(b.client.boxesCreated()) == 4 })
	r.set("n", "5")
	r.settle()
	assert.Equal(t, "n=5\n", r.exec("job").Result.Stdout)
	assert.Empty(t, b.list(t))
}

// TestExecRerunAfterFailure: while an exec node runs again after a failed
// run, its cell keeps the failed run's error beside its result (pending
// meanwhile), so the documented idiom ${job.error == nil ?
// job.result.stdout : "failed"} never takes the failed run's output for a
// success; the new run's outcome replaces both.
func TestExecRerunAfterFailure(t *testing.T) {
	b := newBox(t)
	r := b.load(t, `
name: rerun
cells:
  n: 1
nodes:
  job:
    exec:
      command: 'echo n=${n}; exit ${n == 1 ? 1 : 0}'
  clean: {computed: '${job.error == nil ? job.result.stdout : "failed"}'}
`, nil)
	r.settle()
	failed := r.exec("job")
	require.NotNil(t, failed.Error)
	assert.Equal(t, "command exited with 1: n=1", *failed.Error)
	var clean string
	r.get("clean", &clean)
	assert.Equal(t, "failed", clean)

	release := b.client.holdCommand(t, "echo n=2; exit 0")
	r.set("n", "2")
	select {
	case <-b.client.reached:
	case <-time.After(30 * time.Second):
		t.Fatal("the n=2 run never reached its command")
	}
	o := r.exec("job")
	assert.True(t, o.Pending)
	require.NotNil(t, o.Error, "the failed run's error stays with its result while the new run is pending")
	assert.Equal(t, "command exited with 1: n=1", *o.Error)
	require.NotNil(t, o.Result)
	assert.Equal(t, "n=1\n", o.Result.Stdout)
	r.get("clean", &clean)
	assert.Equal(t, "failed", clean, "the failed run's output does not pass for a success")

	release()
	r.settle()
	o = r.exec("job")
	assert.False(t, o.Pending)
	assert.Nil(t, o.Error)
	assert.Equal(t, "n=2\n", o.Result.Stdout)
	r.get("clean", &clean)
	assert.Equal(t, "n=2\n", clean)
}

func TestExecMemo(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cache string
		boxes int // boxes created by n=1, n=2, back to n=1
	}{
		{"cached", "true", 2},
		{"cache false", "false", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBox(t)
			r := b.load(t, `
name: memo
cells:
  n: 1
nodes:
  job:
    exec:
      command: echo n=${n}
      cache: `+tc.cache+`
`, nil)
			r.settle()
			r.set("n", "2")
			r.settle()
			assert.Equal(t, "n=2\n", r.exec("job").Result.Stdout)
			r.set("n", "1")
			r.settle()
			assert.Equal(t, "n=1\n", r.exec("job").Result.Stdout)
			assert.Len(t, b.client.boxesCreated(), tc.boxes)
			info := r.rt.Nodes()[0]
			assert.Equal(t, tc.boxes, info.Runs)
			assert.Equal(t, 3-tc.boxes, info.CacheHits)
		})
	}
}

func TestExecKey(t *testing.T) {
	env := builtins.Env{Client: &counting{}, Logger: quiet()}
	mk := func(spec builtins.ExecSpec) *builtins.Exec {
		spec.Node = cells.Address{Space: "s", Pattern: "p", Name: "x"}
		x, err := builtins.NewExec(env, spec)
		require.NoError(t, err)
		return x
	}
	base := builtins.ExecSpec{Command: []builtins.Field{builtins.ExprField(builtins.MustParse(`"echo " + n`))}}
	key := func(x *builtins.Exec, in runtime.Inputs) string {
		k, memo, err := x.Key(in)
		require.NoError(t, err)
		assert.True(t, memo)
		return k
	}
	x := mk(base)
	k1 := key(x, runtime.Inputs{"n": "1"})
	assert.Equal(t, k1, key(x, runtime.Inputs{"n": "1"}), "same inputs, same key")
	assert.NotEqual(t, k1, key(x, runtime.Inputs{"n": "2"}), "the command is in the key")
	withImage := base
	withImage.Image = builtins.Const("cellbox/python")
	assert.NotEqual(t, k1, key(mk(withImage), runtime.Inputs{"n": "1"}), "the image is in the key")
	withEnv := base
	withEnv.Env = map[string]builtins.Field{"A": builtins.Const("1")}
	assert.NotEqual(t, k1, key(mk(withEnv), runtime.Inputs{"n": "1"}), "env is in the key")
	withFile := base
	withFile.Files = map[string]builtins.File{"/workspace/a": {Input: builtins.ExprField(builtins.MustParse("n"))}}
	assert.NotEqual(t, key(mk(withFile), runtime.Inputs{"n": "1"}), key(mk(withFile), runtime.Inputs{"n": "2"}), "input files are in the key")

	withNet := base
	withNet.Network = &api.Network{NetworkRules: api.NetworkRules{Allow: []string{"x.org"}}}
	assert.NotEqual(t, k1, key(mk(withNet), runtime.Inputs{"n": "1"}), "the network is in the key")

	noCache := base
	noCache.NoCache = true
	_, memo, err := mk(noCache).Key(runtime.Inputs{"n": "1"})
	require.NoError(t, err)
	assert.False(t, memo)

	_, _, err = x.Key(runtime.Inputs{"n": nil})
	assert.ErrorContains(t, err, "command[0]")
	empty := builtins.ExecSpec{Command: []builtins.Field{builtins.Const([]any{})}}
	_, _, err = mk(empty).Key(nil)
	assert.ErrorContains(t, err, "no command to run")

	_, err = builtins.NewExec(builtins.Env{}, base)
	assert.ErrorContains(t, err, "no sandbox client")
	_, err = builtins.NewExec(env, builtins.ExecSpec{Command: base.Command, Files: map[string]builtins.File{"rel/x": {Output: "text"}}})
	assert.ErrorContains(t, err, "not a clean absolute path")
	_, err = builtins.NewExec(env, builtins.ExecSpec{Command: base.Command, Files: map[string]builtins.File{"/workspace/x": {Output: "yaml"}}})
	assert.ErrorContains(t, err, `output format "yaml"`)
	for _, p := range []string{"/etc/hostname", "/dev/zero", "/workspace", "/tmp", "/workspacex/y"} {
		_, err = builtins.NewExec(env, builtins.ExecSpec{Command: base.Command, Files: map[string]builtins.File{p: {Output: "text"}}})
		assert.ErrorContains(t, err, "is outside /workspace and /tmp", p)
	}
	_, err = builtins.NewExec(env, builtins.ExecSpec{Command: base.Command, Files: map[string]builtins.File{"/tmp/x": {Output: "text"}}})
	assert.NoError(t, err)
}

// TestExecNetwork: an exec node's `network:` allow list lets each run's box
// reach what it names; a node without one reaches nothing.
func TestExecNetwork(t *testing.T) {
	b := newBox(t)
	// On 127.0.0.2: the box's NO_PROXY sends 127.0.0.1 to its own loopback.
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "data") }))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	get := fmt.Sprintf(`python3 -c 'import urllib.request as u; print(u.urlopen("%s/", timeout=5).read().decode())'`, srv.URL)
	r := b.load(t, fmt.Sprintf(`
name: net
nodes:
  open:
    exec:
      command: %q
      network: {allow: ["%s"]}
  closed:
    exec:
      command: %q
`, get, strings.TrimPrefix(srv.URL, "http://"), get), nil)
	r.settle()
	open := r.exec("open")
	require.NotNil(t, open.Result, "%v", open.Error)
	assert.Equal(t, "data\n", open.Result.Stdout)
	closed := r.exec("closed")
	require.NotNil(t, closed.Error, "a box with no network reaches nothing")

}

// A run that failed on its timeout runs again when the pattern is loaded
// with more time: the timeout is part of what the run is.
func TestExecRerunsWithMoreTime(t *testing.T) {
	b := newBox(t)
	store, err := cells.OpenBolt(filepath.Join(t.TempDir(), "cells.db"), cells.Options{NoSync: true})
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	pattern := func(timeout string) string {
		return "name: more-time\nnodes:\n  e:\n    exec:\n      command: echo hi\n      timeout: " + timeout + "\n"
	}
	r := b.loadOn(t, store, pattern("1ns"), nil)
	r.settle()
	out := r.exec("e")
	require.NotNil(t, out.Error)
	assert.Contains(t, *out.Error, "did not start: the run timed out after")
	assert.Contains(t, *out.Error, "(timeout 1ns)")
	r.close(runtime.Stopped)

	r = b.loadOn(t, store, pattern("1m"), nil)
	r.settle()
	out = r.exec("e")
	require.Nil(t, out.Error, "%v", out.Error)
	assert.Equal(t, "hi\n", out.Result.Stdout)
}
