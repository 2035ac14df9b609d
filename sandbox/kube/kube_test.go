package kube_test

import (
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/backend/backendtest"
	"github.com/cellbox/cellbox/sandbox/kube/kubetest"
)

// TestConformance runs the portable backend suite on pods of the test
// cluster: Dial through the API server's port-forward, the workspace kept
// across Stop and Start by the Keeper, limits by the kubelet, the network
// by kube-router's NetworkPolicy controller.
func TestConformance(t *testing.T) {
	kc, ns := kubetest.Setup(t)
	o := kubetest.Options(t, kc, ns)
	first := kubetest.Open(t, o)
	require.Equal(t, backend.NetworkPolicy, first.Capabilities().Network, "the test cluster enforces NetworkPolicy (kube-router): %v", first.Capabilities().Limits.Warnings)
	backendtest.RunWith(t, func(t *testing.T) backend.Backend { return kubetest.Open(t, o) },
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
