package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/tools"
)

// Every tool error result carries a code beside the message, one place
// (toolResult) writes it, and ErrorCode maps the agent's codes and the
// service's own errors onto the API's closed set.
func TestErrorCode(t *testing.T) {
	tests := []struct {
		name string
		err  error
		code string
	}{
		{"agent not found", &agent.Error{Op: "read", Code: agent.CodeNotFound, Message: "read /workspace/x: no such file"}, api.CodeNotFound},
		{"agent outside", fmt.Errorf("box died: %w", &agent.Error{Code: agent.CodeOutsideWorkspace}), api.CodeOutsideWorkspace},
		{"agent is_dir", &agent.Error{Code: agent.CodeIsDir}, api.CodeInvalidInput},
		{"agent too large", &agent.Error{Code: agent.CodeTooLarge}, api.CodeTooLarge},
		{"agent exists", &agent.Error{Code: agent.CodeExists}, api.CodeExists},
		{"agent timeout", &agent.Error{Code: agent.CodeTimeout}, api.CodeTimeout},
		{"agent unknown code", &agent.Error{Code: "new_one"}, api.CodeInvalidInput},
		{"no session", fmt.Errorf("session s: %w", ErrNoSession), api.CodeNoSession},
		{"given code wins", api.WithCode(api.CodeRefused, &agent.Error{Code: agent.CodeNotFound}), api.CodeRefused},
		{"unknown tool", fmt.Errorf("x: %w", tools.ErrUnknownTool), api.CodeInvalidInput},
		{"deadline", fmt.Errorf("exec: %w", context.DeadlineExceeded), api.CodeTimeout},
		{"shutting down", fmt.Errorf("wake: %w", errShuttingDown("cb-x")), api.CodeUnavailable},
		{"anything else", errors.New("backend down"), api.CodeInternal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.code, ErrorCode(tt.err))
			var head struct {
				IsError bool   `json:"is_error"`
				Error   string `json:"error"`
				Code    string `json:"code"`
			}
			require.NoError(t, json.Unmarshal(toolResult(nil, nil, tt.err, nil), &head))
			assert.True(t, head.IsError)
			assert.Equal(t, tt.err.Error(), head.Error, "the message is kept")
			assert.Equal(t, tt.code, head.Code)
		})
	}
	assert.Equal(t, "", ErrorCode(nil))
	assert.JSONEq(t, `{"is_error":false,"ok":true}`, string(toolResult(nil, api.OKOutput{OK: true}, nil, nil)), "no code on success")
}

// The service's own refusals carry their codes.
func TestServiceErrorCodes(t *testing.T) {
	assert.Equal(t, api.CodeRefused, ErrorCode(tools.AllowList{"ls"}.Check("rm -rf /", nil)))
	assert.Equal(t, api.CodeInvalidInput, ErrorCode(CheckName("no/slash")))
	s := &Service{cfg: Config{MaxBoxesPerSession: 1, MaxBoxes: 10}}
	full := &Session{ID: "s", boxes: map[string]*box{"a": {}}}
	assert.Equal(t, api.CodeLimit, ErrorCode(s.checkCapsLocked(full, 1)))
	assert.NoError(t, s.checkCapsLocked(&Session{ID: "t", boxes: map[string]*box{}}, 1))
	tool, ok := LookupTool("read_file")
	require.True(t, ok)
	_, err := tool.Run(context.Background(), nil, json.RawMessage(`{"path":"x","bogus":1}`))
	assert.Equal(t, api.CodeInvalidInput, ErrorCode(err))
	// A port past 65535 is refused by the schema (before: "internal").
	browse, ok := LookupTool("browse")
	require.True(t, ok)
	_, err = browse.Run(context.Background(), nil, json.RawMessage(`{"port":70000}`))
	assert.Equal(t, api.CodeInvalidInput, ErrorCode(err))
	assert.ErrorContains(t, err, "port: must be <= 65535 (got 70000)")
}
