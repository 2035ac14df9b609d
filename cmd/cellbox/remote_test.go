package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/docker/remotetest"
)

// TestRunOnRemoteEngine runs the csv-pipeline example with its boxes on a
// Docker Engine of another "machine" (namespaces of its own, nothing
// shared with this one but the API): `--backend docker-remote` with
// DOCKER_HOST. Every stage runs there and the report is right; no
// container is left on that engine once the run is stopped.
func TestRunOnRemoteEngine(t *testing.T) {
	host := remotetest.Engine(t)
	remotetest.LoadBase(t, host)
	runCSVPipeline(t, "docker-remote", "DOCKER_HOST="+host)

	ps := exec.Command("docker", "-H", host, "ps", "-a", "--filter", "label=cellbox.managed=1", "--format", "{{.Names}} {{.Status}}")
	got, err := ps.CombinedOutput()
	require.NoError(t, err, "%s", got)
	assert.Empty(t, strings.TrimSpace(string(got)), "exec stages leave no box on the engine")
}

// runCSVPipeline runs the csv-pipeline example once on backend, with env
// added to a clean environment, and checks its report.
func runCSVPipeline(t *testing.T, backend string, env ...string) {
	t.Helper()
	data, err := os.MkdirTemp("", "cbex-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(data) })
	example, err := filepath.Abs("../../examples/csv-pipeline")
	require.NoError(t, err)
	cmd := exec.Command(testenv.CellboxBinary(t), "run", example, "--once", "--backend", backend, "--data", data)
	cmd.Env = append(cleanEnv(), env...)
	out, err := cmd.Output()
	var stderr string
	if ee, ok := err.(*exec.ExitError); ok {
		stderr = string(ee.Stderr)
	}
	require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", out, stderr)
	assert.Contains(t, string(out), `report = "13 sales, 1727.25 in all (smallest 50)"`)
}
