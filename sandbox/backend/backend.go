// Package backend defines the contract between the box pool and the things
// that make boxes: a Docker Engine (sandbox/docker) or bubblewrap
// (sandbox/local). Backends are thin on purpose: they create, start, stop,
// remove, inspect and list boxes. Everything that happens inside a box is a
// request to the cellbox agent that runs as the box's PID 1 (sandbox/agent).
//
// Every backend passes the conformance suite in sandbox/backend/backendtest.
package backend

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"time"
)

// ErrNotFound is returned (wrapped) by Inspect, Start, Stop for a box the
// backend does not know.
var ErrNotFound = errors.New("box not found")

// ErrExists is returned (wrapped) by Create for an ID that is taken.
var ErrExists = errors.New("box already exists")

// ErrNotReady is returned (wrapped) by Dial when the box's agent cannot be
// reached yet: the box does not run, or its agent has not begun to listen.
// Nothing was sent.
var ErrNotReady = errors.New("agent not reachable")

// ErrNoImage is returned (wrapped) by Create for an image the backend
// does not have (not loaded into the engine, not built); the message says
// how to get it.
var ErrNoImage = errors.New("no such image")

// Paths inside every box.
const (
	// AgentPath is where the cellbox binary is mounted read-only.
	AgentPath = "/.cellbox/cellbox"
	// SocketDir is where the host's per-box directory is mounted
	// read-write, on a backend whose boxes run here; the agent listens on
	// SocketDir/agent.sock there (a remote backend's boxes listen where it
	// chose: Dial knows).
	SocketDir = "/run/cellbox"
	// SocketName is the agent socket's file name inside SocketDir.
	SocketName = "agent.sock"
	// Workspace is the writable working directory of every box.
	Workspace = "/workspace"
)

// DefaultImage is the image a box gets when none is named: the host's own
// /usr mounted read-only (bash, coreutils, python3), over a minimal root.
const DefaultImage = "host"

// Labels every box carries (Docker labels; the local backend stores them).
const (
	LabelManaged = "cellbox.managed" // always "1"
	LabelSession = "cellbox.session"
	LabelBox     = "cellbox.box" // the box's name within its session
	LabelID      = "cellbox.id"
)

// Limits bound what a box may use. Zero means the backend default.
type Limits struct {
	MemoryBytes int64   `json:"memory_bytes,omitempty"` // default 1 GiB
	CPUs        float64 `json:"cpus,omitempty"`         // default 1
	Pids        int64   `json:"pids,omitempty"`         // default 256
	// DiskBytes caps what the box may write to /workspace and /tmp
	// together; past it writes fail with ENOSPC inside the box.
	DiskBytes int64 `json:"disk_bytes,omitempty"` // default 4 GiB
}

// Bounds of Limits, the same on every backend (Limits.Validate).
const (
	MinMemoryBytes = 16 << 20
	MinCPUs        = 0.01
	MinDiskBytes   = 64 << 20
	// MaxDiskBytes is far above any real cap; it only keeps the size of
	// the sparse disk file sane.
	MaxDiskBytes = 1 << 44
	// MaxPids is the kernel's PID_MAX_LIMIT: a cgroup refuses more.
	MaxPids = 1 << 22
)

// Defaults fills zero fields with the defaults.
func (l Limits) Defaults() Limits {
	if l.MemoryBytes == 0 {
		l.MemoryBytes = 1 << 30
	}
	if l.CPUs == 0 {
		l.CPUs = 1
	}
	if l.Pids == 0 {
		l.Pids = 256
	}
	if l.DiskBytes == 0 {
		l.DiskBytes = 4 << 30
	}
	return l
}

// Validate checks limits against the bounds every backend enforces, so a
// value one backend would take and the other refuse (or silently ignore)
// is refused on both with the same message. Zero fields mean the default
// and are fine. CPUs may not exceed maxCPUs, the CPU count of the machine
// the box runs on (Capabilities.MaxCPUs): a quota above it enforces
// nothing.
func (l Limits) Validate(maxCPUs int) error {
	var errs []string
	if l.MemoryBytes != 0 && l.MemoryBytes < MinMemoryBytes {
		errs = append(errs, fmt.Sprintf("memory_bytes %d: want at least 16 MiB (%d)", l.MemoryBytes, int64(MinMemoryBytes)))
	}
	if l.CPUs != 0 && (l.CPUs < MinCPUs || l.CPUs > float64(maxCPUs) || math.IsNaN(l.CPUs)) {
		errs = append(errs, fmt.Sprintf("cpus %g: want between %g and %d (the CPU count of the machine boxes run on)", l.CPUs, MinCPUs, maxCPUs))
	}
	if l.Pids < 0 || l.Pids > MaxPids {
		errs = append(errs, fmt.Sprintf("pids %d: want between 1 and %d (the kernel's most)", l.Pids, MaxPids))
	}
	if l.DiskBytes != 0 && (l.DiskBytes < MinDiskBytes || l.DiskBytes > MaxDiskBytes) {
		errs = append(errs, fmt.Sprintf("disk_bytes %d: want between 64 MiB (%d) and 16 TiB (%d)", l.DiskBytes, int64(MinDiskBytes), int64(MaxDiskBytes)))
	}
	if len(errs) > 0 {
		return fmt.Errorf("limits: %s (0 means the default)", strings.Join(errs, "; "))
	}
	return nil
}

// Spec describes a box to create.
type Spec struct {
	// ID is unique across the host and chosen by the caller (the pool); it
	// names the container or the local box directory.
	ID     string
	Labels map[string]string
	// Image is a Docker image name (cellbox/python) or DefaultImage.
	// The local backend maps cellbox/NAME to the rootfs built by
	// `cellbox image build NAME`.
	Image   string
	Env     map[string]string
	Network bool // false: loopback only
	Limits  Limits
	// AgentBinary is the path, on this machine, of a static cellbox
	// binary, put read-only at AgentPath in the box (mounted, or copied to
	// a remote engine) and started as `cellbox agent` (PID 1).
	AgentBinary string
	// WorkDir is the box's working directory: where commands run and file
	// paths that are not absolute resolve (the agent's --workspace; made if
	// missing). It must lie on the box's own disk (ValidWorkDir); ""
	// means Workspace.
	WorkDir string
	// HostDir is a host directory owned by this box, mounted at SocketDir.
	// The agent creates its socket there. Create and every Start give it
	// to the box user: the caller may make it anew while the box is
	// stopped. The host must treat everything in it as hostile (lstat,
	// never follow links). Empty for a backend whose boxes run on
	// another machine (Capabilities.Remote), which takes none.
	HostDir string
}

// State is a box's life state as the backend sees it.
type State string

const (
	StateCreated State = "created" // made, never started or not running
	StateRunning State = "running"
	StateStopped State = "stopped" // was running, workspace kept
)

// Info is what a backend knows of a box.
type Info struct {
	ID      string
	Labels  map[string]string
	Image   string
	State   State
	Created time.Time
	HostDir string
	// Exit says why a box that ran is no longer running (exit code, OOM
	// kill, the end of its log), for errors and sandbox_list; "" while it
	// runs or when the backend cannot tell. Inspect sets it; List, which
	// would pay for it box by box, leaves it empty.
	Exit string
	// Lost says what a Start will not bring back of a box that stopped
	// other than by Stop (a pod evicted, its node dead, on a backend whose
	// boxes keep their disk only through a Keeper); "" when nothing is.
	Lost string
}

// ExitSummary picks from the start of a box's log what says why its agent
// ended, for Info.Exit: the first two lines that are not the agent's own
// info logs (a Go runtime crash starts with its reason, then pages of
// stack), each cut to 200 bytes.
func ExitSummary(log string) string {
	var out []string
	for _, line := range strings.Split(log, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.Contains(line, "level=INFO") || strings.Contains(line, "level=DEBUG") {
			continue
		}
		if len(line) > 200 {
			line = line[:200] + "..."
		}
		if out = append(out, line); len(out) == 2 {
			break
		}
	}
	return strings.Join(out, "; ")
}

// Backend makes boxes. All methods are safe for concurrent use, also on
// the same ID (a backend serializes what must be). Every backend passes
// the one conformance suite, sandbox/backend/backendtest, which checks each
// point below from inside real boxes.
//
// Every box, on every backend: no network but loopback unless
// Spec.Network; Spec.Limits enforced (or reported unenforced, with why, in
// Capabilities.Limits); no capabilities and no-new-privileges; the
// unprivileged box user (BoxUID/BoxGID inside, HOME=Workspace), which is
// never host root; a read-only root with Workspace and /tmp writable
// (capped at Limits.DiskBytes where Capabilities.Limits.Disk; full is
// ENOSPC inside); the agent (Spec.AgentBinary) as PID 1, reached only
// through Dial. On a backend whose boxes run here (not
// Capabilities.Remote) the agent listens in Spec.HostDir, which the host
// treats as hostile, and the box user is a host uid of the box's own.
type Backend interface {
	// Name is "docker" or "local".
	Name() string

	// Create makes a box from spec without starting it and returns its
	// Info (State created). Spec.Validate's rules apply; an ID that exists
	// is an error wrapping ErrExists and leaves that box alone. A Create
	// that fails leaves nothing behind (or nothing a later Remove of the
	// ID would not delete). A Create cut short by the death of its process,
	// at any step, leaves nothing the next process cannot find: either the
	// backend removes it when it is opened again, or List reports the box
	// (State created, Info.Exit saying its making was cut short) for the
	// caller's reconciliation to Remove.
	Create(ctx context.Context, spec Spec) (Info, error)

	// Start starts a created or stopped box and returns once its PID 1
	// (the agent) has been launched; the caller waits for the agent's
	// socket. A box whose PID 1 dies at once shows as not running in
	// Inspect, with Info.Exit saying why. Starting a running box is a
	// no-op. An unknown ID is an error wrapping ErrNotFound.
	Start(ctx context.Context, id string) (Info, error)

	// Stop ends every process of a box and keeps its workspace: a later
	// Start sees the same files. A stopped box holds no process and no
	// mount on the host. Stopping a stopped or never started box is a
	// no-op; an unknown ID is an error wrapping ErrNotFound.
	Stop(ctx context.Context, id string) error

	// Remove stops a box and deletes it with its workspace and disk.
	// Removing a missing box is not an error, so a cleanup may repeat it.
	Remove(ctx context.Context, id string) error

	// Inspect says what the backend knows of a box; an unknown ID is an
	// error wrapping ErrNotFound.
	Inspect(ctx context.Context, id string) (Info, error)

	// Dial connects to the agent of box id: the one way to reach a box.
	// The connection carries the agent protocol (HTTP/1.1, see package
	// agent); each call is a new connection (the caller pools them). A box
	// that does not run, or whose agent does not listen yet, is an error
	// wrapping ErrNotReady (nothing was sent: the caller may wait and try
	// again); an unknown ID wraps ErrNotFound. Where the agent listens is
	// the backend's business: the caller never builds a path or address.
	Dial(ctx context.Context, id string) (net.Conn, error)

	// Capabilities says what the backend can do and enforce on this
	// host; it does not change while the backend is open.
	Capabilities() Capabilities

	// List returns the managed boxes whose labels include every given
	// label, also those made by an earlier process and those whose Create
	// an earlier process did not finish (see Create). A pool reconciles at
	// start with List(ctx, {LabelManaged: "1", …}): boxes it knows are
	// reattached (running ones keep running), the others are orphans to
	// Remove.
	List(ctx context.Context, labels map[string]string) ([]Info, error)
}

// Cloner is an optional capability of a Backend that can copy a box's
// disk whole (copy-on-write where the host filesystem allows): the pool's
// fork uses it instead of moving every file through the agents, and falls
// back to the agents when a backend does not offer it or Clone fails.
//
// Clone makes the boxes specs, not started (each as Create does, with
// Create's rules), whose workspaces are copies of box src's, all taken at
// one instant: src may be running, its writes wait while its disk is
// copied, and it is otherwise left as it is. The copies keep src's disk
// size (Limits.DiskBytes is not applied) and start with an empty /tmp; no
// process is copied. All or nothing: on error no box of specs is left. An
// unknown src is an error wrapping ErrNotFound.
type Cloner interface {
	Clone(ctx context.Context, src string, specs []Spec) ([]Info, error)
}

// Checkpointer is an optional capability of a Backend whose boxes keep
// their files only through a Keeper while they run on a node that may
// die (kubernetes): Checkpoint keeps the running box id's workspace now,
// without stopping it, so that a box lost without a Stop comes back with
// what it had then (Info.Lost says since when). The pool calls it after a
// box was used, once no call is in flight.
type Checkpointer interface {
	Checkpoint(ctx context.Context, id string) error
}

// ImageDigester is an optional capability of a Backend that can say which
// build of an image a box made now would run. ImageDigest returns an id
// that changes whenever the image is rebuilt or replaced under its name
// (a Docker engine's image ID, sha256:...; the build of a local rootfs),
// and "" when the backend cannot tell: an image it does not have, or one
// no digest describes (DefaultImage where it is the host's own /usr). An
// error is a failure to ask (an engine that does not answer).
//
// The exec node's memo key holds it, so that a result computed on one
// build is never taken for another's: it is asked before every run
// decision and must be cheap. A backend checks a cheap stamp on each call,
// or caches what is costly to learn for at most ImageDigestTTL, so that a
// rebuild is seen within it.
type ImageDigester interface {
	ImageDigest(ctx context.Context, image string) (string, error)
}

// ImageDigestTTL is the longest an ImageDigester may answer from a cache.
const ImageDigestTTL = time.Second
