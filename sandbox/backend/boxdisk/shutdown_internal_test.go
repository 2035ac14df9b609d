package boxdisk

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// A disk being removed is shut down before its unmount: nothing more is
// read or written in it (so the unmount writes nothing back), and Remove
// then leaves nothing. Without the shutdown the write below succeeds.
func TestRemoveShutsTheDiskDown(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("box disks need root (mount)")
	}
	ctx := context.Background()
	dir := t.TempDir()
	d := Disk{File: filepath.Join(dir, "disk.img"), Dir: filepath.Join(dir, "disk"), Templates: filepath.Join(dir, "templates")}
	t.Cleanup(func() { _ = d.Remove(ctx) })
	require.NoError(t, d.Make(ctx, 64<<20, 0, 0))
	require.NoError(t, os.WriteFile(filepath.Join(d.Workspace(), "before"), []byte("x"), 0o644))

	d.shutdown()
	err := os.WriteFile(filepath.Join(d.Workspace(), "after"), []byte("x"), 0o644)
	assert.ErrorIs(t, err, unix.EIO, "a write in a disk shut down")
	assert.True(t, d.Mounted(), "shut down, still mounted until Remove unmounts it")

	require.NoError(t, d.Remove(ctx))
	assert.False(t, d.Mounted())
	assert.NoFileExists(t, d.File)
	assert.NoDirExists(t, d.Dir)
	// The host filesystem the disk lived on is untouched.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "host"), []byte("x"), 0o644))
}
