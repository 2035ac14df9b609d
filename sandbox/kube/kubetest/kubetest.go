// Package kubetest is the test side of the kubernetes backend: it finds
// the repository's test cluster (scripts/kube-cluster.sh up), gives a test
// a namespace of its own under the restricted Pod Security Standard, and
// loads the images boxes need (the agent image of the binary under test,
// cellbox/base) into every node.
package kubetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/backend/seccomp"
	"github.com/cellbox/cellbox/sandbox/image"
	"github.com/cellbox/cellbox/sandbox/kube"
)

// Env names a kubeconfig of the cluster to test against; default
// DefaultKubeconfig, the test cluster's.
const Env = "CELLBOX_KUBECONFIG"

// DefaultKubeconfig is where scripts/kube-cluster.sh up writes the
// cluster's admin kubeconfig.
const DefaultKubeconfig = "/var/lib/cellbox-kube/cluster/admin.kubeconfig"

// kubectl is the test cluster's kubectl (scripts/kube-cluster.sh build).
const kubectl = "/var/lib/cellbox-kube/bin/kubectl"

// Cluster returns the kubeconfig of the cluster, or fails the test (under
// CI) or skips it when there is none: `bash scripts/kube-cluster.sh up`
// makes one.
func Cluster(t testing.TB) string {
	t.Helper()
	kc := kubeconfig()
	if _, err := os.Stat(kc); err != nil {
		testenv.Missing(t, "a Kubernetes cluster (bash scripts/kube-cluster.sh up, or "+Env+"=KUBECONFIG)")
	}
	if out, err := Kubectl(kc, "get", "--raw", "/readyz"); err != nil {
		testenv.Missing(t, fmt.Sprintf("a Kubernetes cluster that answers (%s: %v: %s; bash scripts/kube-cluster.sh up)", kc, err, out))
	}
	return kc
}

// Kubectl runs the cluster's kubectl (or the one on PATH) with kubeconfig.
func Kubectl(kubeconfig string, args ...string) (string, error) {
	bin := kubectl
	if _, err := os.Stat(bin); err != nil {
		bin = "kubectl"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", kubeconfig}, args...)...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// Namespace makes a namespace for the test, labelled so that the API
// server enforces the restricted Pod Security Standard in it, and deletes
// it (with every box left in it) when the test ends.
func Namespace(t testing.TB, kubeconfig string) string {
	t.Helper()
	b := make([]byte, 4)
	rand.Read(b)
	ns := "cbt-" + hex.EncodeToString(b)
	out, err := Kubectl(kubeconfig, "create", "namespace", ns)
	require.NoError(t, err, out)
	out, err = Kubectl(kubeconfig, "label", "namespace", ns,
		"pod-security.kubernetes.io/enforce=restricted", "pod-security.kubernetes.io/enforce-version=latest")
	require.NoError(t, err, out)
	t.Cleanup(func() { Kubectl(kubeconfig, "delete", "namespace", ns, "--wait=false") })
	return ns
}

var (
	loadOnce sync.Once
	loadErr  error
)

// LoadImages loads the agent image of the binary under test and
// cellbox/base (built with debootstrap if this machine has none) into
// every node of the test cluster, once per test process.
func LoadImages(t testing.TB) {
	t.Helper()
	bin := testenv.CellboxBinary(t)
	loadOnce.Do(func() { loadErr = loadImages(bin) })
	require.NoError(t, loadErr, "load the box images into the cluster's nodes")
}

func loadImages(bin string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "cellbox-kube-images-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ref, err := backend.AgentImage(bin)
	if err != nil {
		return err
	}
	var files []string
	if !onNodes("docker.io/" + ref) {
		agentTar := filepath.Join(dir, "agent.tar")
		if err := writeFile(agentTar, func(f *os.File) error { return image.WriteAgentOCI(ctx, bin, ref, dir, f) }); err != nil {
			return err
		}
		files = append(files, agentTar)
	}
	if !onNodes("docker.io/cellbox/base:latest") {
		imgs := testenv.ImagesDir()
		in, err := image.Read(image.RootfsDir(imgs, "base"))
		if err != nil {
			if in, _, err = image.Build(ctx, image.BuildOptions{ImagesDir: imgs, Name: "base"}); err != nil {
				return fmt.Errorf("build cellbox/base: %w", err)
			}
		}
		baseTar := filepath.Join(dir, "base.tar")
		if err := writeFile(baseTar, func(f *os.File) error {
			_, err := image.WriteOCI(ctx, in.Rootfs, "base", f, image.OCIOptions{TempDir: dir})
			return err
		}); err != nil {
			return err
		}
		files = append(files, baseTar)
	}
	if len(files) > 0 {
		script := filepath.Join(testenv.RepoRoot(), "scripts", "kube-cluster.sh")
		out, err := exec.CommandContext(ctx, "bash", append([]string{script, "load"}, files...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("scripts/kube-cluster.sh load: %w: %s", err, out)
		}
	}
	// The nodes list their images in their status, which their kubelets
	// update every few seconds: a backend that never pulls checks there.
	for _, ref := range []string{"docker.io/" + ref, "docker.io/cellbox/base:latest"} {
		for {
			out, _ := Kubectl(kubeconfig(), "get", "nodes", "-o", "jsonpath={range .items[*]}{.status.images[*].names}{\"\\n\"}{end}")
			lines := strings.Split(strings.TrimSpace(out), "\n")
			all := len(lines) > 0 && out != ""
			for _, l := range lines {
				all = all && strings.Contains(l, `"`+ref+`"`)
			}
			if all {
				break
			}
			if ctx.Err() != nil {
				return fmt.Errorf("the nodes' status does not list image %s: %s", ref, out)
			}
			time.Sleep(time.Second)
		}
	}
	return nil
}

// kubeconfig is the test cluster's kubeconfig (Env, else the default).
func kubeconfig() string {
	if kc := os.Getenv(Env); kc != "" {
		return kc
	}
	return DefaultKubeconfig
}

// onNodes reports whether every node's containerd of the test cluster
// holds image ref.
func onNodes(ref string) bool {
	socks, _ := filepath.Glob("/var/lib/cellbox-kube/cluster/n*/run/containerd.sock")
	if len(socks) == 0 {
		return false
	}
	for _, s := range socks {
		out, err := exec.Command("ctr", "-a", s, "-n", "k8s.io", "images", "ls", "-q").Output()
		if err != nil || !strings.Contains("\n"+string(out), "\n"+ref+"\n") {
			return false
		}
	}
	return true
}

func writeFile(path string, write func(*os.File) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	err = write(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Seccomp is the name of cellbox's seccomp filter (package seccomp's
// Docker profile) as a Localhost profile of the test cluster's nodes.
const Seccomp = "cellbox.json"

// InstallSeccomp puts cellbox's seccomp filter into every node's kubelet
// seccomp directory (DIR/seccomp of its root dir), as an operator would
// on a real cluster, so that boxes refuse the calls they refuse on the
// other backends (Options.SeccompLocalhost Seccomp).
func InstallSeccomp(t testing.TB) {
	t.Helper()
	roots, _ := filepath.Glob("/var/lib/cellbox-kube/cluster/n*/kubelet")
	require.NotEmpty(t, roots, "the test cluster's kubelet root dirs")
	for _, r := range roots {
		dir := filepath.Join(r, "seccomp")
		require.NoError(t, os.MkdirAll(dir, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, Seccomp), []byte(seccomp.DockerProfile()), 0o644))
	}
}

// Setup readies the cluster for a test and gives it a namespace: the
// cluster's kubeconfig, the images and the seccomp profile in place, and
// a namespace under the restricted standard. It holds the cluster shared
// (Lock) until the test ends.
func Setup(t testing.TB) (kubeconfig, namespace string) {
	t.Helper()
	return setup(t, false)
}

// SetupAlone is Setup for a test that kills a node: it holds the cluster
// exclusively, so no other test's boxes are on the node it kills.
func SetupAlone(t testing.TB) (kubeconfig, namespace string) {
	t.Helper()
	return setup(t, true)
}

func setup(t testing.TB, alone bool) (kubeconfig, namespace string) {
	t.Helper()
	kc := Cluster(t)
	Lock(t, alone)
	LoadImages(t)
	InstallSeccomp(t)
	return kc, Namespace(t, kc)
}

// Options are the backend options of a test: the test cluster's images
// never pulled, cellbox's seccomp filter, a Keeper in a temporary
// directory.
func Options(t testing.TB, kubeconfig, namespace string) kube.Options {
	return kube.Options{Kubeconfig: kubeconfig, Namespace: namespace, AgentBinary: testenv.CellboxBinary(t),
		PullPolicy: corev1.PullNever, SeccompLocalhost: Seccomp, Keeper: backend.DirKeeper(t.TempDir())}
}

// Open opens the kubernetes backend with o.
func Open(t testing.TB, o kube.Options) *kube.Backend {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b, err := kube.New(ctx, o)
	require.NoError(t, err)
	return b
}

// ProcessEnv is the environment of a cellbox process that runs boxes on
// namespace of the test cluster (--backend kubernetes).
func ProcessEnv(kubeconfig, namespace string) []string {
	return []string{"KUBECONFIG=" + kubeconfig, "CELLBOX_KUBE_NAMESPACE=" + namespace,
		"CELLBOX_KUBE_PULL_POLICY=Never", "CELLBOX_KUBE_SECCOMP=" + Seccomp}
}

// Lock holds the test cluster until the test ends: shared by tests that
// only make boxes, exclusively by one that kills a node (the tests of
// several packages run at once, each in a process of its own).
func Lock(t testing.TB, exclusive bool) {
	t.Helper()
	f, err := os.OpenFile("/var/lib/cellbox-kube/tests.lock", os.O_CREATE|os.O_RDWR, 0o600)
	require.NoError(t, err)
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	require.NoError(t, syscall.Flock(int(f.Fd()), how))
	t.Cleanup(func() { f.Close() })
}

// Script runs scripts/kube-cluster.sh with args (kill-node N,
// start-node N).
func Script(t testing.TB, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(testenv.RepoRoot(), "scripts", "kube-cluster.sh")}, args...)...).CombinedOutput()
	require.NoError(t, err, "kube-cluster.sh %v: %s", args, out)
	return string(out)
}
