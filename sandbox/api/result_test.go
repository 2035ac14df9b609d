package api

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestResultError(t *testing.T) {
	tests := []struct {
		name    string
		result  string
		wantErr string
	}{
		{"ok", `{"is_error":false,"stdout":"x"}`, ""},
		{"tool error", `{"is_error":true,"error":"read /workspace/x: no such file"}`, "read_file: read /workspace/x: no such file"},
		{"not an object", `[1]`, "not a JSON object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ResultError("read_file", json.RawMessage(tt.result))
			if tt.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
	var te *ToolError
	require.ErrorAs(t, ResultError("shell", json.RawMessage(`{"is_error":true,"error":"boom"}`)), &te)
	assert.Equal(t, "boom", te.Message)
	assert.JSONEq(t, `{"is_error":true,"error":"boom"}`, string(te.Result))
}

func TestMarshalInput(t *testing.T) {
	for _, in := range []any{nil, json.RawMessage(`{"a":1}`), []byte(`{"a":1}`), map[string]int{"a": 1}, struct {
		A int `json:"a"`
	}{1}} {
		raw, err := MarshalInput(in)
		require.NoError(t, err)
		if in == nil {
			assert.JSONEq(t, `{}`, string(raw))
			continue
		}
		assert.JSONEq(t, `{"a":1}`, string(raw))
	}
	_, err := MarshalInput(func() {})
	assert.ErrorContains(t, err, "encode tool input")
}

// TestResultErrorFastPath: ResultError knows a success by its head, and still reads every error.
func TestResultErrorFastPath(t *testing.T) {
	assert.NoError(t, ResultError("t", []byte(`{"is_error":false,"content":"`+string(make([]byte, 10))+`"}`)))
	assert.NoError(t, ResultError("t", []byte(`{"is_error":false}`)))
	assert.NoError(t, ResultError("t", []byte(` { "is_error" : false } `)), "any spacing decodes")
	err := ResultError("read_file", []byte(`{"is_error":true,"error":"no such file","code":"not_found"}`))
	var te *ToolError
	require.ErrorAs(t, err, &te)
	assert.Equal(t, "not_found", te.Code)
	assert.Error(t, ResultError("t", []byte(`[1]`)), "not an object")
}
