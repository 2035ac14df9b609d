package backend

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestExitSummary(t *testing.T) {
	crash := "time=2026-01-01T00:00:00Z level=INFO msg=\"agent listening\" pid=1\n" +
		"SIGSEGV: segmentation violation\nPC=0x491341 m=0 sigcode=0\n\ngoroutine 1 [running]:\n" + strings.Repeat("frame\n", 100)
	for _, tc := range []struct{ log, want string }{
		{crash, "SIGSEGV: segmentation violation; PC=0x491341 m=0 sigcode=0"},
		{"runtime: failed to create new OS thread (have 2 already; errno=11)\n", "runtime: failed to create new OS thread (have 2 already; errno=11)"},
		{"level=INFO msg=bye\n", ""},
		{"", ""},
		{strings.Repeat("x", 300), strings.Repeat("x", 200) + "..."},
	} {
		assert.Equal(t, tc.want, ExitSummary(tc.log))
	}
}
