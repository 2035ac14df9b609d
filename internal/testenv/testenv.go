// Package testenv gives tests the real components they need: a Docker
// Engine, bubblewrap, a static cellbox binary to run as the in-box agent,
// and the benchmarks' binary.
//
// A test that needs a component calls the matching Require function. When the
// component is missing the test is skipped on a developer machine and fails
// when the CI environment variable is set, so CI can never pass by skipping.
package testenv

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// InCI reports whether the tests run under CI (CI is set and not "false").
func InCI() bool {
	v := os.Getenv("CI")
	return v != "" && v != "false" && v != "0"
}

// Missing reports that something a test needs is not here: it fails the
// test under CI and skips it elsewhere, so CI can never pass by skipping.
func Missing(t testing.TB, what string) {
	t.Helper()
	if InCI() {
		t.Fatalf("%s is required when CI is set; run the README's test command, which installs it", what)
	}
	t.Skipf("%s not available (set CI=1 to make this a failure)", what)
}

// RequireCommand returns the path of a command on PATH, or reports it
// Missing.
func RequireCommand(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(t, name+" (command)")
	}
	return p
}

// RequireRoot makes sure the test runs as root.
func RequireRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "root ("+why+")")
	}
}

// DockerSocket is the Engine socket the tests use.
func DockerSocket() string {
	if h := os.Getenv("DOCKER_HOST"); len(h) > len("unix://") && h[:7] == "unix://" {
		return h[7:]
	}
	return "/var/run/docker.sock"
}

// RequireDocker makes sure a Docker Engine answers on its socket.
func RequireDocker(t testing.TB) {
	t.Helper()
	c, err := net.DialTimeout("unix", DockerSocket(), 2*time.Second)
	if err != nil {
		Missing(t, "a Docker Engine ("+DockerSocket()+")")
		return
	}
	c.Close()
}

// RequireBwrap makes sure bubblewrap is installed.
func RequireBwrap(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("bwrap"); err != nil {
		Missing(t, "bubblewrap (bwrap)")
	}
}

// RepoRoot is the module root, found from this source file.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// built is a binary of the module built once per test process.
type built struct {
	once sync.Once
	path string
	err  error
}

var (
	binDirOnce sync.Once
	binDir     string
	binDirErr  error
	cellboxBin built
	agentBin   built
	benchBin   built
	clusterBin built
)

// CellboxBinary builds cmd/cellbox once per test process, statically
// (CGO_ENABLED=0, as in every box), and returns its path. Tests use it as the
// agent binary mounted into boxes and to run the CLI.
//
// cmd/cellbox-agent is built beside it first: the server runs it as the
// boxes' agent when both are of one clean commit (server.AgentBinary), as
// in CI's clone.
func CellboxBinary(t testing.TB) string {
	t.Helper()
	buildBinary(t, &agentBin, "cellbox-agent")
	return buildBinary(t, &cellboxBin, "cellbox")
}

// ClusterBinary builds cellbox-cluster (cmd/cellbox with -tags cluster:
// the cluster's clients linked) beside CellboxBinary's cellbox, which
// execs it for --etcd and --backend kubernetes, and returns cellbox's
// path: call it in a test that asks cellbox for either.
func ClusterBinary(t testing.TB) string {
	t.Helper()
	buildBinary(t, &clusterBin, "cellbox-cluster", "-tags", "cluster", "./cmd/cellbox")
	return CellboxBinary(t)
}

// BenchBinary builds cmd/cellbox-bench once per test process, as
// CellboxBinary builds cellbox and into the same directory, so that
// `cellbox bench` (which runs the cellbox-bench beside it) and
// cellbox-bench (which runs the cellbox beside it) find each other.
func BenchBinary(t testing.TB) string {
	t.Helper()
	return buildBinary(t, &benchBin, "cellbox-bench")
}

// buildBinary builds ./cmd/NAME (or what args say: build flags and a
// package) as NAME into the process's binary directory once.
func buildBinary(t testing.TB, b *built, name string, args ...string) string {
	t.Helper()
	b.once.Do(func() {
		binDirOnce.Do(func() {
			sweepTestBinaries()
			binDir, binDirErr = os.MkdirTemp("", testBinPrefix+strconv.Itoa(os.Getpid())+"-")
		})
		if binDirErr != nil {
			b.err = binDirErr
			return
		}
		b.path = filepath.Join(binDir, name)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if len(args) == 0 {
			args = []string{"./cmd/" + name}
		}
		cmd := exec.CommandContext(ctx, "go", append([]string{"build", "-o", b.path}, args...)...)
		cmd.Dir = RepoRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = &buildError{err: err, out: string(out)}
		}
	})
	if b.err != nil {
		t.Fatalf("build %s: %v", name, b.err)
	}
	return b.path
}

// testBinPrefix names the directories CellboxBinary builds into: the
// prefix, the building process's pid, "-" and a random suffix.
const testBinPrefix = "cellbox-testbin-"

// sweepTestBinaries removes the binaries that test processes no longer
// running built (a test binary has no hook at its exit to remove its own):
// each is 27 MB, one per package per run, and they filled /tmp (1.9 GB
// after a few runs of the suite here). A directory of the earlier layout
// (no pid) goes once it is an hour old.
func sweepTestBinaries() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), testBinPrefix+"*"))
	for _, dir := range dirs {
		rest := strings.TrimPrefix(filepath.Base(dir), testBinPrefix)
		pidText, _, hasPid := strings.Cut(rest, "-")
		if pid, err := strconv.Atoi(pidText); hasPid && err == nil {
			if pid == os.Getpid() || unix.Kill(pid, 0) != unix.ESRCH {
				continue // its process may still use it
			}
		} else if fi, err := os.Stat(dir); err != nil || time.Since(fi.ModTime()) < time.Hour {
			continue
		}
		os.RemoveAll(dir)
	}
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + e.out }

// Mounts returns the lines of this thread's mount table that contain s
// (a box ID: its mounted disk): the table of the namespace the test runs
// in, whichever thread it runs on.
func Mounts(t testing.TB, s string) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		t.Fatalf("read the mount table: %v", err)
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}

// UnmountUnder unmounts (lazily) every mount below dir, deepest first: the
// tmpfs host directories a sandbox service mounts under DATA/boxes, which
// stay mounted for boxes that run on after the service closed, as they
// would in production, and would keep a test's data dir from being
// removed.
func UnmountUnder(t testing.TB, dir string) {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Errorf("read the mount table: %v", err)
		return
	}
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			points = append(points, f[4])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(points)))
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && err != unix.EINVAL {
			t.Errorf("unmount %s: %v", p, err)
		}
	}
}

// ImagesDir is where `cellbox image build` puts images: $CELLBOX_IMAGES,
// else the images folder of the default data dir ($CELLBOX_DATA, else
// ~/.local/share/cellbox).
func ImagesDir() string {
	if d := os.Getenv("CELLBOX_IMAGES"); d != "" {
		return d
	}
	data := os.Getenv("CELLBOX_DATA")
	if data == "" {
		home, _ := os.UserHomeDir()
		data = filepath.Join(home, ".local", "share", "cellbox")
	}
	return filepath.Join(data, "images")
}
