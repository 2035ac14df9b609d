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
