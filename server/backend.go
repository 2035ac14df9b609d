package server

import (
	"context"
	"encoding/json"

	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/docker"
	"github.com/cellbox/cellbox/sandbox/kube"
	"github.com/cellbox/cellbox/sandbox/local"
)

// OpenBackend opens the named box backend: docker, docker-remote,
// kubernetes (KubeEnv's variables), local, or auto (docker when an engine answers, else local). Box files of the
// local backend live in DATA/local; its images are shared by every data
// dir (DefaultImagesDir).
//
// agentBinary is the static cellbox binary boxes run ("": this process's
// own), which the kubernetes backend's network policy probe runs too.
func OpenBackend(ctx context.Context, name, dataDir, agentBinary string) (backend.Backend, error) {
	return openBackend(ctx, name, dataDir, agentBinary, nil)
}

// openBackend is OpenBackend with the Keeper of the kubernetes backend's
// stopped boxes' workspaces (nil: DATA/kube-kept, this server's).
func openBackend(ctx context.Context, name, dataDir, agentBinary string, keeper backend.Keeper) (backend.Backend, error) {
	openLocal := func() (backend.Backend, error) {
		return local.New(local.Options{Root: filepath.Join(dataDir, "local"), ImagesDir: DefaultImagesDir()})
	}
	switch name {
	case "local":
		return openLocal()
	case "docker":
		return docker.New(ctx, docker.Options{})
	case "docker-remote":
		// An engine on another machine: DOCKER_HOST (tcp:// with
		// DOCKER_TLS_VERIFY and DOCKER_CERT_PATH, or a unix socket
		// forwarded over ssh), sharing nothing but its API.
		return docker.NewRemote(ctx, docker.RemoteOptions{DefaultImage: os.Getenv(RemoteImageEnv)})
	case "kubernetes":
		return openKube(ctx, dataDir, agentBinary, keeper)
	case "auto":
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		be, err := docker.New(pctx, docker.Options{})
		if err == nil {
			return be, nil
		}
		slog.Info("no Docker Engine answers; using the local (bubblewrap) backend", "err", err)
		return openLocal()
	}
	return nil, errUnknownBackend(name)
}

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

// RemoteImageEnv names the image boxes of the default image get on a
// remote engine (docker-remote); default docker.DefaultRemoteImage.
const RemoteImageEnv = "CELLBOX_REMOTE_IMAGE"

// CheckBackend checks a name for OpenBackend, as a flag is parsed: a bad
// name is refused before anything starts.
func CheckBackend(name string) error {
	switch name {
	case "docker", "docker-remote", "kubernetes", "local", "auto":
		return nil
	}
	return errUnknownBackend(name)
}

func errUnknownBackend(name string) error {
	return fmt.Errorf("unknown backend %q: want docker, docker-remote, kubernetes, local or auto", name)
}

// DataEnv names the default data directory.
const DataEnv = "CELLBOX_DATA"

// DefaultDataDir is $CELLBOX_DATA, else ~/.local/share/cellbox.
func DefaultDataDir() string {
	if d := os.Getenv(DataEnv); d != "" {
		return d
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "share", "cellbox")
	}
	return "cellbox-data"
}

// ImagesEnv names the images directory of the local backend's images
// (cellbox/NAME is DIR/NAME/rootfs).
const ImagesEnv = "CELLBOX_IMAGES"

// DefaultImagesDir is $CELLBOX_IMAGES, else the images folder of the
// default data dir. Images are built once and shared by every data dir,
// as Docker's are by every container: a run with --data DIR finds the
// images `cellbox image build` built, whatever DIR is.
func DefaultImagesDir() string {
	if d := os.Getenv(ImagesEnv); d != "" {
		return d
	}
	return filepath.Join(DefaultDataDir(), "images")
}
