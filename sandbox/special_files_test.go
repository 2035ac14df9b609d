package sandbox

import (
	"context"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/api"
)

// TestToolsOnSpecialFiles: edit, transfer and the download endpoint given a
// FIFO or a symlink say what the path is, as invalid input. Before:
// "a other, not a file", and transfer's refusal was an "internal" error;
// so was process's answer to an unknown id.
func TestToolsOnSpecialFiles(t *testing.T) {
	rb := newRealService(t, "local", nil)
	rb.ok("shell", map[string]any{"command": "mkfifo /workspace/ff && ln -s /etc/passwd /workspace/link"})
	tests := []struct {
		tool  string
		input map[string]any
		want  string
	}{
		{"edit", map[string]any{"path": "ff", "edits": []map[string]any{{"oldText": "a", "newText": "b"}}}, "/workspace/ff is a special file (device, FIFO or socket)"},
		{"transfer", map[string]any{"from_path": "ff", "to_sandbox": "other", "to_path": "x"}, "/workspace/ff is a special file (device, FIFO or socket); transfer copies files and directories"},
		{"transfer", map[string]any{"from_path": "link", "to_sandbox": "other", "to_path": "x"}, "/workspace/link is a symlink; transfer copies files and directories"},
	}
	for _, tt := range tests {
		m := rb.call(tt.tool, tt.input)
		require.Equal(t, true, m["is_error"], "%s: %v", tt.tool, m)
		assert.Equal(t, api.CodeInvalidInput, m["code"], "%s: %v", tt.tool, m["error"])
		assert.Contains(t, m["error"], tt.want, tt.tool)
	}
	// An unknown process id is not found, not an internal fault.
	for _, action := range []string{"logs", "kill"} {
		m := rb.call("process", map[string]any{"action": action, "id": "p99"})
		require.Equal(t, true, m["is_error"], "%v", m)
		assert.Equal(t, api.CodeNotFound, m["code"], "%v", m["error"])
		assert.Contains(t, m["error"], "p99")
	}
	sess, err := rb.s.session(rb.sess)
	require.NoError(t, err)
	_, err = rb.s.Download(context.Background(), sess, "default", "ff", io.Discard, func(agent.FileInfo) error { return nil }, func(string) {})
	require.Error(t, err)
	assert.Equal(t, api.CodeInvalidInput, ErrorCode(err))
	assert.Contains(t, err.Error(), "download /workspace/ff: a special file (device, FIFO or socket), not a file")
}
