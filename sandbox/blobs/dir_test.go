package blobs_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/sparse"
	"github.com/cellbox/cellbox/sandbox/blobs"
	"github.com/cellbox/cellbox/sandbox/blobs/blobstest"
)

var ctx = context.Background()

// TestDirStore runs the conformance suite on OpenDir's store.
func TestDirStore(t *testing.T) {
	blobstest.Run(t, func(t *testing.T) blobs.Store {
		d, err := blobs.OpenDir(t.TempDir())
		require.NoError(t, err)
		return d
	})
}

// oldPutBlob is snapStore.putBlob as the sandbox service had it before
// the blob store was a contract (sandbox/snapstore.go at 3eaa008), with
// only the receiver's paths made arguments: how every data dir of an
// earlier version holds its snapshots' blobs.
func oldPutBlob(dir, session string, r io.Reader, size int64) (string, int64, error) {
	tmpDir := filepath.Join(dir, "tmp")
	blobPath := func(session, hash string) string {
		return filepath.Join(filepath.Join(dir, "blobs", session), hash[:2], hash)
	}
	f, err := os.CreateTemp(tmpDir, "blob-")
	if err != nil {
		return "", 0, err
	}
	defer os.Remove(f.Name())
	h := sha256.New()
	n, err := sparse.Copy(f, io.TeeReader(io.LimitReader(r, size), h)) // zeros as holes
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && n != size {
		err = fmt.Errorf("tar entry cut short (%d of %d bytes)", n, size)
	}
	if err != nil {
		return "", 0, err
	}
	hash := hex.EncodeToString(h.Sum(nil))
	dst := blobPath(session, hash)
	if _, err := os.Lstat(dst); err == nil {
		return hash, 0, nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return "", 0, err
	}
	if err := os.Rename(f.Name(), dst); err != nil {
		return "", 0, err
	}
	return hash, size, nil
}

// mostlyZeros is size bytes of zeros but for a few bytes at 0, at 1 MiB
// + 3 and at the middle.
func mostlyZeros(size int) []byte {
	b := make([]byte, size)
	copy(b, "head")
	copy(b[1<<20+3:], "odd")
	copy(b[size/2:], "middle")
	return b
}

// TestDirOldLayout: blobs an earlier version wrote (oldPutBlob, into a
// data dir's snapshots directory, with a Put of that version cut short in
// its tmp) are read, listed, counted, deduplicated against and deleted
// through OpenDir's store, which clears the leftover; and what the store
// puts lands where an earlier version looks (DIR/blobs/NS/hh/HASH, the
// content as it is, directories 0700 and files 0600), so a data dir can
// also go back a version.
func TestDirOldLayout(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snapshots")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "tmp"), 0o700))
	const sess = "s-0123456789abcdef"
	contents := [][]byte{nil, []byte("hello\n"), mostlyZeros(8 << 20), bytes.Repeat([]byte("abc"), 100_000)}
	hashes := map[string][]byte{}
	for _, c := range contents {
		hash, _, err := oldPutBlob(dir, sess, bytes.NewReader(c), int64(len(c)))
		require.NoError(t, err)
		hashes[hash] = c
	}
	goneHash, _, err := oldPutBlob(dir, "sess-gone", bytes.NewReader([]byte("left by a session that is gone")), 30)
	require.NoError(t, err)
	leftover := filepath.Join(dir, "tmp", "blob-123456")
	require.NoError(t, os.WriteFile(leftover, []byte("half a blob"), 0o600))

	d, err := blobs.OpenDir(dir)
	require.NoError(t, err)
	assert.NoFileExists(t, leftover, "a Put an earlier process did not finish is removed")
	ns, err := d.Namespaces(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{sess, "sess-gone"}, ns)
	var listed []string
	require.NoError(t, d.List(ctx, sess, func(h string) error { listed = append(listed, h); return nil }))
	assert.ElementsMatch(t, keys(hashes), listed)
	for hash, c := range hashes {
		rc, n, err := d.Open(ctx, sess, hash)
		require.NoError(t, err)
		got, err := io.ReadAll(rc)
		rc.Close()
		require.NoError(t, err)
		assert.EqualValues(t, len(c), n)
		assert.True(t, bytes.Equal(c, got), "blob %s reads back", hash)
		_, added, err := d.Put(ctx, sess, bytes.NewReader(c), int64(len(c)))
		require.NoError(t, err)
		assert.Zero(t, added, "content an earlier version stored is not stored again")
	}
	size, err := d.Size(ctx, sess)
	require.NoError(t, err)
	sparseData := dataOf(t, filepath.Join(dir, "blobs", sess, sha(contents[2])[:2], sha(contents[2])))
	assert.Less(t, sparseData, int64(1<<20), "the old store kept the zeros as holes")
	assert.Equal(t, 0+6+sparseData+300_000, size, "Size: the files' bytes, the mostly-zero one's data only")

	freed, err := d.Delete(ctx, sess, sha(contents[1]))
	require.NoError(t, err)
	assert.EqualValues(t, 6, freed)
	assert.NoFileExists(t, filepath.Join(dir, "blobs", sess, sha(contents[1])[:2], sha(contents[1])))
	rc, _, err := d.Open(ctx, "sess-gone", goneHash)
	require.NoError(t, err)
	rc.Close()
	freed, err = d.DeleteNamespace(ctx, "sess-gone")
	require.NoError(t, err)
	assert.EqualValues(t, 30, freed)
	assert.NoDirExists(t, filepath.Join(dir, "blobs", "sess-gone"))

	// The other way: where the store puts a blob.
	c := []byte("written by the blob store")
	hash, added, err := d.Put(ctx, "s-new", bytes.NewReader(c), int64(len(c)))
	require.NoError(t, err)
	assert.EqualValues(t, len(c), added)
	p := filepath.Join(dir, "blobs", "s-new", hash[:2], hash)
	got, err := os.ReadFile(p)
	require.NoError(t, err)
	assert.Equal(t, c, got)
	assert.Equal(t, sha(c), hash)
	for path, mode := range map[string]os.FileMode{p: 0o600, filepath.Dir(p): 0o700 | os.ModeDir, filepath.Dir(filepath.Dir(p)): 0o700 | os.ModeDir} {
		fi, err := os.Stat(path)
		require.NoError(t, err)
		assert.Equal(t, mode, fi.Mode(), path)
	}
	ents, err := os.ReadDir(filepath.Join(dir, "tmp"))
	require.NoError(t, err)
	assert.Empty(t, ents, "no file of a Put stays in tmp")
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func sha(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// dataOf is the bytes of data (not holes) of the file p, as lseek finds
// them.
func dataOf(t *testing.T, p string) int64 {
	t.Helper()
	f, err := os.Open(p)
	require.NoError(t, err)
	defer f.Close()
	fi, err := f.Stat()
	require.NoError(t, err)
	m, err := sparse.Of(f, fi.Size())
	require.NoError(t, err)
	return m.Data()
}

// blocks is the disk the file p takes.
func blocks(t *testing.T, p string) int64 {
	t.Helper()
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(p, &st))
	return st.Blocks * 512
}

// TestDirHoles: OpenDir's store keeps zeros as holes: 64 MiB of content
// that is mostly zeros takes a few blocks of disk, and Put's added, Size
// and Delete's freed count those blocks' bytes, not the zeros; a file of
// no zero block counts its size, though its last block is not full.
func TestDirHoles(t *testing.T) {
	dir := t.TempDir()
	d, err := blobs.OpenDir(dir)
	require.NoError(t, err)
	c := mostlyZeros(64 << 20)
	hash, added, err := d.Put(ctx, "s-1", bytes.NewReader(c), int64(len(c)))
	require.NoError(t, err)
	p := filepath.Join(dir, "blobs", "s-1", hash[:2], hash)
	fi, err := os.Stat(p)
	require.NoError(t, err)
	assert.EqualValues(t, 64<<20, fi.Size(), "the file has the content's size")
	assert.Less(t, blocks(t, p), int64(64<<10), "and takes a few blocks")
	assert.Equal(t, dataOf(t, p), added, "added: the data, not the holes")
	assert.LessOrEqual(t, added, int64(3*4096), "three blocks of data (one mark crosses no boundary)")
	size, err := d.Size(ctx, "s-1")
	require.NoError(t, err)
	assert.Equal(t, added, size)

	odd := bytes.Repeat([]byte{7}, 10_001)
	_, n, err := d.Put(ctx, "s-1", bytes.NewReader(odd), int64(len(odd)))
	require.NoError(t, err)
	assert.EqualValues(t, 10_001, n, "no zeros: its size, not its blocks")
	size, err = d.Size(ctx, "s-1")
	require.NoError(t, err)
	assert.Equal(t, added+10_001, size)

	freed, err := d.Delete(ctx, "s-1", hash)
	require.NoError(t, err)
	assert.Equal(t, added, freed)
}

// TestDirFailedPutLeavesNoFile: a Put that fails (reader error, size
// mismatch, context) removes its file of DIR/tmp and makes no namespace
// directory.
func TestDirFailedPutLeavesNoFile(t *testing.T) {
	dir := t.TempDir()
	d, err := blobs.OpenDir(dir)
	require.NoError(t, err)
	c := mostlyZeros(2 << 20)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	for name, put := range map[string]func() error{
		"reader error": func() error {
			_, _, err := d.Put(ctx, "s-1", io.MultiReader(bytes.NewReader(c[:1<<20]), iotestErr{}), int64(len(c)))
			return err
		},
		"short": func() error {
			_, _, err := d.Put(ctx, "s-1", bytes.NewReader(c), int64(len(c))+1)
			return err
		},
		"long": func() error {
			_, _, err := d.Put(ctx, "s-1", bytes.NewReader(c), int64(len(c))-1)
			return err
		},
		"context": func() error {
			_, _, err := d.Put(cancelled, "s-1", bytes.NewReader(c), int64(len(c)))
			return err
		},
	} {
		require.Error(t, put(), name)
		ents, err := os.ReadDir(filepath.Join(dir, "tmp"))
		require.NoError(t, err)
		assert.Empty(t, ents, "%s: no file stays in tmp", name)
		assert.NoDirExists(t, filepath.Join(dir, "blobs", "s-1"), name)
	}
}

type iotestErr struct{}

func (iotestErr) Read([]byte) (int, error) { return 0, fmt.Errorf("the box went away") }
