package main

import (
	"cmp"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/cellbox/cellbox/server"
)

// clusterBinary is cellbox built with -tags cluster: cellbox with the
// cluster's clients (etcd, S3, Kubernetes) linked (server/cluster).
// cellbox itself starts without them, ~10 ms sooner on every command.
const clusterBinary = "cellbox-cluster"

// needCluster runs this command in cellbox-cluster when what it was asked
// needs the cluster's clients (a state shared over --etcd, the kubernetes
// backend) and this binary has none: it execs cellbox-cluster beside this executable,
// else on PATH, with the same arguments and environment (the same
// process: its pid, its signals, its stdio; server.ExecutableEnv names
// this binary, which boxes on Kubernetes run). It returns only when that
// binary is not there, or the exec failed; with the clients linked it
// returns nil at once.
func needCluster(backendName string, shared bool) error {
	what := "--etcd"
	if !shared {
		if backendName != "kubernetes" {
			return nil
		}
		what = "--backend kubernetes"
	}
	if server.ClusterLinked() {
		return nil
	}
	path := ""
	self, err := os.Executable()
	if err == nil {
		if p := filepath.Join(filepath.Dir(self), clusterBinary); isExecutable(p) {
			path = p
		}
	}
	if path == "" {
		p, err := exec.LookPath(clusterBinary)
		if err != nil {
			beside := filepath.Join(filepath.Dir(cmp.Or(self, os.Args[0])), clusterBinary)
			return fmt.Errorf("%s needs %s (cellbox with the cluster's clients) beside this cellbox or on PATH; %s", what, clusterBinary, buildCluster(beside))
		}
		path = p
	}
	if sameFile(path, self) {
		// A cellbox without the clients named cellbox-cluster: it would
		// exec itself for ever.
		return fmt.Errorf("%s needs the cluster's clients, and %s is built without them: %s", what, path, buildCluster(path))
	}
	slog.Debug("exec the cluster build", "for", what, "path", path)
	env := os.Environ()
	if self != "" {
		env = append(env, server.ExecutableEnv+"="+self)
	}
	err = syscall.Exec(path, append([]string{path}, os.Args[1:]...), env)
	return fmt.Errorf("%s: exec %s: %w", what, path, err)
}

// buildCluster says how to build cellbox-cluster at path.
func buildCluster(path string) string {
	return "build it with `CGO_ENABLED=0 go build -tags cluster -o " + path + " ./cmd/cellbox` (docs/cluster.md)"
}

func sameFile(a, b string) bool {
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	return err == nil && os.SameFile(fa, fb)
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}
