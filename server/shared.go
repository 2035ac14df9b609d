package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/blobs"
	"github.com/cellbox/cellbox/sandbox/lease"
	"github.com/cellbox/cellbox/sandbox/state"
)

// Past one machine (docs/cluster.md): a state several servers share in
// etcd, snapshots in S3, boxes as pods of Kubernetes. Their clients (etcd's
// gRPC, client-go, minio) double the binary and cost ~10 ms of package
// initialisation and page faults on every start, so they live in package
// server/cluster, which registers itself here (RegisterCluster) and is
// linked only into the binaries that import it: cellbox-cluster (cellbox
// built with -tags cluster), cellbox-bench and the tests. A plain cellbox
// asked for them execs cellbox-cluster (cmd/cellbox).

// ClusterConfig puts a server's state where several servers share it.
// The zero value is one machine: the data directory's bbolt file.
type ClusterConfig struct {
	// Etcd are the client URLs of the etcd cluster (--etcd).
	Etcd []string
	// Prefix is where in etcd this cellbox's data lives (--etcd-prefix):
	// default "/cellbox/". Servers with one prefix share everything.
	Prefix string
	// Blobs is the snapshot content store (--blobs): s3://BUCKET/PREFIX?…
	// shared by every server; "" keeps it in the data directory (a
	// snapshot is then restorable only where it was taken).
	Blobs string
}

// On reports whether the state is shared.
func (c ClusterConfig) On() bool { return len(c.Etcd) > 0 }

// PrefixOrDefault is Prefix, "/cellbox/" if empty, ending in a slash.
func (c ClusterConfig) PrefixOrDefault() string {
	p := c.Prefix
	if p == "" {
		p = "/cellbox/"
	}
	if !strings.HasSuffix(p, "/") {
		p += "/"
	}
	return p
}

// Shared is what a server over a shared state holds beside its stores:
// the leases, its name among the servers, the way to the others. Its one
// implementation is package server/cluster's.
type Shared interface {
	// Leaser grants the leases of sessions, patterns and pools; Holder is
	// this server's name to it.
	Leaser() lease.Leaser
	Holder() string
	// Blobs opens the snapshot store every server reaches and the keeper
	// of the kubernetes backend's stopped boxes' workspaces beside it
	// (nil, nil: the data directory's).
	Blobs(ctx context.Context) (blobs.Store, backend.Keeper, error)
	// Serve puts, in front of next (the tool API; svc opens the sandbox
	// service), the forwarding of a request for a session or an MCP
	// session another server serves, marked with key, and announces this
	// server at base to the others until ctx ends.
	Serve(ctx context.Context, key, base string, svc func(context.Context) (*sandbox.Service, error), next http.Handler) (http.Handler, error)
	// ForwardPattern is runapi.Config.Forward: a write to an instance
	// another server runs goes there.
	ForwardPattern(w http.ResponseWriter, r *http.Request, instance string) bool
	// Close closes the client and frees the data directory.
	Close() error
}

// SharedOpener opens the shared state of cfg for the server of dataDir
// (made, its schema cache the process's): its cell store, the sandbox
// service's records and the rest.
type SharedOpener func(ctx context.Context, dataDir string, cfg ClusterConfig) (cells.Store, state.Store, Shared, error)

// BackendOpener opens the kubernetes backend for the server of dataDir
// (OpenBackend's agentBinary; keeper: nil for the data directory's).
type BackendOpener func(ctx context.Context, dataDir, agentBinary string, keeper backend.Keeper) (backend.Backend, error)

var linked struct {
	open SharedOpener
	kube BackendOpener
}

// RegisterCluster links the shared state and the kubernetes backend into
// the server: package server/cluster calls it as it initialises.
func RegisterCluster(open SharedOpener, kube BackendOpener) {
	linked.open, linked.kube = open, kube
}

// ClusterLinked reports whether this binary has the cluster's clients
// (RegisterCluster was called).
func ClusterLinked() bool { return linked.open != nil }

// ExecutableEnv names, in the environment of cellbox-cluster run by
// cellbox (cmd/cellbox execs it for the cluster's clients), the cellbox
// binary that ran it: the kubernetes backend's pods run that binary as
// their agent by default — the one `cellbox image agent` made their image
// of — not cellbox-cluster.
const ExecutableEnv = "CELLBOX_EXECUTABLE"

// Executable is the cellbox binary this process stands for, which boxes
// run as their agent when no other is given: ExecutableEnv's when cellbox
// ran this cellbox-cluster, else this executable ("" if it is unknown).
// A plain cellbox ignores ExecutableEnv.
func Executable() string {
	if exe := os.Getenv(ExecutableEnv); exe != "" && ClusterLinked() {
		return exe
	}
	exe, _ := os.Executable()
	return exe
}

// ErrClusterNotLinked is what a binary without the cluster's clients says
// to --etcd, --blobs or the kubernetes backend.
var ErrClusterNotLinked = errors.New("this binary is built without the cluster's clients (etcd, S3, Kubernetes): use cellbox-cluster, cellbox built with -tags cluster (docs/cluster.md)")

func openShared(ctx context.Context, dataDir string, cfg ClusterConfig) (*State, error) {
	if linked.open == nil {
		return nil, fmt.Errorf("--etcd: %w", ErrClusterNotLinked)
	}
	if err := prepareDataDir(dataDir); err != nil {
		return nil, err
	}
	store, sandboxState, sh, err := linked.open(ctx, dataDir, cfg)
	if err != nil {
		return nil, err
	}
	return &State{Cells: store, Sandbox: sandboxState, shared: sh}, nil
}

func openKube(ctx context.Context, dataDir, agentBinary string, keeper backend.Keeper) (backend.Backend, error) {
	if linked.kube == nil {
		return nil, fmt.Errorf("the kubernetes backend: %w", ErrClusterNotLinked)
	}
	return linked.kube(ctx, dataDir, agentBinary, keeper)
}
