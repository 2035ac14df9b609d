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
