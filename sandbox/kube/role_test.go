package kube_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/kube/kubetest"
)

// TestLeastRole runs the backend as a service account that has exactly
// the Role of docs/kubernetes-role.yaml in the box namespace, and nothing
// else: the probe, a box's whole life (create, start, a command, sleep
// and wake with its files, remove) work; reading nodes is not needed (one
// CPU a box is the most it then allows, and it says so).
func TestLeastRole(t *testing.T) {
	kc, ns := kubetest.Setup(t)
	role, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docs", "kubernetes-role.yaml"))
	require.NoError(t, err)
	manifest := filepath.Join(t.TempDir(), "role.yaml")
	require.NoError(t, os.WriteFile(manifest, []byte(strings.ReplaceAll(string(role), "namespace: cellbox", "namespace: "+ns)), 0o600))
	for _, args := range [][]string{
		{"apply", "-f", manifest},
		{"-n", ns, "create", "serviceaccount", "cellbox"},
		{"-n", ns, "create", "rolebinding", "cellbox", "--role", "cellbox", "--serviceaccount", ns + ":cellbox"},
	} {
		out, err := kubetest.Kubectl(kc, args...)
		require.NoError(t, err, "kubectl %v: %s", args, out)
	}
	token, err := kubetest.Kubectl(kc, "-n", ns, "create", "token", "cellbox", "--duration", "1h")
	require.NoError(t, err, token)

	admin, err := clientcmd.LoadFromFile(kc)
	require.NoError(t, err)
	cluster := admin.Clusters[admin.Contexts[admin.CurrentContext].Cluster]
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = cluster
	cfg.AuthInfos["sa"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "sa", Namespace: ns}
	cfg.CurrentContext = "c"
	saConfig := filepath.Join(t.TempDir(), "sa.kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*cfg, saConfig))

	out, err := kubetest.Kubectl(saConfig, "get", "nodes")
	require.Error(t, err, "the service account cannot read nodes: %s", out)

	b := kubetest.Open(t, kubetest.Options(t, saConfig, ns))
	caps := b.Capabilities()
	assert.Equal(t, backend.NetworkPolicy, caps.Network, "the probe runs with the Role alone: %s", caps.NetworkNote)
	assert.Equal(t, 1, caps.MaxCPUs)
	c := up(t, b, backend.Spec{ID: "least"})
	assert.Equal(t, "hi\n", run(t, c, "echo hi > f && cat f").Stdout)
	ctx := context.Background()
	require.NoError(t, b.Stop(ctx, "least"))
	_, err = b.Start(ctx, "least")
	require.NoError(t, err)
	assert.Equal(t, "hi\n", run(t, c, "cat f").Stdout, "woken (a new pod) with its files")
	up(t, b, backend.Spec{ID: "least-2"})
	list, err := b.List(ctx, map[string]string{backend.LabelManaged: "1"})
	require.NoError(t, err)
	assert.Len(t, list, 2)
	require.NoError(t, b.Remove(ctx, "least"))
	_, err = b.Inspect(ctx, "least")
	assert.ErrorIs(t, err, backend.ErrNotFound)
}
