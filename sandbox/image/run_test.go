package image

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
)

// TestRunLoggedBothStreams runs a command that writes stdout and stderr in
// turn, as debootstrap and apt-get do, into one build log. Run with -race: a
// build step whose two streams were copied into the log by two goroutines
// raced on the first image build of a machine.
func TestRunLoggedBothStreams(t *testing.T) {
	var log bytes.Buffer
	tail, err := runLogged(context.Background(), &log, "sh", "-c", `for i in $(seq 300); do echo out$i; echo err$i >&2; done; exit 3`)
	require.Error(t, err, "the exit status comes back")
	lines := strings.Split(strings.TrimSpace(log.String()), "\n")
	require.Len(t, lines, 600, "every line of both streams is in the log")
	assert.Equal(t, []string{"out1", "err1", "out2"}, lines[:3], "in the order written")
	assert.True(t, strings.HasSuffix(tail.String(), "out300\nerr300"), "the tail ends with the last lines: %q", tail.String()[max(0, len(tail.String())-40):])
	assert.LessOrEqual(t, len(tail.String()), 4096)
}

// lockedBuffer is a bytes.Buffer a test reads while a command writes it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// running reports whether process pid runs (exists and is no zombie).
func running(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// TestRunLoggedStopEndsTheGroup stops a build step that forked, as
// debootstrap does (subshells, wget, chroot dpkg): the step returns at once
// and none of its processes runs on. Before, only the step's own process
// was killed and the step waited for its forks, which held its output.
func TestRunLoggedStopEndsTheGroup(t *testing.T) {
	for _, tc := range []struct{ name, script string }{
		// The pids echoed are of the processes that would run on; each
		// loop's sleep ends by itself.
		{"forks that stop on SIGTERM", `sleep 300 & echo $!; while :; do sleep 1; done & echo $!; echo started; wait`},
		{"forks that ignore SIGTERM", `trap '' TERM; sh -c 'while :; do sleep 1; done' & echo $!; echo started; while :; do sleep 1; done`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			out := &lockedBuffer{}
			done := make(chan error, 1)
			go func() {
				_, err := runLogged(ctx, out, "sh", "-c", tc.script)
				done <- err
			}()
			require.Eventually(t, func() bool { return strings.Contains(out.String(), "started") }, 10*time.Second, 5*time.Millisecond)
			var pids []int
			for _, f := range strings.Fields(strings.TrimSuffix(out.String(), "started\n")) {
				pid, err := strconv.Atoi(f)
				require.NoError(t, err, out.String())
				pids = append(pids, pid)
			}
			t.Cleanup(func() {
				for _, pid := range pids {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			})
			start := time.Now()
			cancel()
			select {
			case err := <-done:
				require.Error(t, err)
			case <-time.After(10 * time.Second): // the safety net: it takes at most stopGrace
				t.Fatal("the step still runs 10 s after its context ended")
			}
			took := time.Since(start)
			assert.Less(t, took, stopGrace+time.Second)
			for _, pid := range pids {
				assert.False(t, running(pid), "process %d of the step runs on", pid)
			}
		})
	}
}

// TestRemoveBuildingUnmounts removes a partial rootfs in which a killed
// debootstrap left the host's /dev/shm bound, and /proc and a tmpfs /dev
// mounted: the host's files stay, nothing stays mounted, the rootfs goes.
// os.RemoveAll alone descended into the mounts (and emptied the host's
// directory).
func TestRemoveBuildingUnmounts(t *testing.T) {
	testenv.RequireRoot(t, "mount")
	host := t.TempDir()
	keep := filepath.Join(host, "keep")
	require.NoError(t, os.WriteFile(keep, []byte("the host's"), 0o644))
	// A space: the mount table writes it \040.
	tmp := filepath.Join(t.TempDir(), "with space", "rootfs.building")
	inTable := strings.ReplaceAll(tmp, " ", `\040`)
	shm := filepath.Join(tmp, "dev", "shm")
	t.Cleanup(func() { // before the temp dirs go, whatever removeBuilding did
		for _, p := range []string{shm, shm, filepath.Join(tmp, "dev"), filepath.Join(tmp, "proc")} {
			syscall.Unmount(p, syscall.MNT_DETACH)
		}
	})
	for _, d := range []string{"proc", "dev", "etc"} {
		require.NoError(t, os.MkdirAll(filepath.Join(tmp, d), 0o755))
	}
	require.NoError(t, syscall.Mount("proc", filepath.Join(tmp, "proc"), "proc", 0, ""))
	require.NoError(t, syscall.Mount("nodev", filepath.Join(tmp, "dev"), "tmpfs", 0, ""))
	require.NoError(t, os.Mkdir(shm, 0o755))
	require.NoError(t, syscall.Mount(host, shm, "", syscall.MS_BIND, ""))
	require.NoError(t, syscall.Mount(host, shm, "", syscall.MS_BIND, "")) // stacked, as a second run binds again
	require.Len(t, testenv.Mounts(t, inTable), 4)

	require.NoError(t, removeBuilding(tmp))
	assert.Empty(t, testenv.Mounts(t, inTable))
	assert.NoDirExists(t, tmp)
	b, err := os.ReadFile(keep)
	require.NoError(t, err, "the host's file stays")
	assert.Equal(t, "the host's", string(b))
	require.NoError(t, removeBuilding(tmp), "nothing to remove: no error")

	// A stopped build's: out of the way at once, removed, the host's
	// files kept; what a stop left is swept by the next build.
	rootfs := strings.TrimSuffix(tmp, ".building")
	require.NoError(t, os.MkdirAll(shm, 0o755))
	require.NoError(t, syscall.Mount(host, shm, "", syscall.MS_BIND, ""))
	left, err := discard(rootfs)
	require.NoError(t, err)
	assert.Empty(t, left)
	assert.Empty(t, testenv.Mounts(t, inTable))
	assert.NoDirExists(t, tmp)
	assert.FileExists(t, keep)
	left, err = discard(rootfs)
	require.NoError(t, err, "nothing to discard: no error")
	assert.Empty(t, left)
	leftover := rootfs + ".removing-x"
	require.NoError(t, os.MkdirAll(filepath.Join(leftover, "usr"), 0o755))
	require.NoError(t, sweep(rootfs))
	assert.NoDirExists(t, leftover)
	assert.FileExists(t, keep)
}
