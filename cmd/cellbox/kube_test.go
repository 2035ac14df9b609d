package main

import (
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
	testenv.ClusterBinary(t) // cellbox execs it for the kubernetes backend
	runCSVPipeline(t, "kubernetes", kubetest.ProcessEnv(kc, ns)...)

	pods, err := kubetest.Kubectl(kc, "-n", ns, "get", "pods,secrets,networkpolicies", "-l", "app.kubernetes.io/managed-by=cellbox", "-o", "name")
	require.NoError(t, err, pods)
	assert.Empty(t, pods, "exec stages leave no pod, secret or policy behind")
}
