package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
)

// TestClusterAsksRunTheClusterBuild: cellbox is built without the
// cluster's clients; asked for --etcd or the kubernetes backend, it runs
// the command in cellbox-cluster beside it. Without one there (nor on
// PATH) it says how to build it, and makes nothing (no data dir).
func TestClusterAsksRunTheClusterBuild(t *testing.T) {
	bin := testenv.ClusterBinary(t)
	example, err := filepath.Abs("../../examples/csv-pipeline")
	require.NoError(t, err)
	asks := map[string][]string{
		"serve --etcd":      {"serve", "--etcd", "http://127.0.0.1:1", "--addr", "127.0.0.1:0"},
		"serve --backend":   {"serve", "--backend", "kubernetes", "--addr", "127.0.0.1:0"},
		"run --backend":     {"run", example, "--once", "--backend", "kubernetes"},
		"mcp --backend":     {"mcp", "--backend", "kubernetes"},
		"run, flag last":    {"run", "--once", example, "--backend=kubernetes"},
		"serve, etcd+blobs": {"serve", "--etcd", "http://127.0.0.1:1", "--blobs", "s3://b/p?endpoint=http://127.0.0.1:1"},
	}
	run := func(t *testing.T, bin string, env []string, args []string) (string, string, error) {
		data := filepath.Join(t.TempDir(), "data")
		cmd := exec.Command(bin, append(args, "--data", data)...)
		cmd.Env = append(cleanEnv(), env...)
		cmd.Stdin = nil
		out, err := cmd.CombinedOutput()
		return string(out), data, err
	}

	t.Run("alone", func(t *testing.T) {
		lonely := filepath.Join(t.TempDir(), "cellbox")
		copyFile(t, bin, lonely)
		for name, args := range asks {
			t.Run(name, func(t *testing.T) {
				out, data, err := run(t, lonely, []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, args)
				require.Error(t, err, out)
				assert.Contains(t, out, "needs cellbox-cluster")
				assert.Contains(t, out, "go build -tags cluster -o "+filepath.Join(filepath.Dir(lonely), "cellbox-cluster")+" ./cmd/cellbox")
				assert.NoDirExists(t, data, "refused before anything was made")
			})
		}
	})

	t.Run("a cellbox named cellbox-cluster", func(t *testing.T) {
		// cellbox copied as cellbox-cluster (no -tags cluster): refused,
		// not exec'd over and over.
		dir := t.TempDir()
		copyFile(t, bin, filepath.Join(dir, "cellbox"))
		copyFile(t, bin, filepath.Join(dir, "cellbox-cluster"))
		for _, b := range []string{"cellbox", "cellbox-cluster"} {
			out, data, err := run(t, filepath.Join(dir, b), nil, asks["serve --etcd"])
			require.Error(t, err, out)
			assert.Contains(t, out, filepath.Join(dir, "cellbox-cluster")+" is built without them")
			assert.NoDirExists(t, data)
		}
	})

	t.Run("beside", func(t *testing.T) {
		// A check only the cluster build makes: the kubernetes backend's
		// environment, refused before any cluster is asked.
		for _, args := range [][]string{asks["mcp --backend"], asks["run --backend"]} {
			out, _, err := run(t, bin, []string{"CELLBOX_KUBE_PULL_POLICY=sometimes"}, args)
			require.Error(t, err, out)
			assert.Contains(t, out, `CELLBOX_KUBE_PULL_POLICY="sometimes": want IfNotPresent, Never or Always`)
			assert.NotContains(t, out, "needs cellbox-cluster")
		}
	})

	t.Run("needless", func(t *testing.T) {
		// Nothing of the cluster asked: cellbox runs alone.
		lonely := filepath.Join(t.TempDir(), "cellbox")
		copyFile(t, bin, lonely)
		out, _, err := run(t, lonely, nil, []string{"run", example, "--once", "--backend", "local"})
		require.NoError(t, err, out)
		assert.Contains(t, out, `report = "13 sales, 1727.25 in all (smallest 50)"`)
	})
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	require.NoError(t, err)
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	require.NoError(t, err)
	_, err = io.Copy(out, in)
	require.NoError(t, err)
	require.NoError(t, out.Close())
}
