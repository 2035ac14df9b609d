package builtins_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTextOutputNotUTF8: a text output file holding bytes that are not
// UTF-8 fails its run, saying where, instead of reaching its cell with
// each such byte replaced by U+FFFD.
func TestTextOutputNotUTF8(t *testing.T) {
	b := newBox(t)
	r := b.load(t, `
name: utf8
nodes:
  bin:
    exec:
      command: printf 'ok \xff\xfe' > /workspace/bin.txt
      files: {/workspace/bin.txt: text}
  fine:
    exec:
      command: printf 'h\xc3\xa9 \xef\xbf\xbd' > /workspace/t.txt
      files: {/workspace/t.txt: text}
`, nil)
	r.settle()
	out := r.exec("bin")
	require.NotNil(t, out.Error)
	assert.Contains(t, *out.Error, "output file /workspace/bin.txt is not UTF-8 text (byte 3 is 0xff)")
	out = r.exec("fine")
	require.Nil(t, out.Error, "UTF-8, a U+FFFD of its own included, is text")
	assert.Equal(t, "hé \ufffd", out.Result.Files["/workspace/t.txt"])
}
