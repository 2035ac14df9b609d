package docker_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/backend/backendtest"
	"github.com/cellbox/cellbox/sandbox/backend/boxdisk"
	"github.com/cellbox/cellbox/sandbox/backend/boxuid"
	"github.com/cellbox/cellbox/sandbox/backend/seccomp"
	"github.com/cellbox/cellbox/sandbox/docker"
)

func newBackend(t *testing.T) backend.Backend {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := docker.New(ctx, docker.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	return b
}

func TestConformance(t *testing.T) {
	testenv.RequireDocker(t)
	// CELLBOX_TEST_IMAGE=cellbox/base runs the suite on a built image.
	backendtest.RunWith(t, newBackend, backendtest.Options{
		AgentBinary: testenv.CellboxBinary(t),
		Image:       os.Getenv("CELLBOX_TEST_IMAGE"),
	})
}

// TestStartupLatency (CELLBOX_BENCH=1) reports create+start → agent ready
// beside `docker run --rm` of the same image.
func TestStartupLatency(t *testing.T) {
	if os.Getenv("CELLBOX_BENCH") == "" {
		t.Skip("set CELLBOX_BENCH=1 to measure")
	}
	testenv.RequireDocker(t)
	b := newBackend(t)
	o := backendtest.Options{AgentBinary: testenv.CellboxBinary(t), Image: os.Getenv("CELLBOX_TEST_IMAGE")}
	got := backendtest.MeasureStartup(t, b, o, 20)
	var base []time.Duration
	for i := 0; i < 20; i++ {
		t0 := time.Now()
		out, err := exec.Command("docker", "run", "--rm", "--network", "none", "-v", "/usr:/usr:ro", docker.HostImage, "/usr/bin/true").CombinedOutput()
		require.NoError(t, err, "%s", out)
		base = append(base, time.Since(t0))
	}
	slices.Sort(base)
	t.Logf("docker create+start → agent ready: p50 %v p95 %v; docker run --rm true: p50 %v p95 %v",
		backendtest.Percentile(got, 50), backendtest.Percentile(got, 95), backendtest.Percentile(base, 50), backendtest.Percentile(base, 95))
}

// spec is a box spec whose box is removed at the end of the test.
func spec(t *testing.T, b *docker.Backend, id string) backend.Spec {
	dir, err := os.MkdirTemp("", "cbd")
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Remove(context.Background(), id); _ = os.RemoveAll(dir) })
	return backend.Spec{ID: id, AgentBinary: testenv.CellboxBinary(t), HostDir: dir}
}

func TestContainerConfig(t *testing.T) {
	testenv.RequireDocker(t)
	b := newBackend(t).(*docker.Backend)
	ctx := context.Background()
	sp := spec(t, b, "cbd-config-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	sp.Limits = backend.Limits{MemoryBytes: 300 << 20, CPUs: 1.5, Pids: 99}
	sp.Env = map[string]string{"A": "1"}
	_, err := b.Create(ctx, sp)
	require.NoError(t, err)

	cli, err := client.New(client.FromEnv)
	require.NoError(t, err)
	defer cli.Close()
	res, err := cli.ContainerInspect(ctx, sp.ID, client.ContainerInspectOptions{})
	require.NoError(t, err)
	hc, cfg := res.Container.HostConfig, res.Container.Config
	assert.Equal(t, int64(300<<20), hc.Memory)
	assert.Equal(t, int64(300<<20), hc.MemorySwap, "no swap beyond the memory limit")
	assert.Equal(t, int64(1.5e9), hc.NanoCPUs)
	require.NotNil(t, hc.PidsLimit)
	assert.Equal(t, int64(99), *hc.PidsLimit)
	assert.Equal(t, []string{"ALL"}, hc.CapDrop)
	assert.Empty(t, hc.CapAdd)
	assert.Equal(t, []string{"no-new-privileges", "seccomp=" + seccomp.DockerProfile()}, hc.SecurityOpt)
	assert.Equal(t, "none", string(hc.NetworkMode))
	assert.False(t, hc.Privileged)
	assert.True(t, hc.ReadonlyRootfs, "the root filesystem is read-only")
	assert.Equal(t, []string{backend.AgentPath, "agent"}, cfg.Cmd)
	uid, err := strconv.Atoi(cfg.Labels["cellbox.uid"])
	require.NoError(t, err, "the box's uid label")
	assert.Equal(t, fmt.Sprintf("%d:%d", uid, uid), cfg.User, "the box runs as its own uid")
	assert.GreaterOrEqual(t, uid, boxuid.Docker.Base)
	assert.LessOrEqual(t, uid, boxuid.Docker.Last())
	assert.Equal(t, backend.Workspace, cfg.WorkingDir)
	assert.Contains(t, cfg.Env, "A=1")
	assert.Contains(t, cfg.Env, "HOME="+backend.Workspace)
	assert.Contains(t, hc.Mounts, mount.Mount{Type: mount.TypeBind, Source: sp.AgentBinary, Target: backend.AgentPath, ReadOnly: true})
	assert.Contains(t, hc.Mounts, mount.Mount{Type: mount.TypeBind, Source: sp.HostDir, Target: backend.SocketDir})
	assert.Contains(t, hc.Mounts, mount.Mount{Type: mount.TypeBind, Source: "/usr", Target: "/usr", ReadOnly: true})
}

// A container that is not a box (no cellbox labels) is invisible to the
// backend, even under a box's name.
func TestForeignContainerIsNotABox(t *testing.T) {
	testenv.RequireDocker(t)
	b := newBackend(t).(*docker.Backend)
	ctx := context.Background()
	// Create a box first so that the host image exists.
	sp := spec(t, b, "cbd-own-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	_, err := b.Create(ctx, sp)
	require.NoError(t, err)

	cli, err := client.New(client.FromEnv)
	require.NoError(t, err)
	defer cli.Close()
	name := "cbd-foreign-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	_, err = cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: name, Config: &container.Config{Image: docker.HostImage, Cmd: []string{"/usr/bin/true"}}})
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = cli.ContainerRemove(context.Background(), name, client.ContainerRemoveOptions{Force: true})
	})

	_, err = b.Inspect(ctx, name)
	assert.ErrorIs(t, err, backend.ErrNotFound)
	_, err = b.Start(ctx, name)
	assert.ErrorIs(t, err, backend.ErrNotFound)
	require.NoError(t, b.Remove(ctx, name))
	_, err = cli.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
	assert.NoError(t, err, "Remove left the foreign container alone")
	all, err := b.List(ctx, nil)
	require.NoError(t, err)
	for _, in := range all {
		assert.NotEqual(t, name, in.ID)
	}
}

// A disk whose container is gone (a `docker rm -f` behind cellbox's back)
// is unmounted and removed by the next backend once it is old enough; a
// fresh one (a Create in flight) and a box's disk stay.
func TestOrphanDisksAreSwept(t *testing.T) {
	testenv.RequireDocker(t)
	testenv.RequireRoot(t, "box disks")
	ctx := context.Background()
	dir := t.TempDir()
	b, err := docker.New(ctx, docker.Options{DiskDir: dir})
	require.NoError(t, err)
	defer b.Close()
	sp := spec(t, b, "cbd-kept-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	_, err = b.Create(ctx, sp)
	require.NoError(t, err)
	t.Cleanup(func() { b.Remove(context.Background(), sp.ID) })

	old := time.Now().Add(-2 * docker.OrphanDiskAge)
	disk := func(id string) boxdisk.Disk {
		return boxdisk.Disk{File: filepath.Join(dir, id+".img"), Dir: filepath.Join(dir, id)}
	}
	orphan, fresh := disk("cb-orphan"), disk("cb-fresh")
	for _, d := range []boxdisk.Disk{orphan, fresh} {
		require.NoError(t, d.Make(ctx, 64<<20, 0, 0))
		t.Cleanup(func() { d.Remove(context.Background()) })
	}
	for _, p := range []string{orphan.File, orphan.Dir, disk(sp.ID).File, disk(sp.ID).Dir} {
		require.NoError(t, os.Chtimes(p, old, old))
	}

	b2, err := docker.New(ctx, docker.Options{DiskDir: dir})
	require.NoError(t, err)
	defer b2.Close()
	assert.False(t, orphan.Mounted(), "the orphan disk is unmounted")
	assert.NoFileExists(t, orphan.File)
	assert.NoDirExists(t, orphan.Dir)
	assert.True(t, fresh.Mounted(), "a fresh disk may be a Create in flight")
	assert.FileExists(t, disk(sp.ID).File, "a box's disk stays")
	_, err = b2.Start(ctx, sp.ID)
	require.NoError(t, err, "the box still starts")

	// Disks of another engine (DOCKER_HOST pointed at an engine on another
	// machine, whose containers say nothing of them) are never swept.
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".engine"), []byte("another-engine-id"), 0o600))
	stray := disk("cb-stray")
	require.NoError(t, stray.Make(ctx, 64<<20, 0, 0))
	t.Cleanup(func() { stray.Remove(context.Background()) })
	for _, p := range []string{stray.File, stray.Dir} {
		require.NoError(t, os.Chtimes(p, old, old))
	}
	b3, err := docker.New(ctx, docker.Options{DiskDir: dir})
	require.NoError(t, err)
	defer b3.Close()
	assert.FileExists(t, stray.File, "another engine's disk stays")
	assert.True(t, stray.Mounted())
}
