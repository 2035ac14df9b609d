package backend_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/backend"
)

// SweepClones removes only the stale copies CloneAll names
// (.clone-ID.img): not a fresh one (a fork in flight), not a box's disk,
// not a look-alike, not a directory.
func TestSweepClones(t *testing.T) {
	dir := t.TempDir()
	old := time.Now().Add(-2 * backend.StaleClone)
	files := map[string]time.Time{
		".clone-cb-a.img":     old,
		".clone-cb-b.img":     time.Now(),
		"cb-a.img":            old,
		".clone-cb-c.img.tmp": old,
	}
	for name, mtime := range files {
		f := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(f, []byte("x"), 0o600))
		require.NoError(t, os.Chtimes(f, mtime, mtime))
	}
	sub := filepath.Join(dir, ".clone-cb-d.img")
	require.NoError(t, os.Mkdir(sub, 0o700))
	require.NoError(t, os.Chtimes(sub, old, old))

	removed := backend.SweepClones(dir, backend.StaleClone)
	assert.Equal(t, []string{filepath.Join(dir, ".clone-cb-a.img")}, removed)
	for name := range files {
		if name == ".clone-cb-a.img" {
			assert.NoFileExists(t, filepath.Join(dir, name))
		} else {
			assert.FileExists(t, filepath.Join(dir, name))
		}
	}
	assert.DirExists(t, sub)
	assert.Empty(t, backend.SweepClones(filepath.Join(dir, "missing"), 0))
}
