package server

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestParseSize reads the sizes of CELLBOX_MEMO_LIMIT.
func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{{"1048576", 1 << 20}, {"512KiB", 512 << 10}, {"256MiB", 256 << 20}, {"2GiB", 2 << 30}, {"5MB", 5e6}, {"10 B", 10}} {
		got, err := parseSize(tc.in)
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, got, tc.in)
	}
	for _, bad := range []string{"", "0", "-1", "1TB", "lots", "99999999999GiB"} {
		_, err := parseSize(bad)
		assert.ErrorContains(t, err, "want a positive size in bytes, or with a unit: 512MiB, 2GiB", bad)
	}
}
