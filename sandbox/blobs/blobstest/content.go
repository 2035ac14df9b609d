package blobstest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// roundTrip: content of 0, 1 and 1 MiB bytes, and 64 MiB that are mostly
// zeros (a sparse file's), reads back byte for byte under its hash, with
// Open's size its length; content with no zero byte adds its size, the
// mostly-zero content at least its bytes that are not zero and at most its
// size, and Size grows by what each Put added.
func (s *suite) roundTrip(t *testing.T) {
	for _, c := range []struct {
		name string
		n    int
	}{{"0", 0}, {"1", 1}, {"1MiB", 1 << 20}} {
		t.Run(c.name, func(t *testing.T) {
			st := s.store(t)
			content := random(c.n, uint64(c.n))
			assert.EqualValues(t, c.n, put(t, st, "s-1", content), "added: content with no zero byte counts whole")
			assert.Equal(t, content, read(t, st, "s-1", sum(content)))
			assert.Equal(t, []string{sum(content)}, hashes(t, st, "s-1"))
			assert.EqualValues(t, c.n, size(t, st, "s-1"))
		})
	}
	t.Run("64MiBMostlyZeros", func(t *testing.T) {
		st := s.store(t)
		const total = 64 << 20
		hash, added, err := st.Put(ctx, "s-1", mostlyZeros(), total)
		require.NoError(t, err)
		h := sha256.New()
		_, err = io.Copy(h, mostlyZeros())
		require.NoError(t, err)
		require.Equal(t, hex.EncodeToString(h.Sum(nil)), hash)
		assert.GreaterOrEqual(t, added, int64(len(marks)*len(mark)), "added counts the bytes that are not zero")
		assert.LessOrEqual(t, added, int64(total))
		assert.Equal(t, added, size(t, st, "s-1"), "Size grew by what the Put added")

		rc, n, err := st.Open(ctx, "s-1", hash)
		require.NoError(t, err)
		defer rc.Close()
		assert.EqualValues(t, total, n, "Open's size counts the zeros")
		// The content, compared as it streams: 64 MiB are not held at once.
		want := mostlyZeros()
		var off int64
		got, wbuf := make([]byte, 1<<20), make([]byte, 1<<20)
		for {
			k, rerr := io.ReadFull(rc, got)
			if k > 0 {
				_, err := io.ReadFull(want, wbuf[:k])
				require.NoError(t, err, "the blob holds more than the content at %d", off)
				require.True(t, bytes.Equal(wbuf[:k], got[:k]), "the blob differs from the content in the MiB at %d", off)
				off += int64(k)
			}
			if rerr == io.EOF || errors.Is(rerr, io.ErrUnexpectedEOF) {
				break
			}
			require.NoError(t, rerr)
		}
		assert.EqualValues(t, total, off, "bytes read back")
	})
}

// mark is the data of the mostly-zero content, at each of marks (one not at
// a block boundary); it ends in zeros (a hole to its end).
var (
	mark  = []byte("cellbox sparse data")
	marks = []int64{0, 20<<20 + 3, 48 << 20}
)

// mostlyZeros returns a reader of 64 MiB of zeros but for mark at marks.
func mostlyZeros() io.Reader {
	var rs []io.Reader
	var off int64
	for _, m := range marks {
		rs = append(rs, io.LimitReader(zeros{}, m-off), bytes.NewReader(mark))
		off = m + int64(len(mark))
	}
	return io.MultiReader(append(rs, io.LimitReader(zeros{}, 64<<20-off))...)
}

// zeros reads as zeros, without end.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// hash: a blob's name is the lowercase hex SHA-256 of its content (known
// vectors, not only what crypto/sha256 says here), and Open finds it by
// that name only.
func (s *suite) hash(t *testing.T) {
	st := s.store(t)
	for content, want := range map[string]string{
		"":    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		"abc": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
	} {
		hash, _, err := st.Put(ctx, "s-1", bytes.NewReader([]byte(content)), int64(len(content)))
		require.NoError(t, err)
		assert.Equal(t, want, hash, "hash of %q", content)
		assert.Equal(t, []byte(content), read(t, st, "s-1", want))
	}
	b := random(100_000, 7)
	put(t, st, "s-1", b)
	other := sha256.Sum256(append([]byte{1}, b...))
	notFound(t, st, "s-1", hex.EncodeToString(other[:]), "another content's hash")
	assert.Equal(t, sorted(sum(nil), sum([]byte("abc")), sum(b)), hashes(t, st, "s-1"))
}

// dedup: content a namespace holds already is stored once: the second Put
// returns the same hash and adds 0 bytes, and Size and List do not change.
// Content of the same size but other bytes is another blob, and each
// reads back as itself.
func (s *suite) dedup(t *testing.T) {
	st := s.store(t)
	a := random(300_000, 1)
	require.EqualValues(t, len(a), put(t, st, "s-1", a))
	assert.Zero(t, put(t, st, "s-1", a), "the same content again adds nothing")
	assert.EqualValues(t, len(a), size(t, st, "s-1"))
	assert.Equal(t, []string{sum(a)}, hashes(t, st, "s-1"))

	b := bytes.Clone(a)
	b[len(b)/2] ^= 0xff // same size, one byte apart
	assert.EqualValues(t, len(b), put(t, st, "s-1", b), "other content of the same size is stored")
	assert.EqualValues(t, 2*len(a), size(t, st, "s-1"))
	assert.Equal(t, sorted(sum(a), sum(b)), hashes(t, st, "s-1"))
	assert.Equal(t, a, read(t, st, "s-1", sum(a)))
	assert.Equal(t, b, read(t, st, "s-1", sum(b)))
	assert.Zero(t, put(t, st, "s-1", b), "and is deduplicated in its turn")
}

// namespaces: namespaces share nothing: the same content costs in each
// (the first Put of it in a second namespace adds its size), a blob is
// not found in a namespace that does not hold it, deleting it in one
// leaves the other's, and Namespaces lists those that hold blobs, sorted.
func (s *suite) namespaces(t *testing.T) {
	st := s.store(t)
	ns, err := st.Namespaces(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{}, ns, "a new store has no namespaces (an empty slice)")

	c := random(50_000, 2)
	assert.EqualValues(t, len(c), put(t, st, "s-b", c))
	assert.EqualValues(t, len(c), put(t, st, "s-a", c), "the same content in another namespace adds its bytes there")
	assert.EqualValues(t, len(c), size(t, st, "s-a"))
	assert.EqualValues(t, len(c), size(t, st, "s-b"))
	notFound(t, st, "s-c", sum(c), "a namespace that does not hold it")
	empty(t, st, "s-c", "a namespace never written")
	only := random(10, 3)
	put(t, st, "s-a", only)
	notFound(t, st, "s-b", sum(only), "content of another namespace")
	assert.Equal(t, []string{sum(c)}, hashes(t, st, "s-b"))

	ns, err = st.Namespaces(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"s-a", "s-b"}, ns)

	freed, err := st.Delete(ctx, "s-a", sum(c))
	require.NoError(t, err)
	assert.EqualValues(t, len(c), freed)
	notFound(t, st, "s-a", sum(c), "deleted")
	assert.Equal(t, c, read(t, st, "s-b", sum(c)), "the other namespace's copy stays")
	assert.EqualValues(t, len(c), size(t, st, "s-b"))
}
