package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/image"
	"github.com/cellbox/cellbox/server"
	"github.com/cellbox/cellbox/server/runapi"
)

// TestRunKilledMidStageLeavesNoBox kills `cellbox run` (kill -9) while an
// exec stage sleeps in its box, restarts it and checks that the restart
// finishes the stage and that no box of the killed run is left on the
// backend (a local box directory, a Docker container), on both backends.
// The killed run's box is its node's second (a cell change aborted the
// first), so a restart that only replaces a box of the name it picks
// itself would not find it.
func TestRunKilledMidStageLeavesNoBox(t *testing.T) {
	for _, be := range []string{"local", "docker"} {
		t.Run(be, func(t *testing.T) {
			if be == "local" {
				testenv.RequireBwrap(t)
			} else {
				testenv.RequireDocker(t)
			}
			data := t.TempDir()
			name := "leftover" + randomHex(t)
			pattern := slowPattern(t, name)
			boxes := func() []string { return execBoxes(t, be, data, name) }
			if be == "docker" {
				t.Cleanup(func() { // if the test fails, its containers go
					removeContainers(t, name)
					for _, c := range dataDirBoxes(t, be, data) {
						exec.Command("docker", "rm", "-f", c).Run()
					}
				})
			}
			run := startRun(t, pattern, "--data", data, "--backend", be)
			// A box may come from the warm pool (over a new data dir the
			// first does), whose boxes keep the pool's labels (unnamed):
			// the log says when a stage has its box and when it is gone.
			logHas := func(re string) bool {
				log, _ := os.ReadFile(filepath.Join(data, "run.log"))
				return regexp.MustCompile(re).Match(log)
			}
			poll(t, "the first run's box", func() bool { return logHas(` name=exec-` + name + `\.slow-1 `) })
			_, errOut, err := cellbox(t, "cell", "set", "n", "2", "--data", data)
			require.NoError(t, err, errOut)
			poll(t, "the second run's box, alone", func() bool {
				return logHas(`msg="box destroyed" session=\S+ name=exec-`+name+`\.slow-1 `) && logHas(` name=exec-`+name+`\.slow-2 `)
			})
			require.NoError(t, run.cmd.Process.Signal(syscall.SIGKILL))
			<-run.done
			run.done <- nil
			left := dataDirBoxes(t, be, data)
			require.NotEmpty(t, left, "kill -9 left the running stage's box behind")

			out, errOut, err := cellbox(t, "run", pattern, "--once", "--data", data, "--backend", be)
			require.NoError(t, err, errOut)
			assert.Contains(t, out, `"stdout":"done 2\n"`, "the restart finished the stage")
			assert.Empty(t, boxes(), "no box of the killed run (or of the restart) is left")
			assert.Empty(t, dataDirBoxes(t, be, data), "no box of the data dir is left: the killed run's %v", left)
			entries, err := os.ReadDir(filepath.Join(data, "boxes"))
			require.NoError(t, err)
			if !assert.Empty(t, entries, "no box directory is left in the data dir") {
				out, _ := exec.Command("ls", "-laR", filepath.Join(data, "boxes")).CombinedOutput()
				t.Logf("%s", out)
			}
		})
	}
}

// slowPattern is a pattern whose stage sleeps 300 s while n is 1 and 10 s
// after (long enough that the second run's box is still there when the
// first's, aborted, is gone on a loaded machine), then says "done N".
func slowPattern(t *testing.T, name string) string {
	return writePattern(t, `name: `+name+`
cells:
  n: 1
nodes:
  slow:
    exec:
      command: 'sleep ${n == 1 ? 300 : 10}; echo done ${n}'
      cache: false
`)
}

// TestServeKilledMidStageLeavesNoBox is TestRunKilledMidStageLeavesNoBox
// under `cellbox serve` (bubblewrap), whose exec boxes are not stored
// either (one-shot, like run's): the killed server's box is an orphan
// that the next start removes, and the resumed pattern finishes the stage
// in a fresh box. A box of a tool API session named like an exec box is
// stored and kept asleep across the restart.
func TestServeKilledMidStageLeavesNoBox(t *testing.T) {
	testenv.RequireBwrap(t)
	ctx := context.Background()
	data := t.TempDir()
	name := "leftover" + randomHex(t)
	pattern := slowPattern(t, name)
	boxes := func() []string { return execBoxes(t, "local", data, name) }
	srv := startServe(t, data, "--pool", "0")
	c := runapi.NewClient(srv.url).WithKey(srv.key)
	_, err := c.Load(ctx, pattern, "", "")
	require.NoError(t, err)
	// A tool API session's box named like an exec box is an ordinary box.
	run := cli(t)
	env := newSession(t, srv.url, data)
	toolBox := "exec-" + name + ".mine-1"
	out, err := run(env, "tool", "shell", `{"sandbox":"`+toolBox+`","command":"echo kept > f"}`)
	require.NoError(t, err, out)

	poll(t, "the first run's box", func() bool { return len(boxes()) == 2 })
	_, err = c.Set(ctx, "n", json.RawMessage(`2`))
	require.NoError(t, err)
	poll(t, "the second run's box, beside the tool's", func() bool {
		b := boxes()
		return len(b) == 2 && slices.Contains(b, "exec-"+name+".slow-2")
	})
	require.NoError(t, srv.cmd.Process.Signal(syscall.SIGKILL))
	<-srv.done
	srv.done <- nil

	srv = startServe(t, data, "--pool", "0")
	c = runapi.NewClient(srv.url).WithKey(srv.key)
	poll(t, "the resumed stage's result", func() bool {
		cell, err := c.Get(ctx, name+"/slow")
		return err == nil && strings.Contains(string(cell.Value), `"stdout":"done 2\n"`)
	})
	// The resumed run's box goes once its result is in.
	poll(t, "the killed server's and the resumed run's boxes removed, the tool's kept", func() bool { return slices.Equal(boxes(), []string{toolBox}) })
	env[0] = "CELLBOX_SERVER=" + srv.url // the restarted server's port
	out, err = run(env, "tool", "shell", `{"sandbox":"`+toolBox+`","command":"cat f"}`)
	require.NoError(t, err, out)
	assert.Contains(t, out, `"stdout": "kept\n"`, "the tool session's box was kept, with its files")
}

// execBoxes lists the names of the exec boxes of pattern that exist on the
// backend for data dir data (sleeping or not): the local backend's box
// directories, Docker's containers with the cellbox labels.
func execBoxes(t *testing.T, be, data, pattern string) []string {
	t.Helper()
	var names []string
	switch be {
	case "local":
		specs, err := filepath.Glob(filepath.Join(data, "local", "*", "spec.json"))
		require.NoError(t, err)
		for _, f := range specs {
			raw, err := os.ReadFile(f)
			if err != nil {
				continue // being removed
			}
			var s struct{ Spec backend.Spec }
			require.NoError(t, json.Unmarshal(raw, &s))
			names = append(names, s.Spec.Labels[backend.LabelBox])
		}
	case "docker":
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, "docker", "ps", "-a", "--filter", "label="+backend.LabelManaged+"=1",
			"--format", `{{.Label "`+backend.LabelBox+`"}}`).Output()
		require.NoError(t, err)
		names = strings.Fields(string(out))
	}
	var mine []string
	for _, n := range names {
		if strings.HasPrefix(n, "exec-"+pattern+".") {
			mine = append(mine, n)
		}
	}
	return mine
}

// randomHex makes names unique to one test (other tests share Docker).
func randomHex(t *testing.T) string {
	b := make([]byte, 4)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// dataDirBoxes lists the IDs of every box on the backend of data dir
// data, named or not (a warm pool's): the local backend's box
// directories, Docker's containers that mount something of data.
func dataDirBoxes(t *testing.T, be, data string) []string {
	t.Helper()
	var ids []string
	switch be {
	case "local":
		specs, err := filepath.Glob(filepath.Join(data, "local", "*", "spec.json"))
		require.NoError(t, err)
		for _, f := range specs {
			ids = append(ids, filepath.Base(filepath.Dir(f)))
		}
	case "docker":
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, "docker", "ps", "-aq", "--filter", "label="+backend.LabelManaged+"=1").Output()
		require.NoError(t, err)
		for _, c := range strings.Fields(string(out)) {
			mounts, err := exec.CommandContext(ctx, "docker", "inspect", "--format", `{{range .Mounts}}{{.Source}} {{end}}`, c).Output()
			if err != nil {
				continue // removed meanwhile
			}
			if strings.Contains(string(mounts), data+string(filepath.Separator)) {
				ids = append(ids, c)
			}
		}
	}
	return ids
}

// removeContainers removes the Docker containers of pattern's exec boxes
// (this test's own: the pattern name is random).
func removeContainers(t *testing.T, pattern string) {
	out, err := exec.Command("docker", "ps", "-a", "--filter", "label="+backend.LabelManaged+"=1",
		"--format", `{{.ID}} {{.Label "`+backend.LabelBox+`"}}`).Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if id, box, ok := strings.Cut(line, " "); ok && strings.HasPrefix(box, "exec-"+pattern+".") {
			exec.Command("docker", "rm", "-f", id).Run()
		}
	}
}

// TestRetryAfterTheCauseIsFixed runs an exec node whose image is not built
// yet: it fails, and stays failed once the image exists, until `cellbox
// retry` runs it again (the memo cache bypassed).
func TestRetryAfterTheCauseIsFixed(t *testing.T) {
	testenv.RequireBwrap(t)
	data, images := t.TempDir(), t.TempDir()
	t.Setenv(server.ImagesEnv, images) // for the cellbox processes below
	pattern := writePattern(t, `name: later
nodes:
  job:
    exec:
      image: cellbox/tiny
      command: echo built
`)
	startRun(t, pattern, "--data", data, "--backend", "local")
	job := func() map[string]any {
		out, errOut, err := cellbox(t, "cell", "get", "job", "--data", data)
		require.NoError(t, err, errOut)
		var v map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &v), out)
		return v
	}
	poll(t, "the run to fail on the missing image", func() bool { return job()["error"] != nil })
	assert.Contains(t, job()["error"], `image "cellbox/tiny": no such image (`+"`cellbox image build` makes only cellbox/base, cellbox/node, cellbox/python)")

	makeRootfs(t, filepath.Join(images, "tiny", "rootfs")) // the image is built
	assert.NotNil(t, job()["error"], "a fixed cause alone does not rerun the node")

	out, errOut, err := cellbox(t, "retry", "job", "--data", data)
	require.NoError(t, err, errOut)
	assert.Equal(t, "retrying default/later/job (watch it: cellbox cell watch default/later/job)\n", out)
	poll(t, "the retried run to succeed", func() bool { return job()["error"] == nil && job()["pending"] == false })
	assert.Equal(t, "built\n", job()["result"].(map[string]any)["stdout"])

	for _, tc := range []struct{ node, msg string }{
		{"job", "the last run of node job did not fail"},
		{"nothing", `no cell "nothing"`},
	} {
		_, errOut, err = cellbox(t, "retry", tc.node, "--data", data)
		require.Error(t, err, tc.node)
		assert.Contains(t, errOut, tc.msg, tc.node)
	}
}

// makeRootfs makes a tiny cellbox image rootfs at dir, as `cellbox image
// build` would leave one: the skeleton of mount points, and a /usr with
// only dash (as sh) and the libraries it needs.
func makeRootfs(t *testing.T, dir string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o755))
	var skel bytes.Buffer
	require.NoError(t, image.SkeletonTar(&skel))
	tar := exec.Command("tar", "-x", "-C", dir)
	tar.Stdin = &skel
	out, err := tar.CombinedOutput()
	require.NoError(t, err, string(out))
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".cellbox", "cellbox"), nil, 0o755)) // the agent's mount point
	for src, dst := range map[string]string{
		"/usr/bin/dash":                   "usr/bin/sh",
		"/lib/x86_64-linux-gnu/libc.so.6": "usr/lib/x86_64-linux-gnu/libc.so.6",
		"/lib64/ld-linux-x86-64.so.2":     "usr/lib64/ld-linux-x86-64.so.2",
	} {
		b, err := os.ReadFile(src)
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, dst)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, dst), b, 0o755))
	}
}
