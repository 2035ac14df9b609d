package sandbox

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestNameLimits(t *testing.T) {
	for name, ok := range map[string]bool{
		"a": true, "Box-1.x_y": true, strings.Repeat("a", 63): true,
		"": false, strings.Repeat("a", 64): false, "-a": false, "a/b": false, "a b": false,
	} {
		assert.Equal(t, ok, CheckName(name) == nil, "sandbox name %q", name)
	}
	id := "p" + strings.Repeat("0a", 16)
	for s, ok := range map[string]bool{
		id: true, id[:32]: false, id + "0": false, "q" + id[1:]: false,
	} {
		assert.Equal(t, ok, IsPreviewID(s), "preview id %q", s)
		_, got := PreviewID(s + ".localhost:8080")
		assert.Equal(t, ok, got, "Host %q.localhost", s)
	}
	assert.False(t, IsPreviewID("p"+strings.Repeat("0A", 16)), "upper case")
	_, ok := PreviewID("P" + strings.Repeat("0A", 16) + ".LOCALHOST")
	assert.True(t, ok, "a Host is read in lower case")
}
