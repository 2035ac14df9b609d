// Package backendtest is the conformance suite every backend.Backend passes:
// the lifecycle contract of backend.Backend, and the confinement of a box
// (network, limits, capabilities, user), checked from inside the box through
// the real cellbox agent.
package backendtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/backend"
)

// Options configure RunWith.
type Options struct {
	// AgentBinary is a static cellbox binary (testenv.CellboxBinary).
	AgentBinary string
	// Image is the image of the boxes; default backend.DefaultImage.
	Image string
	// Outside is a TCP address that a box with network reaches (host:port,
	// something that accepts connections), for a backend whose boxes
	// have an interface either way (Capabilities.Network NetworkPolicy):
	// a box without network must fail to connect to it, a box with
	// network must connect.
	Outside string
	// Unenforced says the backend was set up so that it cannot enforce
	// some limits (the local backend without cgroups; a remote engine,
	// whose /workspace has no size cap). The tests of a limit it says it
	// does not enforce then check that it says why (Enforcement's
	// warnings) instead of checking the limit; otherwise a limit it does
	// not enforce fails the suite under CI.
	Unenforced bool
}

// Run runs the suite on boxes of backend.DefaultImage.
//
// newBackend may be called more than once per test; every Backend it returns
// must manage the same boxes (same engine, same root directory), as a
// restarted server would.
func Run(t *testing.T, newBackend func(t *testing.T) backend.Backend, agentBinary string) {
	RunWith(t, newBackend, Options{AgentBinary: agentBinary})
}

// RunWith runs the suite with options: the portable part on every backend,
// and the host-side part (HostSide) on one whose boxes run on this machine
// (not Capabilities.Remote).
//
// The portable part uses only the contract: a box is reached through
// Dial, its host directory is never looked into, and what a backend says
// it does not enforce (Capabilities.Limits) is not required of it. The
// host-side part checks what only a backend whose boxes run here can
// promise: the agent's socket in the box's host directory and a box that
// swaps it for a link, the host uid of the box user, the host directory
// made anew between a stop and a start.
func RunWith(t *testing.T, newBackend func(t *testing.T) backend.Backend, o Options) {
	s := &suite{newBackend: newBackend, o: o, session: "cbt-" + randHex(4)}
	s.b = newBackend(t)
	s.remote = s.b.Capabilities().Remote
	t.Run("Capabilities", s.capabilities)
	t.Run("Lifecycle", s.lifecycle)
	t.Run("Errors", s.errors)
	t.Run("ListByLabel", s.list)
	t.Run("Reattach", s.reattach)
	t.Run("Confinement", s.confinement)
	t.Run("WorkDir", s.workDir)
	t.Run("Network", s.network)
	t.Run("MemoryLimit", s.memory)
	t.Run("PidsLimit", s.pids)
	t.Run("Runaway", s.runaway)
	t.Run("Leftovers", s.leftovers)
	t.Run("DiskCap", s.diskCap)
	t.Run("OOMSparesAgent", s.oomSparesAgent)
	if !s.remote {
		t.Run("HostSide", func(t *testing.T) {
			t.Run("SocketInHostDir", s.socketInHostDir)
			t.Run("HostUID", s.hostUIDs)
			t.Run("AgentSocketSwap", s.socketSwap)
		})
	}
}

type suite struct {
	newBackend func(t *testing.T) backend.Backend
	b          backend.Backend
	o          Options
	session    string
	remote     bool // the backend's boxes run on another machine: no host dir
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// spec is a fresh box spec in the suite's session; its host dir and the box
// are removed when the test ends.
func (s *suite) spec(t *testing.T, name string) backend.Spec {
	t.Helper()
	dir := "" // a remote backend takes no host dir
	if !s.remote {
		// Short paths: a unix socket path must fit in 108 bytes.
		var err error
		dir, err = os.MkdirTemp("", "cbt")
		require.NoError(t, err)
	}
	id := s.session + "-" + name + "-" + randHex(3)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		assert.NoError(t, s.b.Remove(ctx, id), "remove box %s", id)
		if dir != "" {
			_ = os.RemoveAll(dir)
		}
	})
	return backend.Spec{
		ID:          id,
		Labels:      map[string]string{backend.LabelSession: s.session, backend.LabelBox: name},
		Image:       s.o.Image,
		AgentBinary: s.o.AgentBinary,
		HostDir:     dir,
	}
}

// up creates and starts a box and waits for its agent.
func (s *suite) up(t *testing.T, spec backend.Spec) *agent.Client {
	t.Helper()
	ctx := ctxFor(t, time.Minute)
	_, err := s.b.Create(ctx, spec)
	require.NoError(t, err)
	info, err := s.b.Start(ctx, spec.ID)
	require.NoError(t, err)
	require.Equal(t, backend.StateRunning, info.State)
	return s.waitAgent(t, spec)
}

// waitAgent waits for the agent of box spec, reached as every caller
// reaches it: through the backend's Dial.
func (s *suite) waitAgent(t *testing.T, spec backend.Spec) *agent.Client {
	t.Helper()
	c := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return s.b.Dial(ctx, spec.ID) })
	t.Cleanup(func() { c.Close() })
	// A box elsewhere is a pod scheduled and started by a cluster that
	// the suite's parallel tests keep busy: seconds each, more at once.
	wait := 20 * time.Second
	if s.remote {
		wait = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(t, c.WaitReady(ctx), "agent of box %s never answered", spec.ID)
	return c
}

// sh runs a shell command in the box.
func sh(t *testing.T, c *agent.Client, cmd string) agent.ExecResult {
	t.Helper()
	ctx := ctxFor(t, time.Minute)
	res, err := c.Exec(ctx, agent.ExecRequest{Command: cmd, TimeoutMs: 30000}, nil)
	require.NoError(t, err, "exec %q", cmd)
	return res
}

// ok runs a command that must succeed and returns its trimmed stdout.
func ok(t *testing.T, c *agent.Client, cmd string) string {
	t.Helper()
	res := sh(t, c, cmd)
	require.Equal(t, 0, res.ExitCode, "exec %q: stdout %q stderr %q", cmd, res.Stdout, res.Stderr)
	return strings.TrimSpace(res.Stdout)
}

func (s *suite) lifecycle(t *testing.T) {
	t.Parallel()
	spec := s.spec(t, "life")
	ctx := ctxFor(t, 2*time.Minute)
	before := time.Now().Add(-2 * time.Second)

	info, err := s.b.Create(ctx, spec)
	require.NoError(t, err)
	assert.Equal(t, spec.ID, info.ID)
	assert.Equal(t, backend.StateCreated, info.State)
	_, err = s.b.Dial(ctx, spec.ID)
	assert.ErrorIs(t, err, backend.ErrNotReady, "dial a box that was never started")
	assert.Equal(t, spec.ImageOrDefault(), info.Image)
	assert.Equal(t, spec.HostDir, info.HostDir)
	assert.WithinRange(t, info.Created, before, time.Now().Add(2*time.Second))
	for k, v := range map[string]string{backend.LabelManaged: "1", backend.LabelID: spec.ID, backend.LabelSession: s.session, backend.LabelBox: "life"} {
		assert.Equal(t, v, info.Labels[k], "label %s", k)
	}
	got, err := s.b.Inspect(ctx, spec.ID)
	require.NoError(t, err)
	assert.Equal(t, info.State, got.State)
	assert.Equal(t, info.Labels, got.Labels)
	require.NoError(t, s.b.Stop(ctx, spec.ID), "stopping a created box is a no-op")

	info, err = s.b.Start(ctx, spec.ID)
	require.NoError(t, err)
	assert.Equal(t, backend.StateRunning, info.State)
	c := s.waitAgent(t, spec)
	v, err := c.Version(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, v.PID, "the agent is PID 1")
	ok(t, c, "echo kept > /workspace/keep.txt && mkdir -p /workspace/d && echo x > /workspace/d/y")

	info, err = s.b.Start(ctx, spec.ID)
	require.NoError(t, err, "starting a running box is a no-op")
	assert.Equal(t, backend.StateRunning, info.State)
	assert.Equal(t, "kept", ok(t, c, "cat keep.txt"), "the no-op Start did not restart the box")

	require.NoError(t, s.b.Stop(ctx, spec.ID))
	got, err = s.b.Inspect(ctx, spec.ID)
	require.NoError(t, err)
	assert.Equal(t, backend.StateStopped, got.State)
	require.NoError(t, s.b.Stop(ctx, spec.ID), "stopping a stopped box is a no-op")
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = c.Version(short)
	cancel()
	assert.Error(t, err, "a stopped box's agent does not answer")
	_, err = s.b.Dial(ctx, spec.ID)
	assert.ErrorIs(t, err, backend.ErrNotReady, "dial a stopped box")

	info, err = s.b.Start(ctx, spec.ID)
	require.NoError(t, err)
	assert.Equal(t, backend.StateRunning, info.State)
	c = s.waitAgent(t, spec)
	assert.Equal(t, "kept", ok(t, c, "cat /workspace/keep.txt"), "the workspace survives stop and start")
	assert.Equal(t, "x", ok(t, c, "cat /workspace/d/y"))

	require.NoError(t, s.b.Remove(ctx, spec.ID))
	_, err = s.b.Inspect(ctx, spec.ID)
	assert.ErrorIs(t, err, backend.ErrNotFound)
	require.NoError(t, s.b.Remove(ctx, spec.ID), "removing a removed box is not an error")
	list, err := s.b.List(ctx, map[string]string{backend.LabelID: spec.ID})
	require.NoError(t, err)
	assert.Empty(t, list)
	_, err = c.Version(short)
	assert.Error(t, err, "a removed box's agent does not answer")
}

// capabilities: what the backend says of itself holds together: Clone
// exactly when it is a Cloner, a CPU count, a network isolation; the
// suites below skip nothing the backend claims.
func (s *suite) capabilities(t *testing.T) {
	caps := s.b.Capabilities()
	_, cloner := s.b.(backend.Cloner)
	assert.Equal(t, cloner, caps.Clone, "Capabilities.Clone says whether it implements Cloner")
	assert.GreaterOrEqual(t, caps.MaxCPUs, 1)
	assert.Contains(t, []string{backend.NetworkNamespace, backend.NetworkPolicy, backend.NetworkNone}, caps.Network)
	if caps.Network == backend.NetworkPolicy {
		assert.NotEmpty(t, s.o.Outside, "a backend whose boxes are kept off the network by a policy is tested with an address outside (Options.Outside)")
	}
	l := caps.Limits
	if !(l.Memory && l.CPU && l.Pids && l.Disk) {
		assert.NotEmpty(t, l.Warnings, "a limit not enforced says why")
	}
	assert.Equal(t, caps, s.b.Capabilities(), "it does not change")
	err := backend.Limits{CPUs: float64(caps.MaxCPUs) + 1}.Validate(caps.MaxCPUs)
	assert.ErrorContains(t, err, fmt.Sprintf("want between 0.01 and %d", caps.MaxCPUs))
}

// socketInHostDir: the agent listens in the box's host directory, and a
// host directory made anew while the box is stopped (the service's is a
// tmpfs it unmounts then) is given to the box user again by Start.
func (s *suite) socketInHostDir(t *testing.T) {
	t.Parallel()
	spec := s.spec(t, "hostdir")
	ctx := ctxFor(t, time.Minute)
	c := s.up(t, spec)
	fi, err := os.Lstat(filepath.Join(spec.HostDir, backend.SocketName))
	require.NoError(t, err)
	assert.Equal(t, os.ModeSocket, fi.Mode().Type(), "the agent's socket is in the host dir")
	ok(t, c, "echo kept > /workspace/keep.txt")
	require.NoError(t, s.b.Stop(ctx, spec.ID))
	require.NoError(t, os.RemoveAll(spec.HostDir))
	require.NoError(t, os.Mkdir(spec.HostDir, 0o700))
	_, err = s.b.Start(ctx, spec.ID)
	require.NoError(t, err)
	c = s.waitAgent(t, spec)
	assert.Equal(t, "kept", ok(t, c, "cat /workspace/keep.txt"))
}

// hostUIDs: the box user is a uid of the box's own from the reserved
// block, never a real account (Docker boxes once ran as host uid 1000),
// with a name; a host root file bound into the box stays unreadable.
func (s *suite) hostUIDs(t *testing.T) {
	t.Parallel()
	spec := s.spec(t, "uid")
	// A host root file the box can see (its socket dir is bound in).
	require.NoError(t, os.WriteFile(filepath.Join(spec.HostDir, "root-only"), []byte("secret"), 0o600))
	c := s.up(t, spec)
	res := sh(t, c, "cat "+backend.SocketDir+"/root-only")
	assert.NotEqual(t, 0, res.ExitCode, "the box read a host root 0600 file: %q", res.Stdout)
	host := hostUID(t, c)
	assert.GreaterOrEqual(t, host, 1_900_000_000, "host uid of the box user")
	assert.Less(t, host, 1<<31, "host uid of the box user")
	other := s.up(t, s.spec(t, "uid2"))
	assert.NotEqual(t, host, hostUID(t, other), "two boxes share a host uid")
	// Files it writes are its own on the host.
	ok(t, c, "echo mine > "+backend.SocketDir+"/mine")
	fi, err := os.Lstat(filepath.Join(spec.HostDir, "mine"))
	require.NoError(t, err)
	assert.EqualValues(t, host, fi.Sys().(*syscall.Stat_t).Uid, "owner on the host of a file the box wrote")
	assert.Equal(t, backend.BoxUser+"\n"+backend.Workspace, ok(t, c, "id -un; getent passwd $(id -u) | cut -d: -f6"), "the box user has a name and home")
}

func (s *suite) errors(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, time.Minute)
	unknown := s.session + "-nosuchbox"
	_, err := s.b.Inspect(ctx, unknown)
	assert.ErrorIs(t, err, backend.ErrNotFound, "inspect")
	_, err = s.b.Start(ctx, unknown)
	assert.ErrorIs(t, err, backend.ErrNotFound, "start")
	_, err = s.b.Dial(ctx, unknown)
	assert.ErrorIs(t, err, backend.ErrNotFound, "dial")
	assert.ErrorIs(t, s.b.Stop(ctx, unknown), backend.ErrNotFound, "stop")
	assert.NoError(t, s.b.Remove(ctx, unknown), "remove")

	spec := s.spec(t, "dup")
	_, err = s.b.Create(ctx, spec)
	require.NoError(t, err)
	_, err = s.b.Create(ctx, spec)
	assert.ErrorIs(t, err, backend.ErrExists, "create twice")

	bad := []struct {
		name   string
		mutate func(*backend.Spec)
		want   string // in the error, where every backend says the same
	}{
		{"id with a slash", func(sp *backend.Spec) { sp.ID = "a/b" }, ""},
		{"id ..", func(sp *backend.Spec) { sp.ID = ".." }, ""},
		{"empty id", func(sp *backend.Spec) { sp.ID = "" }, ""},
		{"missing agent binary", func(sp *backend.Spec) { sp.AgentBinary = "/nonexistent/cellbox" }, ""},
		{"relative host dir", func(sp *backend.Spec) { sp.HostDir = "boxes/x" }, ""},
		{"negative memory", func(sp *backend.Spec) { sp.Limits.MemoryBytes = -1 }, ""},
		{"unknown image", func(sp *backend.Spec) { sp.Image = "cellbox/nosuchimage-" + randHex(3) }, ""},
		// Limits are checked alike on every backend: bubblewrap used to
		// take cpus 1000 and enforce nothing, Docker refused it.
		{"cpus beyond the host", func(sp *backend.Spec) { sp.Limits.CPUs = 1000 }, "cpus 1000: want between 0.01 and"},
		{"negative pids", func(sp *backend.Spec) { sp.Limits.Pids = -5 }, "pids -5: want between 1 and 4194304"},
		{"tiny disk", func(sp *backend.Spec) { sp.Limits.DiskBytes = 1 << 20 }, "disk_bytes 1048576: want between 64 MiB"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			sp := spec
			sp.ID = s.session + "-bad-" + randHex(3)
			tc.mutate(&sp)
			_, err := s.b.Create(ctx, sp)
			require.Error(t, err)
			if tc.want != "" {
				assert.ErrorContains(t, err, tc.want)
			}
			if backend.ValidID(sp.ID) == nil {
				_, err = s.b.Inspect(ctx, sp.ID)
				assert.ErrorIs(t, err, backend.ErrNotFound, "a failed create leaves no box")
			}
		})
	}
}

func ids(list []backend.Info) []string {
	out := make([]string, 0, len(list))
	for _, in := range list {
		out = append(out, in.ID)
	}
	slices.Sort(out)
	return out
}

func (s *suite) list(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, time.Minute)
	a, b := s.spec(t, "lista"), s.spec(t, "listb")
	other := s.spec(t, "listother")
	other.Labels = map[string]string{backend.LabelSession: s.session + "-other", backend.LabelBox: "lista"}
	for _, sp := range []backend.Spec{a, b, other} {
		_, err := s.b.Create(ctx, sp)
		require.NoError(t, err)
	}
	_, err := s.b.Start(ctx, b.ID)
	require.NoError(t, err)

	tests := []struct {
		labels map[string]string
		want   []string
	}{
		{map[string]string{backend.LabelID: a.ID}, []string{a.ID}},
		{map[string]string{backend.LabelSession: s.session + "-other"}, []string{other.ID}},
		{map[string]string{backend.LabelSession: s.session, backend.LabelBox: "listb"}, []string{b.ID}},
		{map[string]string{backend.LabelBox: "lista", backend.LabelSession: s.session}, []string{a.ID}},
		{map[string]string{backend.LabelSession: "no-such-session"}, nil},
	}
	for _, tc := range tests {
		got, err := s.b.List(ctx, tc.labels)
		require.NoError(t, err)
		want := slices.Clone(tc.want)
		slices.Sort(want)
		assert.Equal(t, want, nilIfEmpty(ids(got)), "List(%v)", tc.labels)
	}
	all, err := s.b.List(ctx, nil)
	require.NoError(t, err)
	states := map[string]backend.State{}
	for _, in := range all {
		states[in.ID] = in.State
		assert.Equal(t, "1", in.Labels[backend.LabelManaged])
	}
	assert.Equal(t, backend.StateCreated, states[a.ID], "List(nil) sees every box, with its state")
	assert.Equal(t, backend.StateRunning, states[b.ID])
	assert.Contains(t, states, other.ID)
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

// reattach: a second Backend over the same boxes (a restarted server) sees
// a running box as running and can drive its lifecycle.
func (s *suite) reattach(t *testing.T) {
	t.Parallel()
	spec := s.spec(t, "reattach")
	c := s.up(t, spec)
	ok(t, c, "echo before > /workspace/f")

	ctx := ctxFor(t, time.Minute)
	b2 := s.newBackend(t)
	got, err := b2.List(ctx, map[string]string{backend.LabelID: spec.ID})
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, backend.StateRunning, got[0].State)
	assert.Equal(t, spec.HostDir, got[0].HostDir)
	assert.Equal(t, "before", ok(t, c, "cat /workspace/f"), "the box kept running")

	require.NoError(t, b2.Stop(ctx, spec.ID))
	in, err := s.b.Inspect(ctx, spec.ID)
	require.NoError(t, err)
	assert.Equal(t, backend.StateStopped, in.State)
	_, err = b2.Start(ctx, spec.ID)
	require.NoError(t, err)
	c = s.waitAgent(t, spec)
	assert.Equal(t, "before", ok(t, c, "cat /workspace/f"))
}

// confinement checks, from inside one box, who runs and what it may do.
func (s *suite) confinement(t *testing.T) {
	t.Parallel()
	spec := s.spec(t, "conf")
	spec.Env = map[string]string{"CELLBOX_TEST_VAR": "a b=c"}
	c := s.up(t, spec)

	// Not host root: an escape from the box's user namespace must not
	// land on uid 0 (the local backend once mapped the box user to the
	// server's uid).
	t.Run("the box user is not host root", func(t *testing.T) {
		host := hostUID(t, c)
		assert.NotEqual(t, 0, host, "the box user is host uid 0")
	})

	tests := []struct {
		name, cmd, want string
	}{
		{"runs as the box user, not root", `id -un; test "$(id -u)" != 0 && test "$(id -g)" != 0 && echo non-root`, backend.BoxUser + "\nnon-root"},
		{"home and cwd are the workspace", `echo "$HOME"; pwd`, backend.Workspace + "\n" + backend.Workspace},
		{"spec env is set", `echo "$CELLBOX_TEST_VAR"`, "a b=c"},
		{"no effective capabilities", `grep CapEff /proc/self/status | cut -f2`, "0000000000000000"},
		{"no new privileges", `grep NoNewPrivs /proc/self/status | cut -f2`, "1"},
		{"the agent is PID 1", `tr '\0' ' ' < /proc/1/cmdline | cut -d' ' -f1,2`, backend.AgentPath + " agent"},
		{"hostname", "cat /proc/sys/kernel/hostname", "box"},
		{"bash and python3", `bash -c 'echo $BASH_VERSINFO' >/dev/null && python3 -c 'print(6*7)'`, "42"},
		{"a Debian userland", `. /etc/os-release && echo $ID`, "debian"},
		{"workspace and tmp are writable", "echo w > /workspace/w && echo t > /tmp/t && cat /workspace/w /tmp/t", "w\nt"},
		{"usr, etc and root are not writable",
			`for p in /usr/cbt /usr/bin/cbt /etc/cbt /cbt /.cellbox/cellbox; do (echo x > $p) 2>/dev/null && echo "wrote $p"; done; echo done`, "done"},
		{"the root filesystem is read-only", `awk '$2 == "/" { split($4, o, ","); print o[1] }' /proc/mounts | tail -1`, "ro"},
		{"mount fails", `python3 -c 'import ctypes; l=ctypes.CDLL(None, use_errno=True); print(l.mount(b"none", b"/tmp", b"tmpfs", 0, None), ctypes.get_errno())'`, "-1 1"},
		{"no new user namespace", `python3 -c 'import ctypes; l=ctypes.CDLL(None, use_errno=True); print(l.unshare(0x10000000) == 0)'`, "False"},
		{"mknod fails", `python3 -c '
import os, stat
try:
    os.mknod("/tmp/null", stat.S_IFCHR | 0o666, os.makedev(1, 3)); print("made")
except PermissionError: print("denied")'`, "denied"},
	}
	if !s.remote { // a remote box's agent listens where its backend chose
		tests = append(tests, struct{ name, cmd, want string }{"the socket dir is mounted", "test -S " + backend.SocketDir + "/" + backend.SocketName + " && echo yes", "yes"})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, ok(t, c, tc.cmd))
		})
	}
	seccompFamilies(t, c)
}

// workDir: Spec.WorkDir is where commands run and relative file paths
// resolve, made on the box's disk and kept across a restart; file tools
// still reach the whole disk; a WorkDir off the disk is refused.
func (s *suite) workDir(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, time.Minute)
	spec := s.spec(t, "workdir")
	spec.WorkDir = backend.Workspace + "/app/src"
	c := s.up(t, spec)
	assert.Equal(t, spec.WorkDir, ok(t, c, "pwd"))
	v, err := c.Version(ctx)
	require.NoError(t, err)
	assert.Equal(t, spec.WorkDir, v.Workspace)
	res, err := c.WriteFile(ctx, agent.WriteRequest{Path: "rel.txt", Data: []byte("rel")})
	require.NoError(t, err)
	assert.Equal(t, spec.WorkDir+"/rel.txt", res.Path)
	_, err = c.WriteFile(ctx, agent.WriteRequest{Path: "../../top.txt", Data: []byte("top")})
	require.NoError(t, err, "the rest of the disk stays reachable")
	assert.Equal(t, "reltop", ok(t, c, "cat rel.txt "+backend.Workspace+"/top.txt"))

	require.NoError(t, s.b.Stop(ctx, spec.ID))
	_, err = s.b.Start(ctx, spec.ID)
	require.NoError(t, err)
	c = s.waitAgent(t, spec)
	assert.Equal(t, spec.WorkDir+"\nrel", ok(t, c, "pwd; cat rel.txt"), "after a restart")

	for _, dir := range []string{"/etc/app", "/", "workspace/app", "/workspace/../etc"} {
		bad := s.spec(t, "badworkdir")
		bad.WorkDir = dir
		_, err := s.b.Create(ctx, bad)
		require.Error(t, err, "WorkDir %q", dir)
		assert.Contains(t, err.Error(), "workspace_dir")
	}
}

// interfaces lists the box's network interfaces.
func interfaces(t *testing.T, c *agent.Client) []string {
	out := ok(t, c, `tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort`)
	return strings.Fields(out)
}

func (s *suite) network(t *testing.T) {
	t.Parallel()
	policy := s.b.Capabilities().Network == backend.NetworkPolicy
	connect := func(addr string) string {
		host, port, _ := net.SplitHostPort(addr)
		return fmt.Sprintf(`python3 -c 'import socket; socket.create_connection(("%s", %s), timeout=5)'`, host, port)
	}
	t.Run("none by default", func(t *testing.T) {
		t.Parallel()
		c := s.up(t, s.spec(t, "nonet"))
		if policy {
			res := sh(t, c, connect(s.o.Outside))
			assert.NotEqual(t, 0, res.ExitCode, "a box without network reaches %s: %s", s.o.Outside, res.Stderr)
		} else {
			assert.Equal(t, []string{"lo"}, interfaces(t, c), "loopback only")
			res := sh(t, c, `python3 -c 'import socket; socket.create_connection(("1.1.1.1", 53), timeout=2)'`)
			assert.NotEqual(t, 0, res.ExitCode)
			assert.Contains(t, res.Stderr, "unreachable")
		}
		assert.Equal(t, "lo-ok", ok(t, c, `python3 -c '
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
c = socket.create_connection(s.getsockname()); print("lo-ok")'`), "loopback works")
	})
	t.Run("on with Spec.Network", func(t *testing.T) {
		t.Parallel()
		spec := s.spec(t, "net")
		spec.Network = true
		c := s.up(t, spec)
		ifs := interfaces(t, c)
		assert.Contains(t, ifs, "lo")
		assert.Greater(t, len(ifs), 1, "an interface besides loopback: %v", ifs)
		if policy {
			res := sh(t, c, connect(s.o.Outside))
			assert.Equal(t, 0, res.ExitCode, "a box with network reaches %s: %s", s.o.Outside, res.Stderr)
		}
	})
}

func (s *suite) enforcement() backend.Enforcement { return s.b.Capabilities().Limits }

// enforced reports whether the backend enforces a limit, so that its test
// goes on. A backend that does not must say why (Enforcement's warnings)
// when it was set up without the means (Options.Unenforced); otherwise the
// limit is missing, which fails the test under CI.
func (s *suite) enforced(t *testing.T, limit string, yes bool) bool {
	t.Helper()
	if yes {
		return true
	}
	if s.o.Unenforced {
		e := s.enforcement()
		assert.True(t, slices.ContainsFunc(e.Warnings, func(w string) bool { return strings.HasPrefix(w, limit+":") }),
			"a %s limit that is not enforced is reported: %q", limit, e.Warnings)
		return false
	}
	testenv.Missing(t, limit+" limit enforcement by the "+s.b.Name()+" backend")
	return false
}

func (s *suite) memory(t *testing.T) {
	t.Parallel()
	if !s.enforced(t, "memory", s.enforcement().Memory) {
		return
	}
	spec := s.spec(t, "mem")
	spec.Limits.MemoryBytes = 128 << 20
	c := s.up(t, spec)
	assert.Equal(t, "32", ok(t, c, `python3 -c 'x = b"x" * (32 << 20); print(len(x) >> 20)'`), "under the limit works")
	res := sh(t, c, `python3 -c 'x = b"x" * (512 << 20); print("survived")'`)
	assert.NotEqual(t, 0, res.ExitCode, "allocating 512 MiB in a 128 MiB box fails (stderr %q)", res.Stderr)
	assert.NotContains(t, res.Stdout, "survived")
	if res.ExitCode == -1 || res.ExitCode == 137 { // killed (not a MemoryError under an rlimit)
		assert.True(t, slices.ContainsFunc(res.Notices, func(n string) bool {
			return strings.Contains(n, "out of memory") || strings.Contains(n, "out-of-memory")
		}),
			"the agent says the command ran out of memory: %q", res.Notices)
	}
	assert.Equal(t, "alive", ok(t, c, "echo alive"), "the box survives")
}

func (s *suite) pids(t *testing.T) {
	if !s.enforced(t, "pids", s.enforcement().Pids) { // without it a fork bomb would hit the host
		return
	}
	spec := s.spec(t, "pids")
	spec.Limits.Pids = 64
	c := s.up(t, spec)
	ctx := ctxFor(t, time.Minute)
	// The shell stays (sleep) so that the timeout kills the bomb's process
	// group.
	res, err := c.Exec(ctx, agent.ExecRequest{Command: `:(){ :|:& };:; sleep 60`, TimeoutMs: 3000}, nil)
	require.NoError(t, err, "the fork bomb's exec returns")
	t.Logf("fork bomb: exit %d timed out %v", res.ExitCode, res.TimedOut)
	// The bomb's process group was killed at the timeout; stragglers die
	// out. The box must answer again shortly.
	deadline := time.Now().Add(20 * time.Second)
	for {
		short, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := c.Exec(short, agent.ExecRequest{Command: "echo alive", TimeoutMs: 4000}, nil)
		cancel()
		if err == nil && r.ExitCode == 0 && strings.TrimSpace(r.Stdout) == "alive" {
			break
		}
		if time.Now().After(deadline) {
			require.Failf(t, "box dead after a fork bomb", "last: %+v %v", r, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Forking stops at the limit (the agent and the shell count too).
	n := ok(t, c, `python3 -c '
import os, signal
pids = []
try:
    for i in range(200):
        p = os.fork()
        if p == 0:
            signal.pause()
            os._exit(0)
        pids.append(p)
except BlockingIOError:
    pass
for p in pids:
    os.kill(p, 9)
    os.waitpid(p, 0)
print(len(pids))'`)
	forked, err := strconv.Atoi(n)
	require.NoError(t, err)
	// The limit counts every task of the box (agent threads included).
	assert.Less(t, forked, 64, "processes forked under a pids limit of 64")
	assert.Greater(t, forked, 20, "processes forked under a pids limit of 64")
}

// socketSwap: the box owns the directory of its agent socket, so it can
// swap agent.sock for a symlink to a host socket (the Docker Engine's, say)
// between the host's check and its connect. A box does exactly that in a
// tight loop while the host dials again and again; the host must never
// reach the test's socket, and still reaches the agent when the name is
// the real socket.
func (s *suite) socketSwap(t *testing.T) {
	t.Parallel()
	spec := s.spec(t, "swap")
	c := s.up(t, spec)

	evilDir, err := os.MkdirTemp("", "cbe")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(evilDir) })
	evil := filepath.Join(evilDir, "evil.sock")
	l, err := net.Listen("unix", evil)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	var reached atomic.Int64
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			reached.Add(1)
			conn.Close()
		}
	}()

	ctx := ctxFor(t, time.Minute)
	d := backend.SocketDir
	_, err = c.Start(ctx, agent.ExecRequest{Argv: []string{"python3", "-c", `
import os, sys, time
d, evil = sys.argv[1], sys.argv[2]
os.link(d + "/agent.sock", d + "/real")
end = time.time() + 8
while time.time() < end:
    os.symlink(evil, d + "/s.tmp"); os.rename(d + "/s.tmp", d + "/agent.sock")
    os.link(d + "/real", d + "/r.tmp"); os.rename(d + "/r.tmp", d + "/agent.sock")
`, d, evil}})
	require.NoError(t, err)
	sock := filepath.Join(spec.HostDir, backend.SocketName)
	deadline := time.Now().Add(5 * time.Second)
	var answered, refused int
	for time.Now().Before(deadline) {
		fresh := agent.Dial(sock) // a new connection every time
		short, cancel := context.WithTimeout(ctx, time.Second)
		_, err := fresh.Version(short)
		cancel()
		fresh.Close()
		if err == nil {
			answered++
		} else {
			refused++
		}
	}
	t.Logf("dials during the swap loop: %d answered by the agent, %d refused", answered, refused)
	assert.Zero(t, reached.Load(), "the host connected to a socket the box's symlink pointed at")
	assert.Positive(t, answered, "the real socket is still reached")
}

// diskCap: a box that fills its disk gets ENOSPC inside, /workspace and
// /tmp together, and its disk goes with Remove. (A box used to write into
// the host's disk without bound.)
func (s *suite) diskCap(t *testing.T) {
	t.Parallel()
	if !s.enforced(t, "disk", s.enforcement().Disk) {
		return
	}
	spec := s.spec(t, "disk")
	spec.Limits.DiskBytes = 256 << 20
	c := s.up(t, spec)

	assert.Equal(t, "same", ok(t, c, `[ "$(stat -c %d /workspace)" = "$(stat -c %d /tmp)" ] && echo same`), "/tmp is on the box's disk")
	size, err := strconv.ParseInt(ok(t, c, "df -B1 --output=size /workspace | tail -1"), 10, 64)
	require.NoError(t, err)
	assert.LessOrEqual(t, size, int64(256<<20), "the workspace's filesystem is the box's capped disk")

	res := sh(t, c, "head -c 300M /dev/zero > /workspace/big")
	assert.NotEqual(t, 0, res.ExitCode, "writing 300 MiB on a 256 MiB disk fails")
	assert.Contains(t, res.Stderr, "No space left on device")
	ok(t, c, "rm /workspace/big && head -c 100M /dev/zero > /workspace/a")
	res = sh(t, c, "head -c 200M /dev/zero > /tmp/b")
	assert.NotEqual(t, 0, res.ExitCode, "/tmp shares the cap with /workspace")
	assert.Contains(t, res.Stderr, "No space left on device")
	assert.Equal(t, "ok", ok(t, c, "rm /tmp/b && echo small > /workspace/s && echo ok"), "freeing space makes the disk usable again")

	ctx := ctxFor(t, time.Minute)
	require.NoError(t, s.b.Remove(ctx, spec.ID))
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	assert.NotContains(t, string(mounts), spec.ID, "the box's disk is unmounted on Remove")
}

// oomSparesAgent: when a box runs out of memory the kernel kills one of its
// processes, by size. Many commands each smaller than the agent used to
// make the agent the biggest process, and the box died with it. The agent
// now raises each command's oom_score_adj to 1000 (its own stays lower),
// and /tmp is on the box's disk, not in its memory.
func (s *suite) oomSparesAgent(t *testing.T) {
	t.Parallel()
	e := s.enforcement()
	if !e.Memory || slices.ContainsFunc(e.Warnings, func(w string) bool { return strings.HasPrefix(w, "memory:") }) {
		t.Skip("no memory cgroup here: nothing OOM-kills inside a box")
	}
	spec := s.spec(t, "oom")
	spec.Limits.MemoryBytes = 128 << 20
	c := s.up(t, spec)

	// The agent holds 1000 itself for the instant of each fork, so that
	// the child inherits it (a child that forks at once cannot escape);
	// read its own value once this command's fork is over.
	adj := strings.Fields(ok(t, c, `sleep 0.2; cat /proc/1/oom_score_adj /proc/self/oom_score_adj`))
	require.Len(t, adj, 2)
	assert.Equal(t, "1000", adj[1], "commands are the OOM killer's first choice")
	agentAdj, err := strconv.Atoi(adj[0])
	require.NoError(t, err)
	assert.Less(t, agentAdj, 1000, "the agent (PID 1) comes after its commands")
	ok(t, c, "head -c 200M /dev/zero > /tmp/big && rm /tmp/big") // disk, not memory

	// 40 processes of ~5 MiB each: 200 MiB in a 128 MiB box, every one
	// smaller than the agent.
	// Forty interpreters starting in a box short of memory take long on a
	// busy machine (a loaded CI run passed the 30 s of sh): a timeout of
	// minutes is a safety net, not a pass mark.
	res, err := c.Exec(ctxFor(t, 4*time.Minute), agent.ExecRequest{TimeoutMs: 180000,
		Command: `for i in $(seq 40); do python3 -c 'import time; x = bytearray(5 << 20); time.sleep(5)' & done; wait; echo done`}, nil)
	require.NoError(t, err)
	assert.Contains(t, res.Stdout, "done", "exit %d, timed out %v, stderr %q", res.ExitCode, res.TimedOut, res.Stderr)
	assert.Contains(t, res.Stderr, "Killed", "the box ran out of memory and lost commands")
	assert.Equal(t, "alive", ok(t, c, "echo alive"), "the agent survived the box's OOM")
	v, err := c.Version(ctxFor(t, 10*time.Second))
	require.NoError(t, err)
	assert.Equal(t, 1, v.PID)
}

// MeasureStartup creates, starts and removes n boxes one after the other
// and returns the time from Create to the agent's first answer, sorted.
func MeasureStartup(t *testing.T, b backend.Backend, o Options, n int) []time.Duration {
	t.Helper()
	s := &suite{b: b, o: o, session: "cbt-" + randHex(4), remote: b.Capabilities().Remote}
	ctx := ctxFor(t, 5*time.Minute)
	out := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		spec := s.spec(t, "lat")
		t0 := time.Now()
		_, err := b.Create(ctx, spec)
		require.NoError(t, err)
		_, err = b.Start(ctx, spec.ID)
		require.NoError(t, err)
		c := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.Dial(ctx, spec.ID) })
		if !s.remote {
			c.WatchSocket(filepath.Join(spec.HostDir, backend.SocketName))
		}
		require.NoError(t, c.WaitReady(ctx))
		out = append(out, time.Since(t0))
		c.Close()
		require.NoError(t, b.Remove(ctx, spec.ID))
	}
	slices.Sort(out)
	return out
}

// Percentile of sorted durations (p in 0..100).
func Percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[(len(sorted)-1)*p/100]
}

// hostUID is the host uid the box user is (through the box's user
// namespace, if it has one).
func hostUID(t *testing.T, c *agent.Client) int {
	t.Helper()
	out := ok(t, c, `u=$(id -u); awk -v u=$u '$1 <= u && u < $1 + $3 { print $2 + u - $1 }' /proc/self/uid_map`)
	uid, err := strconv.Atoi(out)
	require.NoError(t, err, "uid_map does not map the box user: %q", out)
	return uid
}
