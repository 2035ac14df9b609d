package api

import (
	"encoding/json"
	"strings"
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

// TestDecodeResultAsEncodingJSON: a result with a long content decodes
// (fast path) to what json.Unmarshal gives, whatever the content holds.
func TestDecodeResultAsEncodingJSON(t *testing.T) {
	pad := strings.Repeat("x", 5000)
	for _, content := range []string{
		pad + `\n\t\"\\\u00e9\ud83d\ude00 é中`,
		pad + `\udc80 lone surrogate`,
		pad + "\xff invalid UTF-8",
	} {
		for _, res := range []string{
			`{"is_error":false,"content":"` + content + `","encoding":"utf-8","total_lines":3,"start_line":1,"end_line":3,"next_offset":2,"truncated":true,"size":5}`,
			`{"is_error":false,"Content":"` + content + `"}`,
			`{"is_error":false,"content":"` + content + `","CONTENT":"later"}`,
		} {
			var want, got ReadFileOutput
			require.NoError(t, json.Unmarshal([]byte(res), &want))
			require.NoError(t, DecodeResult(json.RawMessage(res), &got))
			assert.Equal(t, want, got, res[len(res)-40:])
		}
	}
	var out ReadFileOutput
	assert.ErrorContains(t, DecodeResult(json.RawMessage(`{"content":"`+pad+`","size":"big"}`), &out), "decode tool result: json: cannot unmarshal string into Go struct field ReadFileOutput.size of type int64")
}
