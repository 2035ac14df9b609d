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
}
