package local_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/backend/backendtest"
	"github.com/cellbox/cellbox/sandbox/local"
)

// imagesDir is where CELLBOX_TEST_IMAGE=cellbox/NAME is looked up:
// $CELLBOX_DATA/images.
func imagesDir() string {
	if d := os.Getenv("CELLBOX_DATA"); d != "" {
		return filepath.Join(d, "images")
	}
	return ""
}

func TestConformance(t *testing.T) {
	testenv.RequireBwrap(t)
	root := t.TempDir()
	newBackend := func(t *testing.T) backend.Backend {
		b, err := local.New(local.Options{Root: root, ImagesDir: imagesDir()})
		require.NoError(t, err)
		return b
	}
	backendtest.RunWith(t, newBackend, backendtest.Options{
		AgentBinary: testenv.CellboxBinary(t),
		Image:       os.Getenv("CELLBOX_TEST_IMAGE"),
	})
}

func TestConformanceWithoutCgroups(t *testing.T) {
	testenv.RequireBwrap(t)
	root := t.TempDir()
	newBackend := func(t *testing.T) backend.Backend {
		b, err := local.New(local.Options{Root: root, CgroupRoot: "-"})
		require.NoError(t, err)
		return b
	}
	backendtest.RunWith(t, newBackend, backendtest.Options{AgentBinary: testenv.CellboxBinary(t), Unenforced: true})
}

// TestStartupLatency (CELLBOX_BENCH=1) reports create+start → agent ready
// beside a bare `bwrap ... true`.
func TestStartupLatency(t *testing.T) {
	if os.Getenv("CELLBOX_BENCH") == "" {
		t.Skip("set CELLBOX_BENCH=1 to measure")
	}
	testenv.RequireBwrap(t)
	b, err := local.New(local.Options{Root: t.TempDir(), ImagesDir: imagesDir()})
	require.NoError(t, err)
	o := backendtest.Options{AgentBinary: testenv.CellboxBinary(t), Image: os.Getenv("CELLBOX_TEST_IMAGE")}
	got := backendtest.MeasureStartup(t, b, o, 50)
	var base []time.Duration
	for i := 0; i < 50; i++ {
		t0 := time.Now()
		out, err := exec.Command("bwrap", "--unshare-all", "--unshare-user", "--uid", "1000", "--cap-drop", "ALL",
			"--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
			"--proc", "/proc", "--dev", "/dev", "--", "/usr/bin/true").CombinedOutput()
		require.NoError(t, err, "%s", out)
		base = append(base, time.Since(t0))
	}
	slices.Sort(base)
	t.Logf("local create+start → agent ready: p50 %v p95 %v; bwrap true: p50 %v p95 %v",
		backendtest.Percentile(got, 50), backendtest.Percentile(got, 95), backendtest.Percentile(base, 50), backendtest.Percentile(base, 95))
}
