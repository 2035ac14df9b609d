package readall

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSizedAndString(t *testing.T) {
	body := strings.Repeat("0123456789", 10000)
	for _, tc := range []struct {
		name        string
		size, limit int64
		want        string
	}{
		{"announced", int64(len(body)), 1 << 20, body},
		{"unknown", -1, 1 << 20, body},
		{"over the limit", int64(len(body)), 100, body[:100]},
		{"announced short", 10, 1 << 20, body}, // a wrong announcement costs a regrowth, not bytes
	} {
		b, err := Sized(strings.NewReader(body), tc.size, tc.limit)
		require.NoError(t, err, tc.name)
		assert.Equal(t, tc.want, string(b), tc.name)
		s, err := String(strings.NewReader(body), tc.size, tc.limit)
		require.NoError(t, err, tc.name)
		assert.Equal(t, tc.want, s, tc.name)
	}
}

// An announced body is read into one buffer of its size: no regrowth
// (and no copy) at its end.
func TestSizedOneBuffer(t *testing.T) {
	body := strings.Repeat("0123456789", 100000)
	b, err := Sized(strings.NewReader(body), int64(len(body)), 1<<30)
	require.NoError(t, err)
	assert.Equal(t, body, string(b))
	assert.LessOrEqual(t, cap(b), len(body)+1)
}

// A kept buffer comes back empty; one that grew past Max is not kept.
func TestBufferPool(t *testing.T) {
	p := BufferPool{Max: 1 << 10}
	b := p.Get()
	b.WriteString("left over")
	p.Put(b)
	assert.Zero(t, p.Get().Len())
	big := p.Get()
	big.Grow(4 << 10)
	p.Put(big)
	assert.LessOrEqual(t, p.Get().Cap(), 1<<10)
	p.PutSlice(append(p.Get().AvailableBuffer(), "appended"...))
	assert.Zero(t, p.Get().Len())
}
