// Package remotetest gives tests a Docker Engine on "another machine":
// dockerd in namespaces of its own (scripts/remote-engine.sh), whose
// filesystem is not this one's, reached only through its API socket, with
// the image remote boxes run by default (cellbox/base) loaded into it.
package remotetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/docker"
	"github.com/cellbox/cellbox/sandbox/image"
)

// Engine starts a Docker Engine on "another machine" for a test: dockerd
// in namespaces of its own (scripts/remote-engine.sh), whose filesystem is
// not this one's, reached only through its API socket. The engine is
// taken down when the test ends.
func Engine(t *testing.T) (host string) {
	t.Helper()
	testenv.RequireRoot(t, "a Docker Engine in namespaces of its own")
	for _, c := range []string{"dockerd", "docker-init", "ip", "nsenter", "unshare"} {
		testenv.RequireCommand(t, c)
	}
	script := filepath.Join(repoRoot(t), "scripts", "remote-engine.sh")
	b := make([]byte, 4)
	rand.Read(b)
	dir := "/var/lib/cbre-" + hex.EncodeToString(b) // short: its socket's path must fit
	out, err := exec.Command("bash", script, "up", dir).CombinedOutput()
	require.NoError(t, err, "remote engine up: %s", out)
	t.Cleanup(func() {
		if out, err := exec.Command("bash", script, "down", dir).CombinedOutput(); err != nil {
			t.Errorf("remote engine down: %v: %s", err, out)
		}
	})
	return "unix://" + dir + "/root/run/docker.sock"
}

// LoadBase puts cellbox/base (the default image of remote boxes) into
// the engine at host, building its rootfs first if this machine has none.
func LoadBase(t *testing.T, host string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	dir := testenv.ImagesDir()
	in, err := image.Read(image.RootfsDir(dir, "base"))
	if err != nil {
		testenv.RequireCommand(t, "debootstrap")
		in, _, err = image.Build(ctx, image.BuildOptions{ImagesDir: dir, Name: "base"})
		require.NoError(t, err, "build cellbox/base")
	}
	r, err := docker.NewRemote(ctx, docker.RemoteOptions{Host: host})
	require.NoError(t, err)
	defer r.Close()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(image.Tar(ctx, in.Rootfs, pw)) }()
	_, err = r.ImportImage(ctx, docker.DefaultRemoteImage, pr)
	pr.CloseWithError(err)
	require.NoError(t, err, "import cellbox/base into the remote engine")
}

// repoRoot is the repository's root: where this file's module is.
func repoRoot(t *testing.T) string {
	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}
