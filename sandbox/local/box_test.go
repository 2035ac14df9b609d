package local_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/local"
)

// box creates and starts a box on b and waits for its agent.
func box(t *testing.T, b *local.Backend, id string, lim backend.Limits) (backend.Spec, *agent.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "cbl")
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Remove(context.Background(), id); _ = os.RemoveAll(dir) })
	spec := backend.Spec{ID: id, AgentBinary: testenv.CellboxBinary(t), HostDir: dir, Limits: lim}
	_, err = b.Create(ctx, spec)
	require.NoError(t, err)
	_, err = b.Start(ctx, id)
	require.NoError(t, err)
	c := agent.Dial(filepath.Join(dir, backend.SocketName))
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.WaitReady(ctx))
	return spec, c
}

func newLocal(t *testing.T, root string) *local.Backend {
	t.Helper()
	b, err := local.New(local.Options{Root: root})
	require.NoError(t, err)
	return b
}

func requireCgroups(t *testing.T, b *local.Backend) {
	t.Helper()
	if e := b.Capabilities().Limits; !e.Memory || !e.Pids || !e.CPU || len(e.Warnings) > 0 {
		testenv.Missing(t, fmt.Sprintf("writable cgroups v1 (%v)", e.Warnings))
	}
}

func cgroupFile(ctrl, id, file string) string {
	return filepath.Join("/sys/fs/cgroup", ctrl, "cellbox", id, file)
}

func TestCgroupLimitsAndStopLeavesNothing(t *testing.T) {
	testenv.RequireBwrap(t)
	b := newLocal(t, t.TempDir())
	requireCgroups(t, b)
	id := "cgl-" + fmt.Sprint(time.Now().UnixNano())
	_, c := box(t, b, id, backend.Limits{MemoryBytes: 200 << 20, CPUs: 0.5, Pids: 77})

	for _, tc := range []struct{ ctrl, file, want string }{
		{"memory", "memory.limit_in_bytes", fmt.Sprint(200 << 20)},
		{"pids", "pids.max", "77"},
		{"cpu", "cpu.cfs_quota_us", "50000"},
		{"cpu", "cpu.cfs_period_us", "100000"},
	} {
		got, err := os.ReadFile(cgroupFile(tc.ctrl, id, tc.file))
		require.NoError(t, err)
		assert.Equal(t, tc.want, strings.TrimSpace(string(got)), tc.file)
	}

	// A background process in a session of its own is in the box's cgroup
	// and dies with the box.
	ctx := context.Background()
	_, err := c.Start(ctx, agent.ExecRequest{Command: "exec setsid sleep 1000"})
	require.NoError(t, err)
	var pids []string
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(cgroupFile("pids", id, "cgroup.procs"))
		pids = strings.Fields(string(b))
		return len(pids) >= 3 // bwrap, agent, sleep
	}, 5*time.Second, 20*time.Millisecond)

	require.NoError(t, b.Stop(ctx, id))
	for _, p := range pids {
		_, err := os.Stat("/proc/" + p)
		assert.True(t, os.IsNotExist(err), "process %s of the box still exists after Stop", p)
	}
	for _, ctrl := range []string{"memory", "pids", "cpu"} {
		_, err := os.Stat(cgroupFile(ctrl, id, ""))
		assert.True(t, os.IsNotExist(err), "cgroup %s of the box still exists after Stop", ctrl)
	}
}

func TestWithoutCgroupsReportsWhatIsNotEnforced(t *testing.T) {
	testenv.RequireBwrap(t)
	b, err := local.New(local.Options{Root: t.TempDir(), CgroupRoot: "-"})
	require.NoError(t, err)
	e := b.Capabilities().Limits
	assert.True(t, e.Memory, "memory falls back to RLIMIT_DATA")
	assert.False(t, e.Pids)
	assert.False(t, e.CPU)
	assert.Len(t, b.Capabilities().Limits.Warnings, 3)
	_, c := box(t, b, "nocg-"+fmt.Sprint(time.Now().UnixNano()), backend.Limits{MemoryBytes: 64 << 20})
	res, err := c.Exec(context.Background(), agent.ExecRequest{Command: "ulimit -d"}, nil)
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprint(128<<10), strings.TrimSpace(res.Stdout), "RLIMIT_DATA in KiB, at least 128 MiB")
}

func TestRemoveDoesNotFollowSymlinks(t *testing.T) {
	testenv.RequireBwrap(t)
	b := newLocal(t, t.TempDir())
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	require.NoError(t, os.WriteFile(victim, []byte("keep me"), 0o644))
	id := "sym-" + fmt.Sprint(time.Now().UnixNano())
	_, c := box(t, b, id, backend.Limits{})
	// The box can only make links whose targets are host paths by name.
	res, err := c.Exec(context.Background(), agent.ExecRequest{Command: fmt.Sprintf(
		"ln -s %s /workspace/dir && ln -s %s /workspace/file && ln -s / /workspace/root && mkdir -p a/b && ln -s %s a/b/up",
		outside, victim, outside)}, nil)
	require.NoError(t, err)
	require.Equal(t, 0, res.ExitCode, res.Stderr)

	require.NoError(t, b.Remove(context.Background(), id))
	got, err := os.ReadFile(victim)
	require.NoError(t, err)
	assert.Equal(t, "keep me", string(got))
	_, err = b.Inspect(context.Background(), id)
	assert.ErrorIs(t, err, backend.ErrNotFound)
}

// TestBoxOutlivesServer starts a box from another process (a server) that
// then exits; this process reattaches to the still running box.
func TestBoxOutlivesServer(t *testing.T) {
	testenv.RequireBwrap(t)
	if os.Getenv("CELLBOX_LOCAL_TEST_SERVER") != "" {
		return // the server's part runs in TestServerPart
	}
	root := t.TempDir()
	hostDir, err := os.MkdirTemp("", "cbl")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(hostDir) })
	id := "outlive-" + fmt.Sprint(time.Now().UnixNano())

	cmd := exec.Command(os.Args[0], "-test.run=^TestServerPart$", "-test.count=1")
	cmd.Env = append(os.Environ(), "CELLBOX_LOCAL_TEST_SERVER="+strings.Join([]string{root, hostDir, id, testenv.CellboxBinary(t)}, "\n"))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "server process: %s", out)

	b := newLocal(t, root)
	t.Cleanup(func() { _ = b.Remove(context.Background(), id) })
	in, err := b.Inspect(context.Background(), id)
	require.NoError(t, err)
	assert.Equal(t, backend.StateRunning, in.State, "the box runs after its server exited")
	c := agent.Dial(filepath.Join(hostDir, backend.SocketName))
	defer c.Close()
	res, err := c.Exec(context.Background(), agent.ExecRequest{Command: "cat /workspace/mark"}, nil)
	require.NoError(t, err)
	assert.Equal(t, "from the first server\n", res.Stdout)

	require.NoError(t, b.Stop(context.Background(), id))
	in, err = b.Inspect(context.Background(), id)
	require.NoError(t, err)
	assert.Equal(t, backend.StateStopped, in.State)
}

// TestServerPart is the first server of TestBoxOutlivesServer.
func TestServerPart(t *testing.T) {
	env := os.Getenv("CELLBOX_LOCAL_TEST_SERVER")
	if env == "" {
		t.Skip("run by TestBoxOutlivesServer")
	}
	p := strings.Split(env, "\n")
	root, hostDir, id, bin := p[0], p[1], p[2], p[3]
	b := newLocal(t, root)
	ctx := context.Background()
	_, err := b.Create(ctx, backend.Spec{ID: id, AgentBinary: bin, HostDir: hostDir})
	require.NoError(t, err)
	_, err = b.Start(ctx, id)
	require.NoError(t, err)
	c := agent.Dial(filepath.Join(hostDir, backend.SocketName))
	require.NoError(t, c.WaitReady(ctx))
	res, err := c.Exec(ctx, agent.ExecRequest{Command: "echo from the first server > /workspace/mark"}, nil)
	require.NoError(t, err)
	require.Equal(t, 0, res.ExitCode)
}

// The box user is a host uid of the box's own, not root: what it writes
// is owned on the host by that uid, and two boxes do not share one.
func TestBoxUserIsUnprivilegedHostUID(t *testing.T) {
	testenv.RequireBwrap(t)
	root := t.TempDir()
	b := newLocal(t, root)
	hostUID := func(c *agent.Client) int {
		res, err := c.Exec(context.Background(), agent.ExecRequest{Command: `u=$(id -u); awk -v u=$u '$1 <= u && u < $1 + $3 { print $2 + u - $1 }' /proc/self/uid_map; echo x > /workspace/f`}, nil)
		require.NoError(t, err)
		require.Equal(t, 0, res.ExitCode, res.Stderr)
		uid, err := strconv.Atoi(strings.TrimSpace(res.Stdout))
		require.NoError(t, err, "uid_map: %q", res.Stdout)
		return uid
	}
	var uids []int
	for _, name := range []string{"uida", "uidb"} {
		id := name + "-" + fmt.Sprint(time.Now().UnixNano())
		_, c := box(t, b, id, backend.Limits{})
		uid := hostUID(c)
		assert.NotZero(t, uid, "the box user is host root")
		fi, err := os.Stat(filepath.Join(root, id, "disk", "workspace", "f"))
		require.NoError(t, err)
		st := fi.Sys().(*syscall.Stat_t)
		assert.Equal(t, uid, int(st.Uid), "owner on the host of a file the box wrote")
		assert.Equal(t, uid, int(st.Gid), "group on the host of a file the box wrote")
		// The agent (PID 1 of the box) as the host sees it.
		var state struct {
			Agent struct {
				PID int `json:"pid"`
			} `json:"agent"`
		}
		data, err := os.ReadFile(filepath.Join(root, id, "state.json"))
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(data, &state))
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", state.Agent.PID))
		require.NoError(t, err)
		for _, line := range strings.Split(string(status), "\n") {
			if f := strings.Fields(line); len(f) == 5 && (f[0] == "Uid:" || f[0] == "Gid:") {
				assert.Equal(t, []string{f[0], fmt.Sprint(uid), fmt.Sprint(uid), fmt.Sprint(uid), fmt.Sprint(uid)}, f, "the agent's host ids (real, effective, saved, fs)")
			}
			if strings.HasPrefix(line, "Groups:") {
				assert.Equal(t, []string{"Groups:"}, strings.Fields(line), "the agent's supplementary groups")
			}
		}
		uids = append(uids, uid)
	}
	assert.NotEqual(t, uids[0], uids[1], "two boxes share a host uid")
}

// A box's uid is reserved in Root/.uids while the box exists; Remove, or
// the next backend for a box that has no directory, frees it.
func TestHostUIDReservations(t *testing.T) {
	testenv.RequireBwrap(t)
	root := t.TempDir()
	b := newLocal(t, root)
	ctx := context.Background()
	id := "res-" + fmt.Sprint(time.Now().UnixNano())
	_, err := b.Create(ctx, backend.Spec{ID: id, AgentBinary: testenv.CellboxBinary(t), HostDir: t.TempDir()})
	require.NoError(t, err)
	reserved := func() []string {
		ents, err := os.ReadDir(filepath.Join(root, ".uids"))
		require.NoError(t, err)
		var ids []string
		for _, e := range ents {
			data, err := os.ReadFile(filepath.Join(root, ".uids", e.Name()))
			require.NoError(t, err)
			ids = append(ids, string(data))
		}
		return ids
	}
	assert.Equal(t, []string{id}, reserved())
	require.NoError(t, b.Remove(ctx, id))
	assert.Empty(t, reserved())

	// A reservation left by a process killed between the two goes with
	// the next backend over the root, however fresh (the root is one
	// backend's: no Create is in flight).
	stale := filepath.Join(root, ".uids", "7")
	require.NoError(t, os.WriteFile(stale, []byte("gone-box"), 0o600))
	newLocal(t, root)
	assert.Empty(t, reserved())
}

// A box made before boxes had host uids of their own (no uid in
// spec.json, its workspace written as host root) gets one on Start, with
// its workspace.
func TestOldBoxGetsAHostUID(t *testing.T) {
	testenv.RequireBwrap(t)
	root := t.TempDir()
	b := newLocal(t, root)
	ctx := context.Background()
	id := "old-" + fmt.Sprint(time.Now().UnixNano())
	hostDir := t.TempDir()
	_, err := b.Create(ctx, backend.Spec{ID: id, AgentBinary: testenv.CellboxBinary(t), HostDir: hostDir})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Remove(context.Background(), id) })

	specFile := filepath.Join(root, id, "spec.json")
	var bf map[string]any
	data, err := os.ReadFile(specFile)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &bf))
	delete(bf, "uid")
	data, err = json.Marshal(bf)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(specFile, data, 0o600))
	ws := filepath.Join(root, id, "disk", "workspace")
	require.NoError(t, os.Lchown(ws, 0, 0))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "old.txt"), []byte("old\n"), 0o644))

	_, err = b.Start(ctx, id)
	require.NoError(t, err)
	c := agent.Dial(filepath.Join(hostDir, backend.SocketName))
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.WaitReady(ctx))
	res, err := c.Exec(ctx, agent.ExecRequest{Command: "echo new >> old.txt && echo x > new.txt && cat old.txt"}, nil)
	require.NoError(t, err)
	require.Equal(t, 0, res.ExitCode, res.Stderr)
	assert.Equal(t, "old\nnew\n", res.Stdout)
	fi, err := os.Stat(filepath.Join(ws, "new.txt"))
	require.NoError(t, err)
	assert.NotZero(t, fi.Sys().(*syscall.Stat_t).Uid)
}
