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
