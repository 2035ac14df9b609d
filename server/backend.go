package server

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/docker"
	"github.com/cellbox/cellbox/sandbox/local"
)

// OpenBackend opens the named box backend: docker, docker-remote,
// kubernetes (where server/cluster is linked: its Kube*Env variables),
// local, or auto (docker when an engine answers, else local). Box files of
// the local backend live in DATA/local; its images are shared by every
// data dir (DefaultImagesDir).
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
