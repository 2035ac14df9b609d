package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/backend"
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
			pattern := writePattern(t, `name: `+name+`
cells:
  n: 1
nodes:
  slow:
    exec:
      command: 'sleep ${n == 1 ? 300 : 3}; echo done ${n}'
      cache: false
`)
			boxes := func() []string { return execBoxes(t, be, data, name) }
			if be == "docker" {
				t.Cleanup(func() { removeContainers(t, name) }) // if the test fails, its containers go
			}
			run := startRun(t, pattern, "--data", data, "--backend", be)
			poll(t, "the first run's box", func() bool { return len(boxes()) == 1 })
			_, errOut, err := cellbox(t, "cell", "set", "n", "2", "--data", data)
			require.NoError(t, err, errOut)
			poll(t, "the second run's box, alone", func() bool {
				b := boxes()
				return len(b) == 1 && strings.HasSuffix(b[0], "-2")
			})
			require.NoError(t, run.cmd.Process.Signal(syscall.SIGKILL))
			<-run.done
			run.done <- nil
			require.Equal(t, []string{"exec-" + name + ".slow-2"}, boxes(), "kill -9 left the running stage's box behind")

			out, errOut, err := cellbox(t, "run", pattern, "--once", "--data", data, "--backend", be)
			require.NoError(t, err, errOut)
			assert.Contains(t, out, `"stdout":"done 2\n"`, "the restart finished the stage")
			assert.Empty(t, boxes(), "no box of the killed run (or of the restart) is left")
			entries, err := os.ReadDir(filepath.Join(data, "boxes"))
			require.NoError(t, err)
			assert.Empty(t, entries, "no box directory is left in the data dir")
		})
	}
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
