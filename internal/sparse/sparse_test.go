package sparse

import (
	"bytes"
	"crypto/rand"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A copy has the same bytes as its source, whatever the mix of zeros and
// data and however the reader splits them, and the zero blocks take no
// disk.
func TestCopy(t *testing.T) {
	data := make([]byte, 3000)
	rand.Read(data)
	big := make([]byte, 64<<20)
	copy(big[10<<20:], data)
	for name, src := range map[string][]byte{
		"empty":               nil,
		"short data":          data[:5],
		"short zeros":         make([]byte, 100),
		"data":                data,
		"zeros then data":     append(make([]byte, 3*blockSize+7), data...),
		"data then zeros":     append(append([]byte{}, data...), make([]byte, 5*blockSize+1)...),
		"64 MiB mostly zeros": big,
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "f")
			f, err := os.Create(path)
			require.NoError(t, err)
			n, err := Copy(f, &oddReader{r: bytes.NewReader(src)})
			require.NoError(t, err)
			require.NoError(t, f.Close())
			assert.EqualValues(t, len(src), n)
			got, err := os.ReadFile(path)
			require.NoError(t, err)
			assert.True(t, bytes.Equal(src, got), "same bytes")
			if len(src) == len(big) {
				var st syscall.Stat_t
				require.NoError(t, syscall.Stat(path, &st))
				assert.Less(t, st.Blocks*512, int64(1<<20), "the zeros take no disk")
			}
		})
	}
}

// oddReader hands out its bytes in pieces of 1 to 9999 bytes, never on a
// block boundary on purpose.
type oddReader struct {
	r    *bytes.Reader
	next int
}

func (o *oddReader) Read(p []byte) (int, error) {
	o.next = o.next*7919%9999 + 1
	return o.r.Read(p[:min(len(p), o.next)])
}

// A reader's error comes back, io.ErrUnexpectedEOF (a tar stream cut
// short) included, after what it gave before it.
func TestCopyReaderError(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	require.NoError(t, err)
	defer f.Close()
	n, err := Copy(f, io.MultiReader(bytes.NewReader([]byte("abc")), iotest.ErrReader(io.ErrUnexpectedEOF)))
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.EqualValues(t, 3, n)
}

// Of finds the data of a file with holes; Reader and Write carry exactly
// that data into a new file with the same holes and the same bytes.
func TestMapRoundTrip(t *testing.T) {
	dir := t.TempDir()
	src, err := os.Create(filepath.Join(dir, "src"))
	require.NoError(t, err)
	defer src.Close()
	chunk := make([]byte, 10000)
	rand.Read(chunk)
	const size = 1 << 30
	for _, off := range []int64{0, 300 << 20, size - int64(len(chunk))} {
		_, err := src.WriteAt(chunk, off)
		require.NoError(t, err)
	}
	m, err := Of(src, size)
	require.NoError(t, err)
	assert.EqualValues(t, size, m.Size)
	require.Len(t, m.Segs, 3, "three runs of data: %v", m.Segs)
	assert.Less(t, m.Data(), int64(1<<20), "the holes are not data")
	for _, s := range m.Segs {
		assert.Zero(t, s.Off%blockSize)
	}

	parsed, err := Parse(m.Size, m.Data(), m.Encode())
	require.NoError(t, err)
	assert.Equal(t, m, parsed)

	var packed bytes.Buffer
	n, err := io.Copy(&packed, m.Reader(src))
	require.NoError(t, err)
	assert.Equal(t, m.Data(), n, "the reader gives the data only")

	dst, err := os.Create(filepath.Join(dir, "dst"))
	require.NoError(t, err)
	defer dst.Close()
	w, err := Write(dst, &packed, parsed)
	require.NoError(t, err)
	assert.Equal(t, m.Data(), w)
	fi, err := dst.Stat()
	require.NoError(t, err)
	assert.EqualValues(t, size, fi.Size())
	assert.Less(t, fi.Sys().(*syscall.Stat_t).Blocks*512, int64(1<<20), "the holes take no disk")
	for _, off := range []int64{0, 300 << 20, size - int64(len(chunk)), 100 << 20} {
		want, got := make([]byte, len(chunk)), make([]byte, len(chunk))
		_, err := src.ReadAt(want, off)
		require.NoError(t, err)
		_, err = dst.ReadAt(got, off)
		require.NoError(t, err)
		assert.True(t, bytes.Equal(want, got), "the bytes at %d", off)
	}

	t.Run("a file without holes is one segment", func(t *testing.T) {
		f, err := os.Create(filepath.Join(dir, "dense"))
		require.NoError(t, err)
		defer f.Close()
		_, err = f.Write(chunk)
		require.NoError(t, err)
		m, err := Of(f, int64(len(chunk)))
		require.NoError(t, err)
		assert.Equal(t, Map{Size: int64(len(chunk)), Segs: []Segment{{0, int64(len(chunk))}}}, m)
	})
	t.Run("an empty or all-hole file has none", func(t *testing.T) {
		f, err := os.Create(filepath.Join(dir, "holes"))
		require.NoError(t, err)
		defer f.Close()
		require.NoError(t, f.Truncate(size))
		m, err := Of(f, size)
		require.NoError(t, err)
		assert.Equal(t, Map{Size: size}, m)
		var out bytes.Buffer
		n, err := io.Copy(&out, m.Reader(f))
		require.NoError(t, err)
		assert.Zero(t, n)
	})
}

// A map is checked: from a box, it is hostile.
func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct {
		size, data int64
		segs       string
	}{
		{100, 10, "0+5,3+5"},   // overlapping
		{100, 10, "50+5,0+5"},  // out of order
		{100, 10, "95+10"},     // past the size
		{100, 0, "0+0"},        // empty segment
		{100, 10, "0+5"},       // data says otherwise
		{100, 10, "x+10"},      // not a number
		{100, 10, "0-10"},      // not off+len
		{-1, 0, ""},            // bad size
		{1 << 62, 10, "-5+10"}, // negative offset
	} {
		_, err := Parse(tc.size, tc.data, tc.segs)
		assert.Error(t, err, "%+v", tc)
	}
	m, err := Parse(100, 0, "")
	require.NoError(t, err)
	assert.Equal(t, Map{Size: 100}, m)
}
