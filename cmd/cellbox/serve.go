package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/server"
)

func init() {
	register(command{
		name:  "serve",
		usage: "[--addr 127.0.0.1:7077] [--data DIR] [--backend auto|docker|docker-remote|kubernetes|local] [--pool N] [--max-boxes-per-session N] [--max-boxes N] [--max-sessions N] [--max-snapshot-bytes N] [--session-ttl 24h] [--agent-binary PATH] [--etcd URLS [--etcd-prefix P] [--blobs s3://…]] [--key-file F] [--allowed-host H]...  serve the sandbox tool API and the runtime API (patterns, cells) over HTTP",
		run:   runServe,
	})
}

// defaultAddr is where serve listens and the clients look by default.
const defaultAddr = "127.0.0.1:7077"

func runServe(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	addr := fs.String("addr", defaultAddr, "address to listen on")
	data := fs.String("data", server.DefaultDataDir(), "data directory: state file, box directories (images are shared: env "+server.ImagesEnv+")")
	backendName := addBackendFlag(fs, "box backend `name`: docker, docker-remote (an engine on another machine, DOCKER_HOST), kubernetes (pods of a cluster, KUBECONFIG; docs/kubernetes.md), local (bubblewrap), or auto (docker if an engine answers, else local)")
	agentBinary := fs.String("agent-binary", "", "static cellbox binary run as the agent in every box (default: this executable)")
	pool := fs.Int("pool", sandbox.DefaultPoolSize, "pre-started boxes kept for the default image (0: none)")
	maxPerSession := fs.Int("max-boxes-per-session", sandbox.DefaultMaxBoxesPerSession, "sandboxes one session may have at once")
	maxBoxes := fs.Int("max-boxes", sandbox.DefaultMaxBoxes, "sandboxes all sessions together may have at once")
	maxSessions := fs.Int("max-sessions", sandbox.DefaultMaxSessions, "sessions that may exist at once")
	maxSnapBytes := fs.Int64("max-snapshot-bytes", sandbox.DefaultMaxSnapshotBytes, "bytes one session's snapshots may take in the store (deduplicated)")
	sessionTTL := fs.Duration("session-ttl", sandbox.DefaultSessionTTL, "delete a session and its boxes after it was idle this long (0: never)")
	etcd := fs.String("etcd", "", "share the state with other servers in this etcd cluster: its client `URLs`, comma-separated (docs/cluster.md); default: the data dir's file")
	etcdPrefix := fs.String("etcd-prefix", "/cellbox/", "where in etcd the state lives: servers with one prefix share everything")
	blobs := fs.String("blobs", "", "keep snapshot content in an S3 bucket every server reaches: s3://BUCKET/PREFIX?endpoint=URL (credentials: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY); default: the data dir")
	httpOpts := server.AddHTTPFlags(fs)
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
	cluster := server.ClusterConfig{Prefix: *etcdPrefix, Blobs: *blobs}
	if *etcd != "" {
		cluster.Etcd = strings.Split(*etcd, ",")
	} else if *blobs != "" {
		return fmt.Errorf("--blobs shares snapshots between servers, which share their state with --etcd: give both, or neither")
	}
	if err := needCluster(*backendName, cluster.On()); err != nil {
		return err
	}
	// Cells, sessions and boxes: one file (or etcd); the sandbox service
	// opened now.
	srv, err := server.Open(ctx, server.Config{
		Cluster: cluster,
		DataDir: dataDir,
		Backend: *backendName,
		Sandbox: sandbox.Config{
			AgentBinary: *agentBinary,
			Pool:        map[string]int{backend.DefaultImage: max(*pool, 0)},

			MaxBoxesPerSession: *maxPerSession,
			MaxBoxes:           *maxBoxes,
			MaxSessions:        *maxSessions,
			MaxSnapshotBytes:   *maxSnapBytes,
			SessionTTL:         server.TTL(*sessionTTL),
		},
		Persist: true,
		HTTP:    *httpOpts,
	})
	if err != nil {
		return err
	}
	defer srv.Close()
	host := srv.Host
	if _, err := host.ServeUnix(); err != nil { // DATA/run.sock, for `cellbox cell` and `cellbox send`
		return err
	}
	ep, err := host.ServeTCP(*addr) // stopped by srv.Close
	if err != nil {
		return err
	}
	// The patterns loaded before a restart run again, where they stood.
	resumed, err := host.API().Resume(ctx)
	if err != nil {
		slog.Warn("some loaded patterns could not be resumed", "err", err)
		fmt.Fprintf(os.Stderr, "cellbox: %v\n", err)
	}
	for _, in := range resumed {
		fmt.Fprintf(os.Stderr, "cellbox: resumed pattern %s/%s\n", in.Space, in.Name)
	}
	if cluster.On() {
		// Patterns whose server died are taken over by a live one.
		go host.API().Adopt(ctx, time.Second)
	}
	be, base := srv.Backend(), ep.URL
	slog.Info("cellbox serving", "url", base, "backend", be.Name(), "data", dataDir)
	fmt.Fprintf(os.Stderr, "cellbox: serving on %s (backend %s, data %s)\n  page: %s/#token=%s · try: eval \"$(cellbox session new --server %s%s)\"; cellbox tool shell '{\"command\":\"uname -a\"}'\n", base, be.Name(), dataDir, base, ep.Key, base, dataFlag(*data))
	if ep.KeyCreated {
		fmt.Fprintf(os.Stderr, "  made a server key (the token above; kept 0600 in %s: `cellbox session new` reads it there, or set %s)\n", host.KeyPath(), server.KeyEnv)
	}
	select {
	case err := <-ep.Stopped:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	// The deferred close stops the APIs and puts every box to sleep.
	signal.Reset(os.Interrupt, syscall.SIGTERM) // a second Ctrl-C quits at once
	fmt.Fprintln(os.Stderr, "cellbox serve: stopping, putting the boxes to sleep (Ctrl-C again to quit at once)")
	return nil
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
	if err := server.CheckBackend(s); err != nil {
		return err
	}
	*b = backendFlag(s)
	return nil
}
