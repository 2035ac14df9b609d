package local

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
)

// What a process killed inside Create left in the root — a box directory
// without spec.json whose maker is dead, or none named (an older one), a
// directory made aside and never renamed into place — is removed by the
// next backend over the root, however fresh; one a live process is making
// (another backend over the root) stays, as do a box's own files and a
// fork's disk copy under an hour old.
func TestHalfMadeBoxDirsAreSwept(t *testing.T) {
	testenv.RequireBwrap(t)
	root := t.TempDir()
	dead, _ := json.Marshal(proc{PID: 1 << 30, Start: 1})
	alive, err := currentProc(os.Getpid())
	require.NoError(t, err)
	live, _ := json.Marshal(alive)
	dirs := map[string][]byte{"cb-dead": dead, "cb-nomaker": nil, "cb-live": live, ".making-x": dead, ".making-y": live}
	for name, maker := range dirs {
		d := filepath.Join(root, name)
		require.NoError(t, os.MkdirAll(filepath.Join(d, "workspace"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(d, "disk.img"), []byte("x"), 0o600))
		if maker != nil {
			require.NoError(t, os.WriteFile(filepath.Join(d, makerFile), maker, 0o600))
		}
	}
	whole := filepath.Join(root, "cb-forked")
	require.NoError(t, os.MkdirAll(whole, 0o700))
	for _, name := range []string{".clone-cb-new.img", "disk.img", "spec.json"} {
		require.NoError(t, os.WriteFile(filepath.Join(whole, name), []byte("x"), 0o600))
	}
	_, err = New(Options{Root: root, CgroupRoot: "-"})
	require.NoError(t, err)
	for _, gone := range []string{"cb-dead", "cb-nomaker", ".making-x"} {
		assert.NoDirExists(t, filepath.Join(root, gone))
	}
	for _, kept := range []string{"cb-live", ".making-y"} {
		assert.DirExists(t, filepath.Join(root, kept), "a live process is making it")
	}
	assert.FileExists(t, filepath.Join(whole, ".clone-cb-new.img"))
	assert.FileExists(t, filepath.Join(whole, "disk.img"))
}
