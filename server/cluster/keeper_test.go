package cluster

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/s3test"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/blobs/s3blobs"
)

// TestKeepers runs what backend.Keeper promises on both keepers the
// server gives the kubernetes backend: this server's directory, and the
// S3 bucket every server reaches (--blobs).
func TestKeepers(t *testing.T) {
	t.Run("dir", func(t *testing.T) { keeperSuite(t, backend.DirKeeper(filepath.Join(t.TempDir(), "kept"))) })
	t.Run("s3", func(t *testing.T) {
		s, err := s3blobs.Open(t.Context(), s3test.Start(t))
		require.NoError(t, err)
		keeperSuite(t, keptKeeper{s.Kept()})
	})
}

func keeperSuite(t *testing.T, k backend.Keeper) {
	ctx := context.Background()
	read := func(id string) string {
		rc, err := k.Get(ctx, id)
		require.NoError(t, err)
		defer rc.Close()
		b, err := io.ReadAll(rc)
		require.NoError(t, err)
		return string(b)
	}
	_, err := k.Get(ctx, "cb-0123456789abcdef")
	require.ErrorIs(t, err, backend.ErrNotFound, "none kept")
	require.NoError(t, k.Put(ctx, "cb-0123456789abcdef", strings.NewReader("tar one")))
	assert.Equal(t, "tar one", read("cb-0123456789abcdef"))
	require.NoError(t, k.Put(ctx, "cb-0123456789abcdef", strings.NewReader("tar two")))
	assert.Equal(t, "tar two", read("cb-0123456789abcdef"), "a put replaces")
	require.Error(t, k.Put(ctx, "cb-0123456789abcdef", io.MultiReader(strings.NewReader("half"), errReader{})))
	assert.Equal(t, "tar two", read("cb-0123456789abcdef"), "a failed put keeps the last copy")
	require.NoError(t, k.Delete(ctx, "cb-0123456789abcdef"))
	require.NoError(t, k.Delete(ctx, "cb-0123456789abcdef"), "deleting none is no error")
	_, err = k.Get(ctx, "cb-0123456789abcdef")
	require.ErrorIs(t, err, backend.ErrNotFound)
	assert.Error(t, k.Put(ctx, "../escape", strings.NewReader("x")), "a bad id is refused")
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }
