package image

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRunLoggedBothStreams runs a command that writes stdout and stderr in
// turn, as debootstrap and apt-get do, into one build log. Run with -race: a
// build step whose two streams were copied into the log by two goroutines
// raced on the first image build of a machine.
func TestRunLoggedBothStreams(t *testing.T) {
	var log bytes.Buffer
	tail, err := runLogged(context.Background(), &log, "sh", "-c", `for i in $(seq 300); do echo out$i; echo err$i >&2; done; exit 3`)
	require.Error(t, err, "the exit status comes back")
	lines := strings.Split(strings.TrimSpace(log.String()), "\n")
	require.Len(t, lines, 600, "every line of both streams is in the log")
	assert.Equal(t, []string{"out1", "err1", "out2"}, lines[:3], "in the order written")
	assert.True(t, strings.HasSuffix(tail.String(), "out300\nerr300"), "the tail ends with the last lines: %q", tail.String()[max(0, len(tail.String())-40):])
	assert.LessOrEqual(t, len(tail.String()), 4096)
}
