package builtins

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandboxclient"
)

// The built-ins tell "no such box" and "no such file" by the clients'
// sentinels, never by the message (which is written for people and may
// change) or by an HTTP status (which says nothing in process, and 404 is
// also a missing session).
func TestErrorKinds(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		noBox    bool
		notFound bool
	}{
		{"tool result no_box, other wording", &sandboxclient.ToolError{Tool: "sandbox_destroy", Code: api.CodeNoBox, Message: `sandbox "x" is gone`}, true, false},
		{"wrapped no_box", fmt.Errorf("cleanup: %w", &sandboxclient.ToolError{Code: api.CodeNoBox}), true, false},
		{"the old message without a code", errors.New(`no sandbox named "x" in this session`), false, false},
		{"HTTP 404 of a missing file", &sandboxclient.APIError{Status: http.StatusNotFound, Code: api.CodeNotFound, Message: "stat /workspace/x: no such file"}, false, true},
		{"HTTP 404 of a missing session", &sandboxclient.APIError{Status: http.StatusNotFound, Code: api.CodeNoSession, Message: "no such session"}, false, false},
		{"in-process not_found", api.WithCode(api.CodeNotFound, errors.New("read x: no such file")), false, true},
		{"internal", &sandboxclient.ToolError{Code: api.CodeInternal, Message: "backend down"}, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.noBox, noSuchBox(tt.err), "noSuchBox")
			assert.Equal(t, tt.notFound, notFound(tt.err), "notFound")
		})
	}
}
