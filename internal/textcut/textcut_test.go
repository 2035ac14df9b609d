package textcut

import (
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
)

func TestPrefix(t *testing.T) {
	assert.Equal(t, "abc", Prefix("abc", 5))
	assert.Equal(t, "ab", Prefix("abc", 2))
	assert.Equal(t, "", Prefix("abc", 0))
	assert.Equal(t, "", Prefix("abc", -1))
	// é is 2 bytes, 😀 is 4: a cut inside either drops it whole.
	assert.Equal(t, "h", Prefix("hé", 2))
	assert.Equal(t, "hé", Prefix("hé😀", 5))
	assert.Equal(t, []byte("h"), Prefix([]byte("hé"), 2))
	for n := range 8 {
		assert.True(t, utf8.ValidString(Prefix("hé😀x", n)), "%d", n)
	}
}
