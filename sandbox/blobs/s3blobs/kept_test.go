package s3blobs_test

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/s3test"
	"github.com/cellbox/cellbox/sandbox/blobs"
)

// failingReader gives some bytes, then fails.
type failingReader struct{ n int }

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errors.New("the disk went away")
	}
	n := min(len(p), f.n)
	for i := range n {
		p[i] = 'x'
	}
	f.n -= n
	return n, nil
}

// TestKept: whole files by name beside the blobs (a remote backend's kept
// workspaces): put, replaced, a failed put leaving the last copy, missing
// ones said, deleted; never listed as a namespace.
func TestKept(t *testing.T) {
	srv := s3test.StartServer(t)
	s := open(t, srv, "cellbox-test/snaps")
	k := s.Kept()
	ctx := t.Context()
	read := func(name string) string {
		rc, err := k.Get(ctx, name)
		require.NoError(t, err)
		defer rc.Close()
		b, err := io.ReadAll(rc)
		require.NoError(t, err)
		return string(b)
	}
	_, err := k.Get(ctx, "cb-1.tar")
	require.ErrorIs(t, err, blobs.ErrNotFound)
	require.NoError(t, k.Put(ctx, "cb-1.tar", strings.NewReader("first")))
	assert.Equal(t, "first", read("cb-1.tar"))
	require.NoError(t, k.Put(ctx, "cb-1.tar", strings.NewReader("second")))
	assert.Equal(t, "second", read("cb-1.tar"), "a put replaces")
	err = k.Put(ctx, "cb-1.tar", &failingReader{n: 20 << 20})
	require.Error(t, err)
	assert.Equal(t, "second", read("cb-1.tar"), "a failed put leaves the last whole copy")
	ns, err := s.Namespaces(ctx)
	require.NoError(t, err)
	assert.Empty(t, ns, "kept files are no namespace of blobs")
	require.NoError(t, k.Delete(ctx, "cb-1.tar"))
	require.NoError(t, k.Delete(ctx, "cb-1.tar"), "deleting a missing file is no error")
	_, err = k.Get(ctx, "cb-1.tar")
	require.ErrorIs(t, err, blobs.ErrNotFound)
	for _, bad := range []string{"", "../x", "a/b", ".hidden"} {
		assert.ErrorIs(t, k.Put(ctx, bad, strings.NewReader("x")), blobs.ErrInvalid, "%q", bad)
	}
}
