package sandbox

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestInvalidUTF8Refused: encoding/json turns invalid UTF-8 and lone
// surrogate escapes into U+FFFD; a tool must refuse them, naming the
// field, rather than run a different command or write different bytes.
func TestInvalidUTF8Refused(t *testing.T) {
	be := newFakeBackend(t)
	s := newTestService(t, be, "", nil)
	h := newSession(t, s)
	bad := []struct{ name, tool, body, field string }{
		{"raw byte in a command", "shell", "{\"command\":\"echo \xff\"}", "command"},
		{"lone low surrogate in a path", "write_file", `{"path":"a\udc80.txt","content":"x"}`, "path"},
		{"lone high surrogate at the end of content", "write_file", `{"path":"b.txt","content":"x\ud800"}`, "content"},
		{"high surrogate before a plain escape", "write_file", `{"path":"c.txt","content":"\ud800\n"}`, "content"},
		{"truncated UTF-8 in an env value", "shell", "{\"command\":\"true\",\"env\":{\"A\":\"\xe2\x82\"}}", "env"},
	}
	// The same in contents long enough to take the fast path (fastjson.Unquote).
	pad := strings.Repeat("line\\n", 2<<10)
	for _, tail := range []string{`\udc80`, `\ud800`, `\ud800\n`, `\ud800\ud800`, `\udc80\ud800x`} {
		bad = append(bad, struct{ name, tool, body, field string }{"long content ending " + tail, "write_file", `{"path":"e.txt","content":"` + pad + tail + `"}`, "content"})
	}
	bad = append(bad, struct{ name, tool, body, field string }{"raw byte in long content", "write_file", "{\"path\":\"f.txt\",\"content\":\"" + pad + "\xff\"}", "content"})
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			m := h.raw(tc.tool, tc.body)
			require.Equal(t, true, m["is_error"], "%v", m)
			assert.Contains(t, m["error"], `field "`+tc.field+`"`)
			assert.Contains(t, m["error"], "not valid UTF-8")
		})
	}
	m := h.raw("write_file", "{\"path\":\"d.txt\",\"content\":\"\xff\"}")
	assert.Contains(t, m["error"], `"encoding": "base64"`)
	m = h.raw("write_file", "{\"path\":\"d\xff.txt\",\"content\":\"x\"}")
	assert.Contains(t, m["error"], `field "path"`)
	assert.NotContains(t, m["error"], "base64", "a path takes no base64: the hint is content's")

	// Valid text: a surrogate pair and an escaped backslash before "u".
	m = h.raw("write_file", `{"path":"ok.txt","content":"\ud83d\ude00 \\udc80"}`)
	require.Equal(t, false, m["is_error"], "%v", m)
	r := h.tool("read_file", map[string]any{"path": "ok.txt"})
	assert.Equal(t, "😀 \\udc80", r["content"])
}
