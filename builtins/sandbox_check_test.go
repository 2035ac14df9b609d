package builtins_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/cellbox/cellbox/builtins"
)

// A malformed run event is refused when it is sent, with the shape to use.
func TestSandboxCheckEvent(t *testing.T) {
	var s builtins.Sandbox
	for _, tc := range []struct {
		stream, payload, err string
	}{
		{"run", `{"command": "ls"}`, ""},
		{"run", `{"cmd": "ls"}`, `unknown field "cmd"`},
		{"run", `{"command": "  "}`, "no command"},
		{"run", `{"command": "ls", "files": {"x.txt": "a"}}`, "not a clean absolute path"},
		{"run", `{"command": "ls", "files": {"/etc/motd": "a"}}`, "is outside /workspace and /tmp"},
		{"run", `{"command": "ls", "files": {"../etc/x": "a"}}`, `"../etc/x" is not a clean absolute path in the box (e.g. "/workspace/x")`},
		{"run", `"ls"`, `run event "ls" is not a JSON object: want {"command": "ls"}`},
		{"run", `[1]`, `run event [1] is not a JSON object: want {"command": "ls -la"}`},
		{"run", `{"command": "` + strings.Repeat("x", 200) + `", "bogus": 1}`, `run event {"command": "` + strings.Repeat("x", 87) + `…: json: unknown field "bogus"`},
		{"run", `{"command": "ls", "files": {"/workspace/a/../b": "a"}}`, `"/workspace/a/../b" is not a clean absolute path in the box (e.g. "/workspace/b")`},
		{"run", `{"command": "ls", "files": {"/workspace/": "a"}}`, `"/workspace/" is not a clean absolute path in the box (e.g. "/workspace/out.txt")`},
		{"run", `{"command": "ls", "files": {"/tmp//x": "a"}}`, `"/tmp//x" is not a clean absolute path in the box (e.g. "/tmp/x")`},
		{"run", `{"command": "ls", "files": {"/tmp/x.txt": "a"}}`, ""},
		{"destroy", `{}`, ""},
		{"stop", `{}`, `no stream "stop"`},
	} {
		err := s.CheckEvent(tc.stream, json.RawMessage(tc.payload))
		if tc.err == "" {
			assert.NoError(t, err, tc.payload)
		} else {
			assert.ErrorContains(t, err, tc.err, tc.payload)
		}
	}
}
