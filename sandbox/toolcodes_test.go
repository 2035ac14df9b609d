package sandbox

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/cellbox/cellbox/sandbox/api"
)

// TestBoxToolErrorCodes: a box tool refusing its input says why with the
// code that fits (docs/api.md), not internal ("a fault of the service").
func TestBoxToolErrorCodes(t *testing.T) {
	s := newTestService(t, newFakeBackend(t), "", nil)
	h := newSession(t, s)
	h.tool("sandbox_create", map[string]any{"sandbox": "mine", "box_id": "shared-a", "share_across_sessions": true})
	limited := newSessionWith(t, s, api.NewSessionRequest{AllowedCommands: []string{"echo"}})
	for _, tc := range []struct {
		name, tool, body, code string
		h                      *testSession
	}{
		{"empty command", "shell", `{"command": "  "}`, api.CodeInvalidInput, h},
		{"wait_port past its longest wait", "wait_port", `{"port": 8000, "timeout_ms": 700000}`, api.CodeInvalidInput, h},
		{"wait_port of no port", "wait_port", `{"port": 70000}`, api.CodeInvalidInput, h},
		{"process kill without an id", "process", `{"action": "kill"}`, api.CodeInvalidInput, h},
		{"a name taken by another shared box", "sandbox_create", `{"sandbox": "mine", "box_id": "shared-b", "share_across_sessions": true}`, api.CodeExists, h},
		{"a shared box_id in an allowed_commands session", "sandbox_create", `{"sandbox": "x", "box_id": "shared-a", "share_across_sessions": true}`, api.CodeRefused, limited},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := tc.h.raw(tc.tool, tc.body)
			assert.Equal(t, true, m["is_error"], "%v", m)
			assert.Equal(t, tc.code, m["code"], "%v", m)
		})
	}
}
