package textedit

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func FuzzEdit(f *testing.F) {
	f.Add(goFile, "x := 1", "x := 2", false)
	f.Add(goFile, "    x := 1\n    y := 2", "    z := 3", true)
	f.Add("a\nb\nc\n", "b\n", "B\nB\n", true)
	f.Add("\uFEFFa  b\n", "a b", "ab", false)
	f.Add("a\r\nb\nc", "a\nb", "x", false)
	f.Add("aaa", "aa", "b", false)
	f.Add("x\n", "", "y", false)
	f.Fuzz(func(t *testing.T, file, old, repl string, crlf bool) {
		if crlf {
			file = strings.ReplaceAll(file, "\n", "\r\n")
		}
		res, err := Edit([]byte(file), []Replacement{{old, repl}})
		if err != nil {
			var e *Error
			require.ErrorAs(t, err, &e)
			require.NotEmpty(t, e.Msg)
			return
		}
		require.NotEqual(t, file, string(res.Content))
		require.Equal(t, 1, res.Replacements)

		got, err := applyDiff(file, res.Diff)
		require.NoError(t, err, "diff:\n%s", res.Diff)
		require.Equal(t, string(res.Content), got, "the diff turns the original into the result")

		if strings.HasPrefix(file, bom) {
			require.True(t, bytes.HasPrefix(res.Content, []byte(bom)), "BOM kept")
		}
		lf, crlfs := lineEndings(file)
		outLF, outCRLF := lineEndings(string(res.Content))
		if crlfs > 0 && lf == 0 {
			require.Zero(t, outLF, "a CRLF file stays CRLF: %q", res.Content)
		}
		if !strings.Contains(file+old+repl, "\r") {
			require.Zero(t, outCRLF, "an LF file stays LF")
		}

		// Undoing an exact edit restores the original, when the file has one
		// line ending style, the result still has a line ending to show it,
		// and no stray CR can join a new line ending.
		if len(res.Fuzzy) > 0 || (lf > 0 && crlfs > 0) || (crlfs > 0 && outCRLF == 0) ||
			strings.Contains(old+repl, "\r") || strings.Count(file, "\r") != crlfs {
			return
		}
		back, err := Edit(res.Content, []Replacement{{repl, old}})
		if err != nil || len(back.Fuzzy) > 0 {
			return // new text is empty, not unique in the result, or ...
		}
		require.Equal(t, file, string(back.Content), "reverse edit restores the original")
	})
}

// lineEndings counts the lone LF and the CRLF line endings in s.
func lineEndings(s string) (lf, crlf int) {
	crlf = strings.Count(s, "\r\n")
	return strings.Count(s, "\n") - crlf, crlf
}

func FuzzUnifiedDiff(f *testing.F) {
	for _, c := range diffCases(10) {
		f.Add(c[0], c[1], 3)
	}
	f.Fuzz(func(t *testing.T, a, b string, context int) {
		context = context % 10
		diff := UnifiedDiff("f", []byte(a), []byte(b), context)
		got, err := applyDiff(a, diff)
		require.NoError(t, err, "diff:\n%s", diff)
		require.Equal(t, b, got)
	})
}
