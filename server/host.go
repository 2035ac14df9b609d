package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cellbox/cellbox/builtins"
	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/patterns"
	"github.com/cellbox/cellbox/runtime"
	"github.com/cellbox/cellbox/server/runapi"
)

// RunSocketFile is the runtime API's unix socket in the data directory
// (Host.ServeUnix): DATA/run.sock, of the process that holds
// DATA/cellbox.db.
const RunSocketFile = "run.sock"

// Host is a runtime over a cell store, its API, and the servers that
// serve the API (ServeUnix: the unix socket DATA/run.sock; ServeTCP: an
// HTTP address, with the sandbox service).
type Host struct {
	dataDir  string
	rt       *runtime.Runtime
	api      *runapi.Server
	boxes    *Sandboxes // the sandbox service and the runtime's session in it
	servers  []*http.Server
	sockPath string
	urlPath  string      // DATA/server.url, written by ServeTCP
	opts     HTTPOptions // of the HTTP servers and their limits
	// teardowns are exec boxes being destroyed after their runs.
	teardowns *builtins.Teardowns
	// reqs is the context of every request of the servers, ended by
	// endReqs when Close's grace runs out.
	reqs    context.Context
	endReqs context.CancelCauseFunc
	gone    sync.WaitGroup // removeBox calls
	shared  Shared         // the shared state's, or nil
}

// HostConfig says what a Host runs over.
type HostConfig struct {
	// DataDir holds the socket, the server key (unless HTTP.KeyFile) and
	// the URL note.
	DataDir string
	// Store is the cell store the runtime runs over.
	Store cells.Store
	// Sandboxes are the sandbox service and session the exec and sandbox
	// nodes drive boxes of, and the tool API ServeTCP serves.
	Sandboxes *Sandboxes
	// Logger: default slog.Default().
	Logger *slog.Logger
	// Persist records loaded patterns for runapi.Server.Resume (cellbox
	// serve).
	Persist bool
	// HTTP are the options of the servers.
	HTTP HTTPOptions
	// shared is the shared state's (Config.Cluster): the patterns' leases
	// are its, and sessions other servers serve are forwarded there.
	shared Shared
}

// errShuttingDown ends the requests still in flight when a stop's grace
// has run out: a tool call's command is killed and the call answered
// with this, rather than its connection cut with no answer.
var errShuttingDown = errors.New("the server is shutting down: the call was ended, its command stopped; call again once the server is back")

// NewHost starts a runtime over cfg.Store whose exec and sandbox nodes
// drive boxes of cfg.Sandboxes' session, with its API; nothing is served
// until ServeUnix or ServeTCP. The exec memo cache is capped by
// CELLBOX_MEMO_LIMIT (MemoLimitEnv).
func NewHost(cfg HostConfig) (*Host, error) {
	log := cmp.Or(cfg.Logger, slog.Default())
	env := builtins.Env{Client: cfg.Sandboxes.Client(), Logger: log, Teardowns: &builtins.Teardowns{}}
	memoLimit, err := envSize(MemoLimitEnv)
	if err != nil {
		return nil, err
	}
	h := &Host{dataDir: cfg.DataDir, boxes: cfg.Sandboxes, opts: cfg.HTTP, teardowns: env.Teardowns, shared: cfg.shared}
	h.reqs, h.endReqs = context.WithCancelCause(context.Background())
	ro := runtime.Options{Logger: log, MemoLimit: memoLimit, OnGone: func(node cells.Address, builtin string) {
		if builtin == string(patterns.KindSandbox) {
			h.removeBox(env, log, node)
		}
	}}
	if cfg.shared != nil {
		// Each instance's commits carry its lease: a server that lost it
		// writes nothing more of it (docs/cluster.md).
		ro.Fence = func(ctx context.Context, space, pattern string) context.Context {
			return h.api.FenceContext(ctx, space, pattern)
		}
	}
	h.rt = runtime.New(cfg.Store, ro)
	rc := runapi.Config{Runtime: h.rt, Store: cfg.Store, Env: env, Logger: log, Persist: cfg.Persist}
	if cfg.shared != nil {
		rc.Leaser, rc.Holder, rc.Forward = cfg.shared.Leaser(), cfg.shared.Holder(), cfg.shared.ForwardPattern
	}
	h.api = runapi.New(rc)
	return h, nil
}

// Runtime is the host's runtime.
func (h *Host) Runtime() *runtime.Runtime { return h.rt }

// API is the runtime's API (patterns, cells, watch, send, retry) that the
// host serves.
func (h *Host) API() *runapi.Server { return h.api }

// Sandboxes are the host's sandbox service and session.
func (h *Host) Sandboxes() *Sandboxes { return h.boxes }

// removeBox destroys the box of a sandbox node its pattern no longer has
// (runtime.Options.OnGone), off the runtime's lock; Close waits for it (a
// run --once may end right after the load that removed the node).
func (h *Host) removeBox(env builtins.Env, log *slog.Logger, node cells.Address) {
	h.gone.Add(1)
	go func() {
		defer h.gone.Done()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := builtins.SandboxGone(ctx, env, node); err != nil {
			log.Warn("remove a removed node's box", "node", node.String(), "error", err)
			return
		}
		log.Info("removed the box of a sandbox node the pattern no longer has", "node", node.String())
	}()
}

// MemoLimitEnv caps the exec memo cache of a Host (bytes, or with a
// unit: 512MiB, 2GiB); unset: runtime.DefaultMemoLimit.
const MemoLimitEnv = "CELLBOX_MEMO_LIMIT"

// envSize reads a size from an environment variable (0 when unset).
func envSize(name string) (int64, error) {
	v := strings.TrimSpace(os.Getenv(name))
	if v == "" {
		return 0, nil
	}
	n, err := parseSize(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: %w", name, v, err)
	}
	return n, nil
}

// parseSize reads "1048576", "512KiB", "256MiB", "2GiB" (also KB, MB, GB
// as powers of 1000).
func parseSize(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return 0, errors.New("want a positive size in bytes, or with a unit: 512MiB, 2GiB")
	}
	return n * mult, nil
}

// ServeUnix serves the API on DATA/run.sock (replacing a socket a killed
// run left behind: this process holds the cell store, so no one else
// serves it), for `cellbox cell` and `cellbox send`. The socket's file
// mode (0600) is its guard. It returns the socket's path.
func (h *Host) ServeUnix() (string, error) {
	h.sockPath = filepath.Join(h.dataDir, RunSocketFile)
	if err := os.Remove(h.sockPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("remove stale socket: %w", err)
	}
	ln, err := net.Listen("unix", h.sockPath)
	if err != nil {
		return "", fmt.Errorf("listen on %s: %w", h.sockPath, err)
	}
	if err := os.Chmod(h.sockPath, 0o600); err != nil {
		ln.Close()
		return "", err
	}
	h.Serve(ln, WithBodyPace(h.opts.Pace(), h.api)) // the socket's file mode is its guard
	return h.sockPath, nil
}

// endGrace bounds the answers of the requests a stop ended.
const endGrace = 3 * time.Second

// Close stops the API servers (ending watches, letting other requests
// finish for up to HTTPOptions.ShutdownGrace, then ending them) and shuts
// the runtime down: runs in flight are cancelled and resume on the next
// start; patterns are not stopped, so sandbox boxes are kept, put to sleep
// (files kept, processes ended, disks unmounted) — every box, the tool
// API's sessions' too — and found again by the next start. Stopping a
// pattern (DELETE /v1/patterns/NAME, `cellbox stop NAME`) is what destroys
// its boxes. It does not close the sandbox service or the store.
func (h *Host) Close() error {
	grace := cmp.Or(h.opts.ShutdownGrace, defaultShutdownGrace)
	sctx, scancel := context.WithTimeout(context.Background(), grace)
	defer scancel()
	var left []*http.Server
	for _, srv := range h.servers {
		if srv.Shutdown(sctx) != nil {
			left = append(left, srv)
		}
	}
	if len(left) > 0 {
		// The grace is over: the calls still running are ended, and
		// answered so (a tool call's error result), before their
		// connections are closed.
		h.endReqs(errShuttingDown)
		ectx, ecancel := context.WithTimeout(context.Background(), endGrace)
		defer ecancel()
		for _, srv := range left {
			if srv.Shutdown(ectx) != nil {
				srv.Close()
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, p := range []string{h.sockPath, h.urlPath} {
		if p != "" {
			os.Remove(p)
		}
	}
	rterr := h.rt.Close(ctx)
	h.gone.Wait()
	twerr := h.teardowns.Wait(ctx)
	// The boxes get their own bound: a runtime slow to close does not
	// leave them running.
	bctx, bcancel := context.WithTimeout(context.Background(), sleepGrace)
	defer bcancel()
	return errors.Join(rterr, twerr, h.boxes.Sleep(bctx))
}

// sleepGrace bounds putting the boxes to sleep at shutdown; a box not
// stopped by then is logged and left to the next start's reconcile.
const sleepGrace = 30 * time.Second
