// Package sandboxtest starts the sandbox service on the real local
// (bubblewrap) backend, as `cellbox run` has it, and cleans up every box it
// made. It is the sandbox floor's test-support package, as net/http/httptest
// is net/http's: sandbox's own external tests and the tests of the packages
// above it (sandboxclient, builtins, server, examples, cmd/cellbox) use it;
// no package but a test-support one imports it.
package sandboxtest

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/docker"
	"github.com/cellbox/cellbox/sandbox/local"
)

// Options shape the service.
type Options struct {
	// Pool is the number of warm boxes of the default image (0: none, so
	// every box a test sees was asked for).
	Pool int
	// ImagesDir holds images built by `cellbox image build` ("" for the
	// default image only).
	ImagesDir string
	// Backend, if set, is the backend to use instead of a local one of
	// the data directory (the test removes its boxes; the namespace of a
	// kubernetes backend goes with the test).
	Backend backend.Backend
	// Wrap, if set, wraps the backend (to count the boxes it makes).
	Wrap func(backend.Backend) backend.Backend
	// Logger defaults to errors only: tests make boxes and nodes fail on
	// purpose.
	Logger *slog.Logger
	// SessionTTL is sandbox.Config.SessionTTL (0: the default).
	SessionTTL time.Duration
	// MaxSessions is sandbox.Config.MaxSessions (0: the default).
	MaxSessions int
}

// Service starts a sandbox service over a fresh, short data directory
// (agent socket paths are limited) and returns it with that directory.
// Cleanup closes the service and removes every box of the directory, also
// those of a test that failed half-way.
func Service(t testing.TB, opts Options) (*sandbox.Service, string) {
	t.Helper()
	if opts.Backend == nil {
		testenv.RequireBwrap(t)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	}
	dir, err := os.MkdirTemp("", "cbt-")
	require.NoError(t, err)
	be := opts.Backend
	if be == nil {
		lb, err := local.New(local.Options{Root: filepath.Join(dir, "local"), ImagesDir: opts.ImagesDir, Logger: opts.Logger})
		require.NoError(t, err)
		be = lb
	}
	if opts.Wrap != nil {
		be = opts.Wrap(be)
	}
	svc, err := sandbox.New(context.Background(), sandbox.Config{
		Backend:     be,
		DataDir:     dir,
		AgentBinary: testenv.CellboxBinary(t),
		Pool:        map[string]int{backend.DefaultImage: opts.Pool},
		Logger:      opts.Logger,
		SessionTTL:  opts.SessionTTL,
		MaxSessions: opts.MaxSessions,
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		svc.Close()
		RemoveBoxes(t, dir)
		os.RemoveAll(dir)
	})
	return svc, dir
}

// RemoveBoxes removes every local-backend box of a data directory (its
// local/ folder), running or not, and unmounts their host directories: the boxes of a server a test stopped
// (they outlive it, to be reattached) or killed. A box holds a mounted
// disk and processes, so a test that made boxes in a data dir calls this
// before the directory goes.
func RemoveBoxes(t testing.TB, dataDir string) {
	t.Helper()
	defer testenv.UnmountUnder(t, filepath.Join(dataDir, "boxes"))
	removeDockerBoxes(t, dataDir)
	root := filepath.Join(dataDir, "local")
	if _, err := os.Stat(root); err != nil {
		return
	}
	lb, err := local.New(local.Options{Root: root, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Errorf("remove the boxes of %s: %v", dataDir, err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	infos, err := lb.List(ctx, map[string]string{backend.LabelManaged: "1"})
	if err != nil {
		t.Errorf("remove the boxes of %s: %v", dataDir, err)
	}
	for _, in := range infos {
		if err := lb.Remove(ctx, in.ID); err != nil {
			t.Errorf("remove box %s of %s: %v", in.ID, dataDir, err)
		}
	}
}

// removeDockerBoxes removes the Docker boxes of a data directory (their
// host directories lie under it), with their disks: a server a test
// stopped puts them to sleep, and its data dir goes with the test, so
// nothing else would. Nothing to do where no engine answers.
func removeDockerBoxes(t testing.TB, dataDir string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
	db, err := docker.New(pctx, docker.Options{Logger: slog.New(slog.DiscardHandler)})
	pcancel()
	if err != nil {
		return
	}
	defer db.Close()
	infos, err := db.List(ctx, map[string]string{backend.LabelManaged: "1"})
	if err != nil {
		t.Errorf("remove the docker boxes of %s: %v", dataDir, err)
		return
	}
	for _, in := range infos {
		if in.HostDir != "" && strings.HasPrefix(in.HostDir, dataDir+"/") {
			if err := db.Remove(ctx, in.ID); err != nil {
				t.Errorf("remove docker box %s of %s: %v", in.ID, dataDir, err)
			}
		}
	}
}
