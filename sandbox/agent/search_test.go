package agent

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestGlobAlternatives checks the count of patterns {a,b} groups expand to,
// which caps doublestar's walk over their combinations.
func TestGlobAlternatives(t *testing.T) {
	for _, tt := range []struct {
		pattern string
		want    int
	}{
		{"a/b", 1},
		{"{a,b}", 2},
		{"{a,b}/{c,d,e}", 6},
		{"{a,{b,c}}x", 3},
		{"{a,b}{c,{d,e}}", 6},
		{`\{a,b}`, 1},
		{"{}", 1},
		{strings.Repeat("{a,b}", 8), 256},
		{strings.Repeat("{a,b}", 40), maxGlobAlts + 1},
	} {
		n, _ := alternatives(tt.pattern)
		assert.Equal(t, tt.want, n, tt.pattern)
	}
}
