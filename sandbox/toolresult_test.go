package sandbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/stretchr/testify/assert"
)

// toolResultJSON is toolResult as it was written with encoding/json: the
// oracle the hand-written one must match byte for byte.
func toolResultJSON(out any, err error, notices []string) string {
	str := func(s string) string {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		enc.Encode(s)
		return strings.TrimSpace(b.String())
	}
	var body []byte
	if err == nil {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if merr := enc.Encode(out); merr != nil {
			err = errors.New("encode result: " + merr.Error())
		} else if body = bytes.TrimSpace(b.Bytes()); len(body) < 2 || body[0] != '{' {
			err = errors.New("tool result is not an object")
		}
	}
	s := `{"is_error":`
	if err != nil {
		s += `true,"error":` + str(err.Error()) + `,"code":` + str(ErrorCode(err))
	} else {
		s += "false"
	}
	if len(notices) > 0 {
		s += `,"notice":` + str(strings.Join(notices, "; "))
	}
	if err == nil && len(body) > 2 {
		return s + "," + string(body[1:])
	}
	return s + "}"
}

// TestToolResultAsEncodingJSON: the result object is the same bytes as
// encoding/json renders, for long and short contents, errors, notices and
// outputs that are not objects.
func TestToolResultAsEncodingJSON(t *testing.T) {
	long := strings.Repeat("line <&> \"q\" \\ é \u2028 \xff\t\n", 400)
	for _, tc := range []struct {
		name    string
		out     any
		err     error
		notices []string
	}{
		{"read window", api.ReadFileOutput{Content: long, Encoding: "utf-8", TotalLines: 3, NextOffset: 2, Size: 99}, nil, nil},
		{"with notices", &api.ReadFileOutput{Content: long}, nil, []string{"box recreated", "<b>"}},
		{"short", api.OKOutput{OK: true}, nil, nil},
		{"no fields", struct{}{}, nil, []string{"n"}},
		{"error", nil, api.WithCode(api.CodeNotFound, errors.New(`read_file /x: no such file "<x>"`)), []string{"n"}},
		{"not an object", []string{"a"}, nil, nil},
		{"unencodable", map[string]any{"f": func() {}}, nil, nil},
	} {
		want := toolResultJSON(tc.out, tc.err, tc.notices)
		assert.Equal(t, want, string(toolResult(nil, tc.out, tc.err, tc.notices)), tc.name)
		// Appended to a buffer (the HTTP API's kept one), after what it holds.
		dst := append(make([]byte, 0, 64), "kept"...)
		assert.Equal(t, "kept"+want, string(toolResult(dst, tc.out, tc.err, tc.notices)), tc.name)
	}
}
