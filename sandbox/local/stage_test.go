package local

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
)

// startStaged's thread, which joins a mount namespace of its own, is never
// the process's main thread: Go cannot end the main thread, so it would
// stay in that namespace with the box's disk mounts, keeping them (and
// their filesystems) alive after the host unmounts them.
func TestStagingLeavesTheMainThreadAlone(t *testing.T) {
	testenv.RequireRoot(t, "mount namespaces")
	require.NoError(t, os.MkdirAll(stageDir, 0o755))
	mainNS := func() string {
		ns, err := os.Readlink(fmt.Sprintf("/proc/self/task/%d/ns/mnt", os.Getpid()))
		require.NoError(t, err)
		return ns
	}
	want := mainNS()
	src := t.TempDir()
	for i := range 200 {
		cmd := exec.Command("/bin/true")
		require.NoError(t, startStaged(cmd, []stageBind{{name: "d", src: src}}))
		require.NoError(t, cmd.Wait())
		require.Equal(t, want, mainNS(), "after %d launches the main thread is in a launch's mount namespace", i+1)
	}
}
