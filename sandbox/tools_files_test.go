package sandbox

import (
	"bytes"
	"encoding/base64"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReadFileBinaryPages: read_file pages through a binary file past its
// first 256 KiB: offset and next_offset count its bytes (1-indexed, as
// lines are for text). Before, every call returned the first 256 KiB,
// truncated, without a next_offset.
func TestReadFileBinaryPages(t *testing.T) {
	s := newTestService(t, newFakeBackend(t), "", nil)
	h := newSession(t, s)
	data := make([]byte, 1_024_000)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(r.UintN(256))
	}
	data[0] = 0 // binary from its first byte
	h.tool("write_file", map[string]any{"path": "bin.dat", "content": base64.StdEncoding.EncodeToString(data), "encoding": "base64"})

	decode := func(m map[string]any) []byte {
		t.Helper()
		require.Equal(t, "base64", m["encoding"])
		b, err := base64.StdEncoding.DecodeString(m["content"].(string))
		require.NoError(t, err)
		return b
	}
	var got []byte
	offset, calls := 0, 0
	for {
		m := h.tool("read_file", map[string]any{"path": "bin.dat", "offset": offset})
		calls++
		require.LessOrEqual(t, calls, 4, "256 KiB a call")
		chunk := decode(m)
		require.True(t, bytes.Equal(data[len(got):len(got)+len(chunk)], chunk), "call %d (offset %d) gives the bytes from there", calls, offset)
		got = append(got, chunk...)
		if m["next_offset"] == nil {
			assert.Equal(t, false, m["truncated"])
			break
		}
		assert.Equal(t, true, m["truncated"])
		offset = int(m["next_offset"].(float64))
		assert.Equal(t, len(got)+1, offset, "next_offset is the 1-indexed byte to read on from")
	}
	assert.Equal(t, len(data), len(got))
	assert.Equal(t, 4, calls)

	// offset 0 and 1 are the start; offset 2 the second byte.
	assert.Equal(t, data[:16], decode(h.tool("read_file", map[string]any{"path": "bin.dat", "offset": 1}))[:16])
	assert.Equal(t, data[1:17], decode(h.tool("read_file", map[string]any{"path": "bin.dat", "offset": 2}))[:16])
	last := decode(h.tool("read_file", map[string]any{"path": "bin.dat", "offset": len(data)}))
	assert.Equal(t, 1, len(last), "the last byte alone")
	m := h.call("read_file", map[string]any{"path": "bin.dat", "offset": len(data) + 1})
	require.Equal(t, true, m["is_error"], "past the end")
	assert.Contains(t, m["error"], "past the end of the file (1024000 bytes")
}
