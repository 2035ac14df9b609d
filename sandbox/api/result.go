package api

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/cellbox/cellbox/internal/fastjson"
)

// MarshalInput encodes a tool input: json.RawMessage and []byte are taken
// as JSON as they are, nil is {}, anything else is marshalled.
func MarshalInput(input any) (json.RawMessage, error) {
	switch v := input.(type) {
	case nil:
		return json.RawMessage("{}"), nil
	case json.RawMessage:
		return v, nil
	case []byte:
		return v, nil
	}
	return AppendInput(nil, input)
}

// AppendInput appends the JSON of a tool input that is not JSON already
// (not a json.RawMessage or []byte) to dst: json.Marshal's bytes, a long
// content quoted faster.
func AppendInput(dst []byte, input any) ([]byte, error) {
	raw, err := fastjson.AppendMarshal(dst, input, true)
	if err != nil {
		return dst, fmt.Errorf("encode tool input: %w", err)
	}
	return raw, nil
}

// ResultError returns a *ToolError if the result object of tool has
// is_error: true, else nil.
func ResultError(tool string, result json.RawMessage) error {
	// cellbox writes is_error first; a success is known without decoding
	// what may be a megabyte of content.
	if bytes.HasPrefix(result, []byte(`{"is_error":false,`)) || string(result) == `{"is_error":false}` {
		return nil
	}
	var head struct {
		IsError bool   `json:"is_error"`
		Error   string `json:"error"`
		Code    string `json:"code"`
	}
	if err := json.Unmarshal(result, &head); err != nil {
		return fmt.Errorf("%s: result is not a JSON object: %w", tool, err)
	}
	if !head.IsError {
		return nil
	}
	return &ToolError{Tool: tool, Code: head.Code, Message: head.Error, Result: result}
}

// DecodeResult decodes a result object into out: json.Unmarshal's result,
// with a long content unquoted in one pass (fastjson.Unmarshal).
func DecodeResult(result json.RawMessage, out any) error {
	if err := fastjson.Unmarshal(result, out); err != nil {
		return fmt.Errorf("decode tool result: %w", err)
	}
	return nil
}
