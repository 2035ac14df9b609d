package textedit

import (
	"fmt"
	"strings"

	udiff "github.com/aymanbagabas/go-udiff"
)

// UnifiedDiff returns a unified diff from a to b, in the format patch(1) and
// git apply read: "--- path" / "+++ path" headers, then @@ hunks with context
// unchanged lines around each change (negative means 0). Lines are compared
// byte for byte (a CRLF line differs from its LF twin), and a missing final
// newline is marked "\ No newline at end of file". Equal inputs give "".
//
// The line diff and the hunks come from go-udiff (the Go team's
// golang.org/x/tools/internal/diff, exported). Only the hunk headers are
// written here: udiff writes an empty range as "-N" (one line) when there is
// no context, which patch(1) misreads; GNU diff writes "-N,0", naming the
// line before the gap.
func UnifiedDiff(path string, a, b []byte, context int) string {
	if string(a) == string(b) {
		return ""
	}
	u, err := udiff.ToUnifiedDiff(path, path, string(a), udiff.Lines(string(a), string(b)), max(context, 0))
	if err != nil {
		// Cannot happen: the edits come from the same text.
		panic(fmt.Sprintf("textedit: udiff: %v", err))
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "--- %s\n+++ %s\n", path, path)
	for _, h := range u.Hunks {
		var from, to int
		for _, l := range h.Lines {
			if l.Kind != udiff.Insert {
				from++
			}
			if l.Kind != udiff.Delete {
				to++
			}
		}
		fmt.Fprintf(&sb, "@@ -%s +%s @@\n", hunkRange(h.FromLine, from), hunkRange(h.ToLine, to))
		for _, l := range h.Lines {
			switch l.Kind {
			case udiff.Delete:
				sb.WriteByte('-')
			case udiff.Insert:
				sb.WriteByte('+')
			default:
				sb.WriteByte(' ')
			}
			sb.WriteString(l.Content)
			if !strings.HasSuffix(l.Content, "\n") {
				sb.WriteString("\n\\ No newline at end of file\n")
			}
		}
	}
	return sb.String()
}

// hunkRange formats a hunk's range from its 1-based first line and its count.
func hunkRange(first, n int) string {
	switch n {
	case 0:
		return fmt.Sprintf("%d,0", first-1) // an empty range names the line before it
	case 1:
		return fmt.Sprint(first)
	}
	return fmt.Sprintf("%d,%d", first, n)
}
