package main

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
)

// What a box prints reaches the operator's terminal through `cellbox run`'s
// view, `cell ls`, `cell watch` and error lines: its escape sequences are
// shown, never sent (they cleared the screen, set the title and the
// clipboard: OSC 52).
func TestBoxOutputIsShownNotSent(t *testing.T) {
	evil := "\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b[2Jspoof\x9b31m"
	for name, got := range map[string]string{
		"a sandbox node's last command": short([]byte(`{"pending":false,"status":"running","history":[{"exit_code":0,"stdout":"`+jsonEscape(evil)+`"}]}`), 200),
		"an exec result":                short([]byte(`{"pending":false,"result":{"exit_code":0,"stdout":"`+jsonEscape(evil)+`"},"error":null}`), 200),
		"an error":                      oneLine("command exited with 1: " + evil),
		"a clipped value":               clip(evil, 10),
	} {
		assert.False(t, strings.ContainsFunc(got, unicode.IsControl), "%s: %q", name, got)
		assert.Contains(t, got, `\x1b`, name)
	}
	assert.Equal(t, `a\x1b[2Jb\x07 ü`, printable("a\x1b[2Jb\x07 ü"))
}

// jsonEscape is s as the inside of a JSON string.
func jsonEscape(s string) string {
	b, _ := json.Marshal(s)
	return string(b[1 : len(b)-1])
}
