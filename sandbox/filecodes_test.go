package sandbox

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/cellbox/cellbox/sandbox/api"
)

// TestFileToolErrorCodes: the file tools' failures carry the code
// docs/api.md gives for them, through a real box — a size limit is
// too_large (it was internal, "a fault of the service"), a bad request is
// invalid_input, a missing file not_found, an escape outside_workspace.
func TestFileToolErrorCodes(t *testing.T) {
	rb := newRealService(t, "local", nil)
	h := newSession(t, rb.s)
	h.tool("shell", map[string]any{"command": "head -c 3000000 /dev/zero | tr '\\0' a > big.txt && echo hello > small.txt && mkdir d"})

	tests := []struct {
		name, tool string
		in         map[string]any
		code, msg  string
	}{
		{"write_file over 2 MiB", "write_file", map[string]any{"path": "x.txt", "content": strings.Repeat("a", 3_000_000)}, api.CodeTooLarge, "write_file takes at most"},
		{"edit of a file over 2 MiB", "edit", map[string]any{"path": "big.txt", "edits": []map[string]string{{"oldText": "a", "newText": "b"}}}, api.CodeTooLarge, "edit works on files up to 2 MiB"},
		{"str_replace of a file over 2 MiB", "str_replace", map[string]any{"path": "big.txt", "old_str": "a", "new_str": "b"}, api.CodeTooLarge, "edit works on files up to 2 MiB"},
		{"write_file, bad base64", "write_file", map[string]any{"path": "x.bin", "content": "!!", "encoding": "base64"}, api.CodeInvalidInput, "not valid base64"},
		{"edit, no edits", "edit", map[string]any{"path": "small.txt", "edits": []map[string]string{}}, api.CodeInvalidInput, "edits is empty"},
		{"edit, old text not there", "edit", map[string]any{"path": "small.txt", "edits": []map[string]string{{"oldText": "nope", "newText": "b"}}}, api.CodeInvalidInput, "was not found in the file"},
		{"str_replace, old text not there", "str_replace", map[string]any{"path": "small.txt", "old_str": "nope", "new_str": "b"}, api.CodeInvalidInput, "was not found in the file"},
		{"edit of a directory", "edit", map[string]any{"path": "d", "edits": []map[string]string{{"oldText": "a", "newText": "b"}}}, api.CodeInvalidInput, "not a file"},
		{"ls of a file", "ls", map[string]any{"path": "small.txt"}, api.CodeInvalidInput, "not a directory"},
		{"transfer of a directory, not recursive", "transfer", map[string]any{"from_path": "d", "to_path": "e"}, api.CodeInvalidInput, "recursive"},
		{"read_file of a missing file", "read_file", map[string]any{"path": "missing.txt"}, api.CodeNotFound, "missing.txt"},
		{"edit of a missing file", "edit", map[string]any{"path": "missing.txt", "edits": []map[string]string{{"oldText": "a", "newText": "b"}}}, api.CodeNotFound, "missing.txt"},
		{"read_file outside the workspace", "read_file", map[string]any{"path": "/etc/passwd"}, api.CodeOutsideWorkspace, "/etc/passwd"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := h.call(tt.tool, tt.in)
			assert.Equal(t, true, out["is_error"], "%v", out)
			assert.Equal(t, tt.code, out["code"], "%v", out["error"])
			assert.Contains(t, out["error"], tt.msg)
		})
	}
}
