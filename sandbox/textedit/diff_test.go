package textedit

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
)

var fmtSscanf = fmt.Sscanf

func TestUnifiedDiffFormat(t *testing.T) {
	tests := []struct {
		name    string
		a, b    string
		context int
		want    string
	}{
		{name: "equal", a: "x\n", b: "x\n", want: ""},
		{name: "one line changed", a: "a\nb\nc\n", b: "a\nB\nc\n", context: 3,
			want: "--- p\n+++ p\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"},
		{name: "insert into empty", a: "", b: "a\nb\n", context: 3,
			want: "--- p\n+++ p\n@@ -0,0 +1,2 @@\n+a\n+b\n"},
		{name: "delete everything", a: "a\nb\n", b: "", context: 3,
			want: "--- p\n+++ p\n@@ -1,2 +0,0 @@\n-a\n-b\n"},
		{name: "no newline at end", a: "a\nb", b: "a\nb\n", context: 1,
			want: "--- p\n+++ p\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+b\n"},
		{name: "insert without context names the line before", a: "a\nb\n", b: "a\nx\nb\n", context: 0,
			want: "--- p\n+++ p\n@@ -1,0 +2 @@\n+x\n"},
		{name: "far apart changes make two hunks", a: "1\n2\n3\n4\n5\n6\n7\n8\n", b: "one\n2\n3\n4\n5\n6\n7\neight\n", context: 2,
			want: "--- p\n+++ p\n@@ -1,3 +1,3 @@\n-1\n+one\n 2\n 3\n@@ -6,3 +6,3 @@\n 6\n 7\n-8\n+eight\n"},
		{name: "close changes share a hunk", a: "1\n2\n3\n4\n5\n", b: "one\n2\n3\n4\nfive\n", context: 2,
			want: "--- p\n+++ p\n@@ -1,5 +1,5 @@\n-1\n+one\n 2\n 3\n 4\n-5\n+five\n"},
		{name: "negative context is none", a: "a\nb\nc\n", b: "a\nB\nc\n", context: -5,
			want: "--- p\n+++ p\n@@ -2 +2 @@\n-b\n+B\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, UnifiedDiff("p", []byte(tt.a), []byte(tt.b), tt.context))
		})
	}
}

// diffCases are pairs of files that exercise the diff: edge cases plus
// random edits of random files over a small alphabet (so lines repeat).
func diffCases(n int) [][2]string {
	cases := [][2]string{
		{"", "a\n"}, {"a\n", ""}, {"a", "b"}, {"a\nb", "a\nb\n"}, {"a\nb\n", "a\nb"},
		{"a\r\nb\r\n", "a\r\nB\r\n"}, {"x\n", "x\n\n\n"}, {"\n\n\n", "\n"},
		{strings.Repeat("same\n", 50), strings.Repeat("same\n", 49) + "diff\n"},
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range n {
		var a []string
		for range r.IntN(30) {
			a = append(a, fmt.Sprintf("line %d\n", r.IntN(6)))
		}
		b := append([]string(nil), a...)
		for range r.IntN(6) {
			i := r.IntN(len(b) + 1)
			switch r.IntN(3) {
			case 0:
				b = append(b[:i], append([]string{fmt.Sprintf("new %d\n", r.IntN(4))}, b[i:]...)...)
			case 1:
				if i < len(b) {
					b = append(b[:i], b[i+1:]...)
				}
			default:
				if i < len(b) {
					b[i] = fmt.Sprintf("line %d\n", r.IntN(6))
				}
			}
		}
		as, bs := strings.Join(a, ""), strings.Join(b, "")
		if r.IntN(4) == 0 {
			bs = strings.TrimSuffix(bs, "\n")
		}
		cases = append(cases, [2]string{as, bs})
	}
	return cases
}

// TestUnifiedDiffPatch checks that patch(1) turns a into b with the diff.
func TestUnifiedDiffPatch(t *testing.T) {
	patch := testenv.RequireCommand(t, "patch")
	dir := t.TempDir()
	for i, c := range diffCases(60) {
		a, b := c[0], c[1]
		diff := UnifiedDiff("f.txt", []byte(a), []byte(b), i%4)
		if a == b {
			assert.Empty(t, diff)
			continue
		}
		orig, out, pf := filepath.Join(dir, "a"), filepath.Join(dir, "out"), filepath.Join(dir, "d.patch")
		require.NoError(t, os.WriteFile(orig, []byte(a), 0o644))
		require.NoError(t, os.WriteFile(pf, []byte(diff), 0o644))
		cmd := exec.Command(patch, "--batch", "--silent", "--binary", "-F0", "-o", out, orig, pf)
		msg, err := cmd.CombinedOutput()
		require.NoError(t, err, "case %d: patch: %s\n%q -> %q\n%s", i, msg, a, b, diff)
		got, err := os.ReadFile(out)
		require.NoError(t, err)
		require.Equal(t, b, string(got), "case %d:\n%s", i, diff)
	}
}

// TestUnifiedDiffMinimal checks the diff against a dynamic-programming LCS:
// Myers finds a shortest edit script.
func TestUnifiedDiffMinimal(t *testing.T) {
	for i, c := range diffCases(300) {
		a, b := splitLinesOrEmpty(c[0]), splitLinesOrEmpty(c[1])
		diff := UnifiedDiff("f", []byte(c[0]), []byte(c[1]), 0)
		got, err := applyDiff(c[0], diff)
		require.NoError(t, err, "case %d", i)
		require.Equal(t, c[1], got, "case %d", i)
		changes := 0
		for _, l := range splitLinesOrEmpty(diff) {
			if (l[0] == '+' || l[0] == '-') && !strings.HasPrefix(l, "--- ") && !strings.HasPrefix(l, "+++ ") {
				changes++
			}
		}
		assert.Equal(t, len(a)+len(b)-2*lcs(a, b), changes, "case %d:\n%s", i, diff)
	}
}

func lcs(a, b []string) int {
	dp := make([][]int, len(a)+1)
	for i := range dp {
		dp[i] = make([]int, len(b)+1)
	}
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if a[i] == b[j] {
				dp[i][j] = dp[i+1][j+1] + 1
			} else {
				dp[i][j] = max(dp[i+1][j], dp[i][j+1])
			}
		}
	}
	return dp[0][0]
}

// TestUnifiedDiffLarge checks a wholesale rewrite of a big file stays fast
// and correct (the cost cap kicks in).
func TestUnifiedDiffLarge(t *testing.T) {
	var a, b strings.Builder
	for i := range 40000 {
		fmt.Fprintf(&a, "old line %d\n", i)
		fmt.Fprintf(&b, "new line %d\n", i)
		if i%1000 == 0 {
			a.WriteString("shared\n")
			b.WriteString("shared\n")
		}
	}
	diff := UnifiedDiff("big", []byte(a.String()), []byte(b.String()), 3)
	got, err := applyDiff(a.String(), diff)
	require.NoError(t, err)
	assert.Equal(t, b.String(), got)
}
