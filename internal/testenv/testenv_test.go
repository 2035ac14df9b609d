package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The binaries of test processes that are gone are removed; those of
// running ones (this one, PID 1) and a fresh one of the earlier layout are
// kept.
func TestSweepTestBinaries(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	dead := exec.Command("true")
	require.NoError(t, dead.Run())
	mk := func(name string) string {
		dir := filepath.Join(os.TempDir(), name)
		require.NoError(t, os.MkdirAll(dir, 0o755))
		return dir
	}
	gone := mk(testBinPrefix + strconv.Itoa(dead.Process.Pid) + "-1")
	keep := []string{
		mk(testBinPrefix + strconv.Itoa(os.Getpid()) + "-2"),
		mk(testBinPrefix + "1-3"),
		mk(testBinPrefix + "12345678"), // the earlier layout, fresh
	}
	sweepTestBinaries()
	assert.NoDirExists(t, gone, "the binary of a process that is gone")
	for _, dir := range keep {
		assert.DirExists(t, dir)
	}
}
