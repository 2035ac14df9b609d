package suggest

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestNearest(t *testing.T) {
	names := []string{"threshold", "command", "clean", "exec", "files", "shell", "run"}
	for in, want := range map[string]string{
		"treshold":  "threshold",
		"Threshold": "threshold",
		"comand":    "command",
		"commnad":   "command",
		"exce":      "exec",
		"clen":      "clean",
		"shel":      "shell",
		"runn":      "run",
		"zzz":       "",
		"fil":       "",
		"shell":     "", // the name itself is no suggestion
	} {
		assert.Equal(t, want, Nearest(in, names), in)
	}
	assert.Equal(t, ` (did you mean "shell"?)`, DidYouMean("shel", names))
	assert.Empty(t, DidYouMean("zzz", names))
}
