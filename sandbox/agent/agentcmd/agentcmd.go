// Package agentcmd is the agent's command line, `cellbox agent` and
// `cellbox-agent agent`: the in-box agent (PID 1 of every box), the
// Kubernetes backend's probe and install steps, and the pipe a remote
// engine's exec stream reaches the agent through. One place for both
// binaries: cellbox-agent is the same command in a binary of the agent's
// packages alone, which starts in a fraction of the time (see
// cmd/cellbox-agent).
package agentcmd

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/egress"
)

// Usage is the agent command's line of usage.
const Usage = "[--socket PATH|tcp:HOST:PORT] [--workspace DIR] [--install DST]  run the in-box agent (PID 1 of every box)"

// Run runs the agent command with its arguments (those after "agent").
func Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	socket := fs.String("socket", filepath.Join(backend.SocketDir, backend.SocketName), "unix socket to listen on, or tcp:HOST:PORT (then every connection must open with the token in $"+agent.EnvToken+")")
	probe := fs.String("probe", "", "instead of serving, try TCP connections to `HOST:PORT` for a while and exit 0 once one connects: the Kubernetes backend's network policy probe")
	probeBlocked := fs.Bool("probe-blocked", false, "with --probe: exit 1 once a connection fails, 0 if every one connects")
	egressShut := fs.String("egress-shut", "", "before serving, wait until a TCP connection to `HOST:PORT` fails (a Kubernetes box without network: its NetworkPolicy holds); exit 1 if it still connects after 45 s")
	install := fs.String("install", "", "instead of serving, copy this binary to `DST` (mode 0555) and exit: how a Kubernetes pod's init container puts the agent into the box")
	workspace := fs.String("workspace", backend.Workspace, "the box's working directory (created if missing)")
	pids := fs.Int64("pids-limit", 0, "the box's pids limit, named in messages when the box runs out of processes (default: read from the box's cgroup)")
	memory := fs.Int64("memory-limit", 0, "the box's memory limit in bytes, named in out-of-memory messages (default: read from the box's cgroup)")
	connect := fs.Bool("connect", false, "instead of serving, connect to the agent's socket and carry one connection over stdin and stdout (a remote engine's exec stream reaches the agent this way)")
	if err := fs.Parse(args); err == flag.ErrHelp {
		return nil
	} else if err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *probe != "" {
		return agent.Probe(ctx, *probe, *probeBlocked)
	}
	if *install != "" {
		return agent.InstallSelf(*install)
	}
	// The token is the agent's alone: no command it runs inherits it.
	token := os.Getenv(agent.EnvToken)
	os.Unsetenv(agent.EnvToken)
	if *connect {
		return agent.Pipe(ctx, *socket, os.Stdin, os.Stdout)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if *egressShut != "" {
		start := time.Now()
		if err := agent.WaitShut(ctx, *egressShut); err != nil {
			return err
		}
		log.Info("network policy holds", "tried", *egressShut, "waited", time.Since(start).Round(time.Millisecond))
	}
	// File tools reach the whole disk of the box (Workspace and /tmp)
	// whatever its working directory (a sandbox's workspace_dir).
	roots := []string{backend.Workspace, "/tmp"}
	err := agent.Serve(ctx, agent.Options{
		Socket: *socket, Token: token, Workspace: *workspace, AllowedRoots: roots, Logger: log,
		EgressListen: os.Getenv(egress.EnvListen),
		EgressSocket: filepath.Join(filepath.Dir(*socket), egress.SocketName),
		PidsLimit:    *pids, MemoryLimit: *memory,
	})
	if err == nil && ctx.Err() != nil && strings.HasPrefix(*socket, "tcp:") {
		// A pod's agent stopped by a signal (the kubelet evicting or
		// deleting the pod) exits as a process killed by SIGTERM would:
		// a pod whose last container exits 0 is "Succeeded", and that
		// phase hides the eviction the kubelet records.
		os.Exit(143)
	}
	return err
}
