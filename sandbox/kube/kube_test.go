package kube_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/backend/backendtest"
	"github.com/cellbox/cellbox/sandbox/kube"
	"github.com/cellbox/cellbox/sandbox/kube/kubetest"
)

// open opens the backend on namespace ns of the test cluster.
func open(t *testing.T, kc, ns string, keeper backend.Keeper) *kube.Backend {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b, err := kube.New(ctx, kube.Options{Kubeconfig: kc, Namespace: ns, Keeper: keeper, AgentBinary: testenv.CellboxBinary(t),
		PullPolicy: corev1.PullNever, SeccompLocalhost: kubetest.Seccomp})
	require.NoError(t, err)
	return b
}

// TestConformance runs the portable backend suite on pods of the test
// cluster: Dial through the API server's port-forward, the workspace kept
// across Stop and Start by the Keeper, limits by the kubelet.
func TestConformance(t *testing.T) {
	kc := kubetest.Cluster(t)
	kubetest.LoadImages(t)
	kubetest.InstallSeccomp(t)
	ns := kubetest.Namespace(t, kc)
	keeper := backend.DirKeeper(t.TempDir())
	first := open(t, kc, ns, keeper)
	require.Equal(t, backend.NetworkPolicy, first.Capabilities().Network, "the test cluster enforces NetworkPolicy (kube-router): %v", first.Capabilities().Limits.Warnings)
	backendtest.RunWith(t, func(t *testing.T) backend.Backend { return open(t, kc, ns, keeper) },
		backendtest.Options{AgentBinary: testenv.CellboxBinary(t), Unenforced: true, Outside: apiServer(t, kc)})
}

// apiServer is the API server's address: outside every box, reached from
// a pod of the test cluster only by a pod with network.
func apiServer(t *testing.T, kc string) string {
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	require.NoError(t, err)
	u, err := url.Parse(cfg.Host)
	require.NoError(t, err)
	return u.Host
}
