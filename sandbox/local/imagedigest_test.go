package local_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/image"
	"github.com/cellbox/cellbox/sandbox/local"
)

// build puts a "build" of image name in place as `cellbox image build`
// does: a rootfs written beside the image's, its marker last, renamed
// into place. marker false leaves the marker out (a rootfs of an older or
// hand-made kind).
func build(t *testing.T, images, name string, marker bool) {
	t.Helper()
	rootfs := image.RootfsDir(images, name)
	tmp := rootfs + ".building"
	require.NoError(t, os.MkdirAll(filepath.Join(tmp, "usr"), 0o755))
	if marker {
		data, err := json.Marshal(image.Info{Name: name, Built: time.Now().UTC()})
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(tmp, ".cellbox-image.json"), data, 0o644))
		_, err = image.Read(tmp)
		require.NoError(t, err, "the marker is the one image.Read reads")
	}
	require.NoError(t, os.RemoveAll(rootfs))
	require.NoError(t, os.Rename(tmp, rootfs))
}

// TestImageDigest: a built image's digest is its build's (its marker's
// hash), the same until the image is built again, then new at once; a
// rootfs without a marker has its directory's identity; the host's /usr,
// an image not built, and a name that is not cellbox/NAME have none.
func TestImageDigest(t *testing.T) {
	testenv.RequireBwrap(t)
	ctx := context.Background()
	images := t.TempDir()
	b, err := local.New(local.Options{Root: t.TempDir(), ImagesDir: images, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	digest := func(img string) string {
		t.Helper()
		d, err := b.ImageDigest(ctx, img)
		require.NoError(t, err)
		return d
	}
	for _, img := range []string{backend.DefaultImage, "cellbox/python", "python", "registry.example/x:1"} {
		assert.Empty(t, digest(img), img)
	}

	build(t, images, "python", true)
	one := digest("cellbox/python")
	assert.Regexp(t, `^local:[0-9a-f]{64}$`, one)
	assert.Equal(t, one, digest("cellbox/python"), "the same build")
	assert.Equal(t, one, digest("cellbox/python:latest"))

	build(t, images, "python", true)
	two := digest("cellbox/python")
	assert.Regexp(t, `^local:[0-9a-f]{64}$`, two)
	assert.NotEqual(t, one, two, "built again: seen at once")

	build(t, images, "python", false)
	dir := digest("cellbox/python")
	assert.Regexp(t, `^local-dir:\d+:\d+:\d+$`, dir)
	assert.Equal(t, dir, digest("cellbox/python"))
	build(t, images, "python", false)
	assert.NotEqual(t, dir, digest("cellbox/python"), "another directory in its place")

	require.NoError(t, os.RemoveAll(image.RootfsDir(images, "python")))
	assert.Empty(t, digest("cellbox/python"), "removed")

	none, err := local.New(local.Options{Root: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	d, err := none.ImageDigest(ctx, "cellbox/python")
	require.NoError(t, err)
	assert.Empty(t, d, "no images directory")
}
