package sandbox

import (
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/docker"
	"github.com/cellbox/cellbox/sandbox/image"
)

// requireImage makes sure image cellbox/NAME, with package pkg, exists for
// backend kind: built (debootstrap, minutes) and for Docker imported when
// CI or CELLBOX_TEST_IMAGES=1 is set, else the test is skipped.
func requireImage(t *testing.T, kind, name, pkg string) {
	t.Helper()
	dir := testenv.ImagesDir()
	in, err := image.Read(image.RootfsDir(dir, name))
	fresh := err == nil && slices.Contains(in.Packages, pkg)
	var db *docker.Backend
	if kind == "docker" {
		db, err = docker.New(context.Background(), docker.Options{})
		require.NoError(t, err)
		defer db.Close()
		id, err := db.ImageID(context.Background(), image.Ref(name))
		require.NoError(t, err)
		if fresh && id != "" {
			return
		}
	} else if fresh {
		return
	}
	if !testenv.InCI() && os.Getenv("CELLBOX_TEST_IMAGES") != "1" {
		t.Skipf("cellbox/%s with %s is not built for %s in %s: run `cellbox image build %s --force --images %s` (or set CELLBOX_TEST_IMAGES=1 to build it here)", name, pkg, kind, dir, name, dir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	in, _, err = image.Build(ctx, image.BuildOptions{ImagesDir: dir, Name: name, Force: !fresh})
	require.NoError(t, err, "build cellbox/%s", name)
	if db != nil {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(image.Tar(ctx, in.Rootfs, pw)) }()
		_, err := db.ImportImage(ctx, image.Ref(name), pr)
		pr.CloseWithError(err)
		require.NoError(t, err, "import cellbox/%s into Docker", name)
	}
}

// TestRunCode drives run_code and code contexts on both backends, in the
// default image (the host's python3, node and bash).
func TestRunCode(t *testing.T) {
	testenv.RequireCommand(t, "node") // the default image is the host's /usr
	for _, kind := range []string{"local", "docker"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			rb := newRealService(t, kind, nil)

			// Stateless: the last expression's value; nothing is kept.
			r := rb.ok("run_code", map[string]any{"language": "python", "code": "x = 6 * 7\nprint('hi')\nx"})
			assert.Equal(t, "42", r["value"])
			assert.Equal(t, "hi\n", r["stdout"])
			assert.Nil(t, r["context"])
			r = rb.ok("run_code", map[string]any{"language": "python", "code": "x"})
			require.NotNil(t, r["exception"], "a stateless run does not see the last one's variables")
			assert.Equal(t, "NameError", r["exception"].(map[string]any)["name"])

			// A context keeps variables and imports.
			py := rb.ok("code_context_create", map[string]any{"language": "python"})["id"].(string)
			rb.ok("run_code", map[string]any{"context": py, "code": "import math\nv = 10"})
			r = rb.ok("run_code", map[string]any{"context": py, "code": "math.sqrt(v * 10)"})
			assert.Equal(t, "10.0", r["value"])

			// An exception comes back with its traceback; the context lives on.
			r = rb.ok("run_code", map[string]any{"context": py, "code": "def f():\n    return 1 / 0\n\nf()"})
			exc := r["exception"].(map[string]any)
			assert.Equal(t, "ZeroDivisionError", exc["name"])
			assert.Contains(t, exc["traceback"], "return 1 / 0")
			assert.Equal(t, "10", rb.ok("run_code", map[string]any{"context": py, "code": "v"})["value"])

			// A timeout interrupts the cell, not the context.
			r = rb.ok("run_code", map[string]any{"context": py, "code": "w = 1\nwhile True: pass", "timeout_ms": 500})
			assert.Equal(t, true, r["timed_out"])
			assert.Equal(t, "KeyboardInterrupt", r["exception"].(map[string]any)["name"])
			assert.Contains(t, r["hint"], "keeps its state")
			assert.Equal(t, "11", rb.ok("run_code", map[string]any{"context": py, "code": "v + w"})["value"])

			// A shell call ends what it leaves running, never a context.
			r = rb.ok("shell", map[string]any{"command": "sleep 100 &"})
			assert.Contains(t, r["notice"], "ended 1 process the command left running", "%v", r)
			assert.Equal(t, "11", rb.ok("run_code", map[string]any{"context": py, "code": "v + w"})["value"], "the context outlives the sweep")

			// bash keeps its cwd and variables; javascript its bindings.
			sh := rb.ok("code_context_create", map[string]any{"language": "bash"})["id"].(string)
			rb.ok("run_code", map[string]any{"context": sh, "code": "mkdir -p /tmp/here && cd /tmp/here && X=1"})
			r = rb.ok("run_code", map[string]any{"context": sh, "code": "pwd; echo $X"})
			assert.Equal(t, "/tmp/here\n1\n", r["stdout"])
			assert.EqualValues(t, 0, r["exit_code"])
			js := rb.ok("code_context_create", map[string]any{"language": "javascript"})["id"].(string)
			rb.ok("run_code", map[string]any{"context": js, "code": "let n = 5; const os = require('os')"})
			r = rb.ok("run_code", map[string]any{"context": js, "code": "[n * 2, typeof os.hostname()]"})
			assert.Equal(t, "[ 10, 'string' ]", r["value"])

			list := rb.ok("code_context_list", map[string]any{})["contexts"].([]any)
			assert.Len(t, list, 3)

			// Bad input gets errors that say what to do.
			errs := []struct{ tool, want string }{
				{"run_code", `language: must be one of "python", "javascript", "bash" (got "ruby")`},
				{"run_code", "needs a language"},
				{"run_code", "no code context python-" + "nope"},
				{"run_code", "is not a bash context"},
				{"code_context_delete", "ended: it was deleted"},
			}
			inputs := []map[string]any{
				{"language": "ruby", "code": "1"},
				{"code": "1"},
				{"context": "python-nope", "code": "1"},
				{"context": py, "language": "bash", "code": "1"},
				{"id": js},
			}
			rb.ok("code_context_delete", map[string]any{"id": js})
			for i, e := range errs {
				m := rb.call(e.tool, inputs[i])
				require.Equal(t, true, m["is_error"], "%s %v: %v", e.tool, inputs[i], m)
				assert.Contains(t, m["error"], e.want, "%s %v", e.tool, inputs[i])
			}

			// The cap on contexts per box holds for stateless runs too.
			for range agent.MaxCodeContexts - 2 {
				rb.ok("code_context_create", map[string]any{"language": "bash"})
			}
			m := rb.call("code_context_create", map[string]any{"language": "bash"})
			assert.Equal(t, api.CodeLimit, m["code"], "%v", m)
			m = rb.call("run_code", map[string]any{"language": "bash", "code": "true"})
			assert.Equal(t, api.CodeLimit, m["code"], "%v", m)
			assert.Contains(t, m["error"], "a run without context needs an interpreter of its own")

			// A box that restarts loses its contexts, and says so.
			require.NoError(t, syscall.Kill(rb.agentPID(rb.id("default")), syscall.SIGKILL))
			rb.waitStopped(rb.id("default"))
			m = rb.call("run_code", map[string]any{"context": py, "code": "v"})
			require.Equal(t, true, m["is_error"], "%v", m)
			assert.Contains(t, m["error"], "before it restarted (or slept and woke)")
			assert.Equal(t, api.CodeNotFound, m["code"])
		})
	}
}

// TestRunCodeOutOfMemory: a context whose interpreter the kernel kills
// for want of memory says so, on both backends (it said "its interpreter
// exited (exit code -1)").
func TestRunCodeOutOfMemory(t *testing.T) {
	for _, kind := range []string{"local", "docker"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			rb := newRealService(t, kind, nil)
			rb.ok("sandbox_create", map[string]any{"sandbox": "small", "limits": map[string]any{"memory_bytes": 64 << 20}})
			py := rb.ok("code_context_create", map[string]any{"sandbox": "small", "language": "python"})["id"].(string)
			r := rb.ok("run_code", map[string]any{"sandbox": "small", "context": py, "code": "b = b'x' * (512 << 20)"})
			exc := r["exception"].(map[string]any)
			assert.Equal(t, "ContextEnded", exc["name"])
			msg := exc["message"].(string)
			assert.Contains(t, msg, "code context "+py+" ended: its interpreter was killed by SIGKILL")
			assert.Regexp(t, "out.of.memory", msg) // Docker's boxes see the OOM counter; bubblewrap's infer it from the SIGKILL
			assert.Contains(t, msg, "memory limit 64 MiB")
		})
	}
}

// TestRunCodeAfterKillAll: a context whose interpreter process kill_all
// ended says so, on both backends; it said the interpreter "was killed by
// SIGKILL, which in a box is most often the kernel's out-of-memory killer"
// (on bubblewrap, which cannot see the box's OOM counter), though the agent
// had sent that SIGKILL itself.
func TestRunCodeAfterKillAll(t *testing.T) {
	for _, kind := range []string{"local", "docker"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			rb := newRealService(t, kind, nil)
			py := rb.ok("code_context_create", map[string]any{"language": "python"})["id"].(string)
			rb.ok("run_code", map[string]any{"context": py, "code": "v = 1"})
			// A shell call running meanwhile is not told of an OOM kill either.
			shell := make(chan map[string]any, 1)
			go func() { shell <- rb.call("shell", map[string]any{"command": "sleep 30"}) }()
			require.Eventually(t, func() bool {
				return rb.ok("shell", map[string]any{"command": "ps -eo args= | grep -c '^sleep 30' || true"})["stdout"] == "1\n"
			}, 20*time.Second, 50*time.Millisecond)
			k := rb.ok("process", map[string]any{"action": "kill_all"})
			assert.EqualValues(t, 2, k["ended"], "the interpreter and the shell call's command")
			sh := <-shell
			assert.NotRegexp(t, "out.of.memory", sh["notice"], "%v", sh)
			m := rb.call("run_code", map[string]any{"context": py, "code": "v"})
			require.Equal(t, true, m["is_error"], "%v", m)
			msg := m["error"].(string)
			assert.Contains(t, msg, "code context "+py+" ended: its interpreter was killed by process kill_all")
			assert.NotRegexp(t, "out.of.memory", msg)
		})
	}
}

// TestRunCodePlot checks that a matplotlib plot comes back as a PNG, in
// the python image on both backends.
func TestRunCodePlot(t *testing.T) {
	for _, kind := range []string{"local", "docker"} {
		t.Run(kind, func(t *testing.T) {
			requireImage(t, kind, "python", "python3-matplotlib")
			rb := newRealService(t, kind, nil)
			rb.ok("sandbox_create", map[string]any{"image": "cellbox/python"})
			pngs := func(r map[string]any) [][]byte {
				var out [][]byte
				outs, _ := r["outputs"].([]any)
				for _, o := range outs {
					o := o.(map[string]any)
					require.Equal(t, "image/png", o["mime"])
					require.Equal(t, "base64", o["encoding"])
					b, err := base64.StdEncoding.DecodeString(o["data"].(string))
					require.NoError(t, err)
					out = append(out, b)
				}
				return out
			}
			png := []byte("\x89PNG\r\n\x1a\n")
			r := rb.ok("run_code", map[string]any{"language": "python", "timeout_ms": 120000,
				"code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"})
			assert.Nil(t, r["exception"])
			got := pngs(r)
			require.Len(t, got, 1, "plt.show() gives one PNG (stderr %q, exception %v)", r["stderr"], r["exception"])
			assert.True(t, bytes.HasPrefix(got[0], png), "a PNG: %q", got[0][:min(16, len(got[0]))])

			r = rb.ok("run_code", map[string]any{"language": "python", "timeout_ms": 120000,
				"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\nplt.plot([2, 1])\nplt.show()"})
			require.Len(t, pngs(r), 2, "each plt.show() shows its figures and closes them (stderr %q, exception %v)", r["stderr"], r["exception"])

			r = rb.ok("run_code", map[string]any{"language": "python", "timeout_ms": 120000,
				"code": "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.bar([1, 2], [3, 4])\nfig"})
			got = pngs(r)
			require.Len(t, got, 1, "a figure as last expression gives one PNG (value %v, exception %v)", r["value"], r["exception"])
			assert.True(t, bytes.HasPrefix(got[0], png))
		})
	}
}

// TestRunCodeNodeImage runs JavaScript in the node image (Debian's node)
// on both backends, top-level await included.
func TestRunCodeNodeImage(t *testing.T) {
	for _, kind := range []string{"local", "docker"} {
		t.Run(kind, func(t *testing.T) {
			requireImage(t, kind, "node", "nodejs")
			rb := newRealService(t, kind, nil)
			rb.ok("sandbox_create", map[string]any{"image": "cellbox/node"})
			js := rb.ok("code_context_create", map[string]any{"language": "javascript"})["id"].(string)
			rb.ok("run_code", map[string]any{"context": js, "code": "const fs = require('fs'); let got = await fs.promises.readdir('/')"})
			r := rb.ok("run_code", map[string]any{"context": js, "code": "got.includes('workspace')"})
			assert.Equal(t, "true", r["value"], "%v", r)
		})
	}
}

// TestRunCodeRefusedWithAllowedCommands: a session limited to
// allowed_commands cannot run arbitrary code through run_code.
func TestRunCodeRefusedWithAllowedCommands(t *testing.T) {
	s := newTestService(t, newFakeBackend(t), "", nil)
	h := newSessionWith(t, s, api.NewSessionRequest{AllowedCommands: []string{"git status"}})
	for tool, in := range map[string]map[string]any{
		"run_code":            {"language": "python", "code": "import os; os.system('id')"},
		"code_context_create": {"language": "python"},
	} {
		m := h.call(tool, in)
		require.Equal(t, true, m["is_error"], "%s: %v", tool, m)
		assert.Equal(t, api.CodeRefused, m["code"])
		assert.Contains(t, m["error"], "allowed_commands")
	}
}
