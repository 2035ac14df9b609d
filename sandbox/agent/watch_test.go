package agent

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestIsWriteTemp(t *testing.T) {
	for name, want := range map[string]bool{
		".out.csv.cellbox-123456": true,
		".x.cellbox-1":            true,
		"out.csv":                 false,
		".out.csv":                false,
		".out.cellbox-":           false,
		".out.cellbox-12a":        false,
		"a.cellbox-12":            false,
	} {
		assert.Equal(t, want, isWriteTemp(name), name)
	}
}
