package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/docker"
	"github.com/cellbox/cellbox/sandbox/local"
)

func init() {
	register(command{
		name:  "serve",
		usage: "[--addr 127.0.0.1:7077] [--data DIR] [--backend auto|docker|docker-remote|local] [--pool N] [--max-boxes-per-session N] [--max-boxes N] [--max-sessions N] [--max-snapshot-bytes N] [--session-ttl 24h] [--agent-binary PATH] [--key-file F] [--allowed-host H]...  serve the sandbox tool API and the runtime API (patterns, cells) over HTTP",
		run:   runServe,
	})
}

// defaultAddr is where serve listens and the clients look by default.
const defaultAddr = "127.0.0.1:7077"

func runServe(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	addr := fs.String("addr", defaultAddr, "address to listen on")
	data := fs.String("data", defaultDataDir(), "data directory: state file, box directories (images are shared: env "+imagesEnv+")")
	backendName := addBackendFlag(fs, "box backend `name`: docker, docker-remote (an engine on another machine, DOCKER_HOST), local (bubblewrap), or auto (docker if an engine answers, else local)")
	agentBinary := fs.String("agent-binary", "", "static cellbox binary run as the agent in every box (default: this executable)")
	pool := fs.Int("pool", sandbox.DefaultPoolSize, "pre-started boxes kept for the default image (0: none)")
	maxPerSession := fs.Int("max-boxes-per-session", sandbox.DefaultMaxBoxesPerSession, "sandboxes one session may have at once")
	maxBoxes := fs.Int("max-boxes", sandbox.DefaultMaxBoxes, "sandboxes all sessions together may have at once")
	maxSessions := fs.Int("max-sessions", sandbox.DefaultMaxSessions, "sessions that may exist at once")
	maxSnapBytes := fs.Int64("max-snapshot-bytes", sandbox.DefaultMaxSnapshotBytes, "bytes one session's snapshots may take in the store (deduplicated)")
	sessionTTL := fs.Duration("session-ttl", sandbox.DefaultSessionTTL, "delete a session and its boxes after it was idle this long (0: never)")
	httpOpts := addHTTPFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	dataDir, err := filepath.Abs(*data)
	if err != nil {
		return err
	}
	state, err := openState(dataDir) // cells, sessions and boxes: one file
	if err != nil {
		return err
	}
	defer state.Close()
	store := state.cells
	be, err := openBackend(ctx, *backendName, dataDir)
	if err != nil {
		return err
	}
	svc, err := sandbox.New(ctx, sandbox.Config{
		Backend:     be,
		DataDir:     dataDir,
		State:       state.sandbox,
		AgentBinary: *agentBinary,
		Pool:        map[string]int{backend.DefaultImage: max(*pool, 0)},

		MaxBoxesPerSession: *maxPerSession,
		MaxBoxes:           *maxBoxes,
		MaxSessions:        *maxSessions,
		MaxSnapshotBytes:   *maxSnapBytes,
		SessionTTL:         ttlConfig(*sessionTTL),
	})
	if err != nil {
		return err
	}
	defer svc.Close()
	boxes, err := openSandboxes(ctx, store, slog.Default(), svc)
	if err != nil {
		return err
	}
	host, err := newRuntimeHost(dataDir, store, boxes, slog.Default(), true)
	if err != nil {
		return err
	}
	defer host.close()
	host.opts = *httpOpts
	if _, err := host.serve(); err != nil { // DATA/run.sock, for `cellbox cell` and `cellbox send`
		return err
	}
	base, key, created, errc, err := host.serveHTTP(*addr) // stopped by host.close
	if err != nil {
		return err
	}
	// The patterns loaded before a restart run again, where they stood.
	resumed, err := host.api.Resume(ctx)
	if err != nil {
		slog.Warn("some loaded patterns could not be resumed", "err", err)
		fmt.Fprintf(os.Stderr, "cellbox: %v\n", err)
	}
	for _, in := range resumed {
		fmt.Fprintf(os.Stderr, "cellbox: resumed pattern %s/%s\n", in.Space, in.Name)
	}
	slog.Info("cellbox serving", "url", base, "backend", be.Name(), "data", dataDir)
	fmt.Fprintf(os.Stderr, "cellbox: serving on %s (backend %s, data %s)\n  page: %s/#token=%s · try: eval \"$(cellbox session new --server %s%s)\"; cellbox tool shell '{\"command\":\"uname -a\"}'\n", base, be.Name(), dataDir, base, key, base, dataFlag(*data))
	if created {
		fmt.Fprintf(os.Stderr, "  made a server key (the token above; kept 0600 in %s: `cellbox session new` reads it there, or set %s)\n", keyPathOf(host), keyEnv)
	}
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	// The deferred closes stop the APIs and put every box to sleep.
	signal.Reset(os.Interrupt, syscall.SIGTERM) // a second Ctrl-C quits at once
	fmt.Fprintln(os.Stderr, "cellbox serve: stopping, putting the boxes to sleep (Ctrl-C again to quit at once)")
	return nil
}

// ttlConfig turns --session-ttl (0: never) into Config.SessionTTL (0:
// the default, negative: never).
func ttlConfig(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}

// openBackend opens the named box backend: docker, local, or auto (docker
// when an engine answers, else local). Box files of the local backend live
// in DATA/local; its images are shared by every data dir
// (defaultImagesDir).
func openBackend(ctx context.Context, name, dataDir string) (backend.Backend, error) {
	openLocal := func() (backend.Backend, error) {
		return local.New(local.Options{Root: filepath.Join(dataDir, "local"), ImagesDir: defaultImagesDir()})
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
		return docker.NewRemote(ctx, docker.RemoteOptions{DefaultImage: os.Getenv(remoteImageEnv)})
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

// remoteImageEnv names the image boxes of the default image get on a
// remote engine (docker-remote); default docker.DefaultRemoteImage.
const remoteImageEnv = "CELLBOX_REMOTE_IMAGE"

func errUnknownBackend(name string) error {
	return fmt.Errorf("unknown backend %q: want docker, docker-remote, local or auto", name)
}

// backendFlag is the --backend flag of the commands that run boxes (run,
// serve, mcp), checked as it is parsed: a bad name is refused before
// anything starts. (cellbox run opens its backend when a node first needs
// a box: it would store every exec node's failure to open it, and a later
// run with the right name would not run them again.)
type backendFlag string

func addBackendFlag(fs *flag.FlagSet, usage string) *string {
	v := backendFlag("auto")
	fs.Var(&v, "backend", usage)
	return (*string)(&v)
}

func (b *backendFlag) String() string { return string(*b) }

func (b *backendFlag) Set(s string) error {
	switch s {
	case "docker", "docker-remote", "local", "auto":
		*b = backendFlag(s)
		return nil
	}
	return errUnknownBackend(s)
}
