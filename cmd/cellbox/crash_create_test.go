package main

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/crashpoint"
	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/docker"
	"github.com/cellbox/cellbox/sandboxclient"
)

// The steps of making a box, in order: the server's, the disk's (both
// backends make one), and each backend's own.
var (
	createSteps = map[string][]string{
		"local":  {"box.hostdir", "local.dir", "local.uid", "disk.file", "disk.formatted", "disk.mounted", "local.disk", "box.created", "box.started", "box.stored"},
		"docker": {"box.hostdir", "docker.marked", "docker.uid", "disk.file", "disk.formatted", "disk.mounted", "docker.disk", "docker.container", "box.created", "box.started", "box.stored"},
	}
	crashLine = regexp.MustCompile(`crash point (\S+) \(.*?(cb-[0-9a-f]{16})`)
)

// TestServerKilledWhileMakingABox kills `cellbox serve` (SIGKILL, from
// inside, at a named point) at each step of making a box, on both
// backends, then starts it again over the same data directory: whatever
// the step left — a box directory, a disk (mounted), a uid reserved, a
// container, a host directory — is gone once the new server is up, and
// the box a user asked for is made anew on the next call. Killed after
// the box was stored, the box is the user's and stays, with its files.
func TestServerKilledWhileMakingABox(t *testing.T) {
	for _, kind := range []string{"local", "docker"} {
		t.Run(kind, func(t *testing.T) {
			if kind == "local" {
				testenv.RequireBwrap(t)
			} else {
				testenv.RequireDocker(t)
			}
			for _, step := range createSteps[kind] {
				t.Run(step, func(t *testing.T) { crashWhileMaking(t, kind, step) })
			}
		})
	}
}

func crashWhileMaking(t *testing.T, kind, step string) {
	data, err := os.MkdirTemp("", "cbk-") // short: socket paths go under it
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(data) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := startServeEnv(t, data, []string{crashpoint.Env + "=" + step}, "--pool", "0", "--backend", kind)
	c, err := sandboxclient.NewSessionWithKey(ctx, srv.url, srv.key)
	require.NoError(t, err)
	id, token := c.Session()
	_, err = c.Tool(ctx, "shell", map[string]any{"command": "echo made > made.txt"})
	require.Error(t, err, "the server died making the box")
	var exit error
	select {
	case exit = <-srv.done:
		srv.done <- exit
	case <-time.After(time.Minute):
		t.Fatal("the server did not die")
	}
	var ee interface{ Sys() any }
	require.True(t, errors.As(exit, &ee), "exit: %v", exit)
	ws, _ := ee.Sys().(syscall.WaitStatus)
	require.Equal(t, syscall.SIGKILL, ws.Signal(), "killed at the crash point: %v; stderr:\n%s", exit, srv.stderr)
	m := crashLine.FindStringSubmatch(srv.stderr.String())
	require.NotNil(t, m, "the crash point names the box: %s", srv.stderr)
	require.Equal(t, step, m[1])
	box := m[2]
	if kind == "docker" {
		t.Cleanup(func() { removeDockerBox(t, box) })
	}
	left := traces(t, kind, data, box)
	if step != "box.hostdir" {
		require.NotEmpty(t, left, "the kill at %s left something behind to clean up", step)
	}

	srv = startServe(t, data, "--pool", "0", "--backend", kind)
	c = sandboxclient.New(srv.url, id, token)
	if step == "box.stored" {
		assert.NotEmpty(t, traces(t, kind, data, box), "a stored box is the user's: it stays")
		out, err := c.Tool(ctx, "read_file", map[string]any{"path": "made.txt"})
		if assert.Error(t, err, "the command never ran") {
			assert.Contains(t, err.Error(), "no such file")
		}
		_ = out
	} else {
		assert.Empty(t, traces(t, kind, data, box), "the restarted server removed what the kill at %s left (it had: %v)", step, left)
	}
	out, err := c.Tool(ctx, "shell", map[string]any{"command": "echo made > made.txt; cat made.txt"})
	require.NoError(t, err, "the session makes its box on the next call")
	var sh api.ShellOutput
	require.NoError(t, json.Unmarshal(out, &sh))
	assert.Equal(t, "made\n", sh.Stdout)
}

// traces lists what of box id exists on the host: its directories and
// files, disk mounts, uid reservation, container.
func traces(t *testing.T, kind, data, id string) []string {
	t.Helper()
	var found []string
	exists := func(p string) {
		if _, err := os.Lstat(p); err == nil {
			found = append(found, p)
		} else if !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("lstat %s: %v", p, err)
		}
	}
	reserved := func(dir string) {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if owner, err := os.ReadFile(filepath.Join(dir, e.Name())); err == nil && string(owner) == id {
				found = append(found, "uid reservation "+filepath.Join(dir, e.Name()))
			}
		}
	}
	exists(filepath.Join(data, "boxes", id))
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	for _, line := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.Contains(f[4], id) {
			found = append(found, "mount "+f[4])
		}
	}
	switch kind {
	case "local":
		exists(filepath.Join(data, "local", id))
		reserved(filepath.Join(data, "local", ".uids"))
	case "docker":
		disks := docker.DefaultDiskDir
		for _, p := range []string{id, id + ".img", filepath.Join(".making", id)} {
			exists(filepath.Join(disks, p))
		}
		reserved(filepath.Join(disks, ".uids"))
		db, err := docker.New(context.Background(), docker.Options{})
		require.NoError(t, err)
		defer db.Close()
		if _, err := db.Inspect(context.Background(), id); err == nil {
			found = append(found, "container "+id)
		} else if !errors.Is(err, backend.ErrNotFound) {
			t.Errorf("inspect %s: %v", id, err)
		}
	}
	return found
}

// removeDockerBox removes box id from the engine, whatever is left of it.
func removeDockerBox(t *testing.T, id string) {
	db, err := docker.New(context.Background(), docker.Options{})
	if err != nil {
		t.Errorf("remove box %s: %v", id, err)
		return
	}
	defer db.Close()
	if err := db.Remove(context.Background(), id); err != nil {
		t.Errorf("remove box %s: %v", id, err)
	}
}
