package docker_test

import (
	"archive/tar"
	"bytes"
	"context"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/docker"
)

// importOne imports a one-file image as ref and returns its ID; the test
// removes it at its end.
func importOne(t testing.TB, b *docker.Backend, ref, content string) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "greeting", Mode: 0o644, Size: int64(len(content)), ModTime: time.Unix(0, 0)}))
	_, err := tw.Write([]byte(content))
	require.NoError(t, err)
	require.NoError(t, tw.Close())
	id, err := b.ImportImage(context.Background(), ref, &buf)
	require.NoError(t, err)
	t.Cleanup(func() {
		cli, err := client.New(client.FromEnv)
		if err != nil {
			return
		}
		defer cli.Close()
		_, _ = cli.ImageRemove(context.Background(), id, client.ImageRemoveOptions{Force: true})
	})
	return id
}

// TestImageDigest: a Docker image's digest is the engine's image ID,
// remembered for at most backend.ImageDigestTTL, so an image imported
// again under its name is seen within it; a missing image and the host
// image have none. A remote engine's backend (here the same engine, seen
// through its API only) answers alike, its default image being
// RemoteOptions.DefaultImage.
func TestImageDigest(t *testing.T) {
	testenv.RequireDocker(t)
	ctx := context.Background()
	b := newBackend(t).(*docker.Backend)
	ref := "cellbox/digest-test-" + strconv.FormatInt(time.Now().UnixNano(), 36)

	d, err := b.ImageDigest(ctx, ref)
	require.NoError(t, err)
	assert.Empty(t, d, "no such image: no digest")
	d, err = b.ImageDigest(ctx, backend.DefaultImage)
	require.NoError(t, err)
	assert.Empty(t, d, "the host's /usr has no digest")

	one := importOne(t, b, ref, "one")
	time.Sleep(backend.ImageDigestTTL) // the missing image's answer is remembered that long
	d, err = b.ImageDigest(ctx, ref)
	require.NoError(t, err)
	assert.Equal(t, one, d)
	assert.Regexp(t, `^sha256:[0-9a-f]{64}$`, d)

	two := importOne(t, b, ref, "two")
	require.NotEqual(t, one, two)
	deadline := time.Now().Add(backend.ImageDigestTTL)
	for {
		d, err = b.ImageDigest(ctx, ref)
		require.NoError(t, err)
		if d == two {
			break
		}
		assert.Equal(t, one, d)
		require.True(t, time.Now().Before(deadline.Add(100*time.Millisecond)), "the new build is not seen %s after its import", backend.ImageDigestTTL)
		time.Sleep(10 * time.Millisecond)
	}

	r, err := docker.NewRemote(ctx, docker.RemoteOptions{Host: "unix://" + testenv.DockerSocket(), DefaultImage: ref, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer r.Close()
	d, err = r.ImageDigest(ctx, ref)
	require.NoError(t, err)
	assert.Equal(t, two, d)
	d, err = r.ImageDigest(ctx, backend.DefaultImage)
	require.NoError(t, err)
	assert.Equal(t, two, d, "the remote default image is a real one")
}

// BenchmarkImageDigest: a digest the backend remembers, and one it asks
// the engine for (after the cache's time).
func BenchmarkImageDigest(bm *testing.B) {
	testenv.RequireDocker(bm)
	ctx := context.Background()
	b, err := docker.New(ctx, docker.Options{})
	require.NoError(bm, err)
	defer b.Close()
	ref := "cellbox/digest-bench-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	importOne(bm, b, ref, "one")
	bm.Run("cached", func(bm *testing.B) {
		for bm.Loop() {
			if _, err := b.ImageDigest(ctx, ref); err != nil {
				bm.Fatal(err)
			}
		}
	})
	bm.Run("engine", func(bm *testing.B) {
		for bm.Loop() {
			if _, err := b.ImageID(ctx, ref); err != nil {
				bm.Fatal(err)
			}
		}
	})
}
