package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/kube"
	"github.com/cellbox/cellbox/server"
)

// The environment of the kubernetes backend (docs/kubernetes.md), beside
// KUBECONFIG, read as kubectl reads it.
const (
	KubeNamespaceEnv     = "CELLBOX_KUBE_NAMESPACE"      // default kube.DefaultNamespace
	KubeImageEnv         = "CELLBOX_KUBE_IMAGE"          // the image of a box of the default image; default kube.DefaultImage
	KubeAgentImageEnv    = "CELLBOX_KUBE_AGENT_IMAGE"    // default kube.AgentImage of the agent binary
	KubeNetworkPolicyEnv = "CELLBOX_KUBE_NETWORK_POLICY" // probe (default), enforced, unenforced
	KubeRuntimeClassEnv  = "CELLBOX_KUBE_RUNTIME_CLASS"  // a RuntimeClass for every box (gvisor, kata)
	KubeNodeSelectorEnv  = "CELLBOX_KUBE_NODE_SELECTOR"  // k=v,k=v
	KubeTolerationsEnv   = "CELLBOX_KUBE_TOLERATIONS"    // a JSON list of tolerations, as in a pod spec
	KubeSeccompEnv       = "CELLBOX_KUBE_SECCOMP"        // a Localhost seccomp profile of the nodes; default RuntimeDefault
	KubePullPolicyEnv    = "CELLBOX_KUBE_PULL_POLICY"    // IfNotPresent (default), Never, Always
)

// openKube opens the kubernetes backend as the environment says. Stopped
// boxes' workspaces are kept by keeper (nil: in DATA/kube-kept).
func openKube(ctx context.Context, dataDir, agentBinary string, keeper backend.Keeper) (backend.Backend, error) {
	if agentBinary == "" {
		// The cellbox that ran this cellbox-cluster, if one did: its agent
		// image is the one `cellbox image agent` made.
		agentBinary = server.Executable()
	}
	if keeper == nil {
		keeper = backend.DirKeeper(filepath.Join(dataDir, "kube-kept"))
	}
	o := kube.Options{
		AgentBinary:      agentBinary,
		Namespace:        os.Getenv(KubeNamespaceEnv),
		DefaultImage:     os.Getenv(KubeImageEnv),
		AgentImage:       os.Getenv(KubeAgentImageEnv),
		NetworkPolicy:    os.Getenv(KubeNetworkPolicyEnv),
		RuntimeClass:     os.Getenv(KubeRuntimeClassEnv),
		SeccompLocalhost: os.Getenv(KubeSeccompEnv),
		PullPolicy:       corev1.PullPolicy(os.Getenv(KubePullPolicyEnv)),
		Keeper:           keeper,
	}
	switch o.NetworkPolicy {
	case "", "probe", "enforced", "unenforced":
	default:
		return nil, fmt.Errorf("%s=%q: want probe, enforced or unenforced", KubeNetworkPolicyEnv, o.NetworkPolicy)
	}
	switch o.PullPolicy {
	case "", corev1.PullIfNotPresent, corev1.PullNever, corev1.PullAlways:
	default:
		return nil, fmt.Errorf("%s=%q: want IfNotPresent, Never or Always", KubePullPolicyEnv, o.PullPolicy)
	}
	if sel := os.Getenv(KubeNodeSelectorEnv); sel != "" {
		o.NodeSelector = map[string]string{}
		for _, kv := range strings.Split(sel, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return nil, fmt.Errorf("%s=%q: want key=value pairs separated by commas", KubeNodeSelectorEnv, sel)
			}
			o.NodeSelector[k] = v
		}
	}
	if tol := os.Getenv(KubeTolerationsEnv); tol != "" {
		if err := json.Unmarshal([]byte(tol), &o.Tolerations); err != nil {
			return nil, fmt.Errorf("%s: want a JSON list of tolerations, as in a pod spec ([{\"key\": \"sandbox\", \"operator\": \"Exists\", \"effect\": \"NoSchedule\"}]): %w", KubeTolerationsEnv, err)
		}
	}
	return kube.New(ctx, o)
}
