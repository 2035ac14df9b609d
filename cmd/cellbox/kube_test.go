package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/kube/kubetest"
)

// TestRunOnKubernetes runs the csv-pipeline example with its boxes as
// pods of the two-node test cluster (`--backend kubernetes`, configured
// by the environment alone): every stage runs there and the report is
// right; no pod of the run is left once it ends.
func TestRunOnKubernetes(t *testing.T) {
	kc, ns := kubetest.Setup(t)
	data, err := os.MkdirTemp("", "cbk8s-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(data) })
	example, err := filepath.Abs("../../examples/csv-pipeline")
	require.NoError(t, err)

	cmd := exec.Command(testenv.CellboxBinary(t), "run", example, "--once", "--backend", "kubernetes", "--data", data)
	cmd.Env = append(cleanEnv(), kubetest.ProcessEnv(kc, ns)...)
	out, err := cmd.Output()
	var stderr string
	if ee, ok := err.(*exec.ExitError); ok {
		stderr = string(ee.Stderr)
	}
	require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", out, stderr)
	assert.Contains(t, string(out), `report = "13 sales, 1727.25 in all (smallest 50)"`)

	pods, err := kubetest.Kubectl(kc, "-n", ns, "get", "pods,secrets,networkpolicies", "-l", "app.kubernetes.io/managed-by=cellbox", "-o", "name")
	require.NoError(t, err, pods)
	assert.Empty(t, pods, "exec stages leave no pod, secret or policy behind")
}
