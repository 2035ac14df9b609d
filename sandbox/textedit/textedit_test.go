package textedit

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const goFile = `package main

func main() {
	x := 1
	y := 2
	fmt.Println(x + y)
}
`

func TestEdit(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		edits   []Replacement
		want    string
		fuzzy   []int
		wantErr error
		errHas  []string
	}{
		{
			name:  "single exact edit",
			file:  goFile,
			edits: []Replacement{{"x := 1", "x := 10"}},
			want:  strings.Replace(goFile, "x := 1", "x := 10", 1),
		},
		{
			name: "edits are matched against the original, not incrementally",
			file: "a\nb\nc\n",
			// the second edit's oldText is what the first one produces: it must not see it
			edits: []Replacement{{"a\n", "b2\n"}, {"b\n", "B\n"}},
			want:  "b2\nB\nc\n",
		},
		{
			name:  "several edits in any order",
			file:  goFile,
			edits: []Replacement{{"y := 2", "y := 20"}, {"package main", "package demo"}},
			want:  strings.Replace(strings.Replace(goFile, "y := 2", "y := 20", 1), "package main", "package demo", 1),
		},
		{
			name:    "overlapping edits are rejected naming both",
			file:    goFile,
			edits:   []Replacement{{"x := 1\n\ty := 2", "z"}, {"y := 2\n\tfmt", "w"}},
			wantErr: ErrOverlap,
			errHas:  []string{"edits[0] and edits[1] overlap", "line 5", "against the original file"},
		},
		{
			name:    "nested edits are rejected",
			file:    goFile,
			edits:   []Replacement{{"fmt.Println", "log.Println"}, {"\tfmt.Println(x + y)\n", "\n"}},
			wantErr: ErrOverlap,
			errHas:  []string{"edits[0] and edits[1] overlap"},
		},
		{
			name:    "ambiguous match says how many and where",
			file:    "v = 1\nv = 1\nw = 2\nv = 1\n",
			edits:   []Replacement{{"v = 1", "v = 3"}},
			wantErr: ErrAmbiguous,
			errHas:  []string{"edits[0].oldText matches 3 times (at lines 1, 2, 4)", "add surrounding lines"},
		},
		{
			name:    "not found points at the first line",
			file:    goFile,
			edits:   []Replacement{{"x := 1\n\tz := 3", "x := 2"}},
			wantErr: ErrNotFound,
			errHas:  []string{"edits[0].oldText was not found", `first line "x := 1" occurs at line 4`},
		},
		{
			name:    "not found at all",
			file:    goFile,
			edits:   []Replacement{{"nothing like this", "x"}},
			wantErr: ErrNotFound,
			errHas:  []string{`even its first line "nothing like this" does not occur`},
		},
		{
			name:    "empty oldText",
			file:    goFile,
			edits:   []Replacement{{"", "x"}},
			wantErr: ErrEmptyOld,
			errHas:  []string{"edits[0].oldText is empty", "write_file"},
		},
		{
			name:    "identical old and new",
			file:    goFile,
			edits:   []Replacement{{"x := 1", "x := 1"}},
			wantErr: ErrNoChange,
			errHas:  []string{"edits[0].oldText and edits[0].newText are identical"},
		},
		{
			name:    "no edits",
			file:    goFile,
			wantErr: ErrNoChange,
			errHas:  []string{"edits is empty"},
		},
		{
			name:    "every failing edit is reported",
			file:    goFile,
			edits:   []Replacement{{"x := 1", "x := 2"}, {"missing", "m"}, {"", "e"}},
			wantErr: ErrNotFound,
			errHas:  []string{"edits[1].oldText was not found", "edits[2].oldText is empty"},
		},
		{
			name:  "CRLF file stays CRLF",
			file:  "a\r\nb\r\nc\r\n",
			edits: []Replacement{{"b\n", "B\nB2\n"}},
			want:  "a\r\nB\r\nB2\r\nc\r\n",
		},
		{
			name:  "CRLF oldText matches an LF file and writes LF",
			file:  "a\nb\nc\n",
			edits: []Replacement{{"a\r\nb", "x\r\ny"}},
			want:  "x\ny\nc\n",
		},
		{
			name:  "mixed line endings: untouched lines keep theirs",
			file:  "a\r\nb\nc\r\nd\r\n",
			edits: []Replacement{{"c\nd", "C\nD"}},
			want:  "a\r\nb\nC\r\nD\r\n",
		},
		{
			name:  "BOM is kept and not needed in oldText",
			file:  "\uFEFFfirst\nsecond\n",
			edits: []Replacement{{"first\n", "1st\n"}},
			want:  "\uFEFF1st\nsecond\n",
		},
		{
			name:  "fuzzy: spaces instead of tabs, re-indented to tabs",
			file:  goFile,
			edits: []Replacement{{"    x := 1\n    y := 2\n", "    x := 1\n    if x > 0 {\n        y := 2\n    }\n"}},
			want:  strings.Replace(goFile, "\tx := 1\n\ty := 2\n", "\tx := 1\n\tif x > 0 {\n\t    y := 2\n\t}\n", 1),
			fuzzy: []int{0},
		},
		{
			name:  "fuzzy: trailing whitespace and runs of blanks",
			file:  "key  =   value   \nother\n",
			edits: []Replacement{{"key = value\nother", "key = v2\nother"}},
			want:  "key = v2\nother\n",
			fuzzy: []int{0},
		},
		{
			name:  "fuzzy: missing indentation on later lines",
			file:  "if a {\n    b()\n    c()\n}\n",
			edits: []Replacement{{"b()\nc()", "b()\nd()"}},
			want:  "if a {\n    b()\n    d()\n}\n",
			fuzzy: []int{0},
		},
		{
			name:  "fuzzy and exact edits together",
			file:  goFile,
			edits: []Replacement{{"package main", "package x"}, {"fmt.Println(x  +  y)", "fmt.Println(x * y)"}},
			want:  strings.Replace(strings.Replace(goFile, "package main", "package x", 1), "x + y", "x * y", 1),
			fuzzy: []int{1},
		},
		{
			name:    "fuzzy ambiguous",
			file:    "a  b\nc\na\tb\n",
			edits:   []Replacement{{"a b", "x"}},
			wantErr: ErrAmbiguous,
			errHas:  []string{"does not occur verbatim", "matches 2 times (at lines 1, 3)"},
		},
		{
			name:    "fuzzy needs a blank where oldText has one",
			file:    "ab\n",
			edits:   []Replacement{{"a b", "x"}},
			wantErr: ErrNotFound,
		},
		{
			name:    "an edit that changes nothing once whitespace is matched",
			file:    "x  y\n",
			edits:   []Replacement{{"x y", "x  y"}},
			wantErr: ErrNoChange,
			errHas:  []string{"leaves the file unchanged"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Edit([]byte(tt.file), tt.edits, DiffOptions{Path: "/w/f.go"})
			if tt.wantErr != nil {
				require.Error(t, err)
				assert.ErrorIs(t, err, tt.wantErr)
				for _, s := range tt.errHas {
					assert.Contains(t, err.Error(), s)
				}
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, string(res.Content))
			assert.Equal(t, tt.fuzzy, res.Fuzzy)
			assert.Equal(t, len(tt.edits), res.Replacements)
			assert.True(t, strings.HasPrefix(res.Diff, "--- /w/f.go\n+++ /w/f.go\n@@ "), res.Diff)
			got, err := applyDiff(tt.file, res.Diff)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got, "the diff applied to the original gives the result")
		})
	}
}

func TestEditErrorDetails(t *testing.T) {
	_, err := Edit([]byte("a\na\n"), []Replacement{{"b", "c"}, {"a", "d"}})
	var e *Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, 0, e.Edit)
	var errs []*Error
	for _, x := range err.(interface{ Unwrap() []error }).Unwrap() {
		require.ErrorAs(t, x, &e)
		errs = append(errs, e)
	}
	require.Len(t, errs, 2)
	assert.Equal(t, 1, errs[1].Edit)
	assert.Equal(t, 2, errs[1].Matches)
	assert.ErrorIs(t, errs[1], ErrAmbiguous)
}

func TestEditDiff(t *testing.T) {
	res, err := Edit([]byte(goFile), []Replacement{{"y := 2", "y := 3"}}, DiffOptions{Path: "main.go", Context: 1})
	require.NoError(t, err)
	assert.Equal(t, "--- main.go\n+++ main.go\n@@ -4,3 +4,3 @@\n \tx := 1\n-\ty := 2\n+\ty := 3\n \tfmt.Println(x + y)\n", res.Diff)

	res, err = Edit([]byte(goFile), []Replacement{{"y := 2", "y := 3"}})
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(res.Diff, "--- file\n+++ file\n@@ -2,6 +2,6 @@\n"), "default path and 3 lines of context: %s", res.Diff)

	res, err = Edit([]byte(goFile), []Replacement{{"y := 2", "y := 3"}}, DiffOptions{Context: -1})
	require.NoError(t, err)
	assert.Contains(t, res.Diff, "@@ -5 +5 @@\n-\ty := 2\n+\ty := 3\n")
}

func TestStrReplace(t *testing.T) {
	tests := []struct {
		name       string
		file       string
		old, new   string
		replaceAll bool
		want       string
		n          int
		wantErr    error
		errHas     string
	}{
		{name: "unique", file: "DEBUG=false\nPORT=1\n", old: "DEBUG=false", new: "DEBUG=true", want: "DEBUG=true\nPORT=1\n", n: 1},
		{name: "replace all", file: "old old\nold\n", old: "old", new: "new", replaceAll: true, want: "new new\nnew\n", n: 3},
		{name: "replace all in a CRLF file", file: "a\r\nb\r\na\r\n", old: "a\n", new: "x\ny\n", replaceAll: true, want: "x\r\ny\r\nb\r\nx\r\ny\r\n", n: 2},
		{name: "found 3 times", file: "old old\nold\n", old: "old", new: "new", wantErr: ErrAmbiguous,
			errHas: "old_str matches 3 times (at lines 1, 1, 2); it must match exactly once: add surrounding lines to make it unique or set replace_all"},
		{name: "overlapping occurrences are ambiguous", file: "aaa", old: "aa", new: "b", wantErr: ErrAmbiguous, errHas: "matches 2 times"},
		{name: "not found", file: "abc\n", old: "xyz", new: "q", wantErr: ErrNotFound, errHas: "old_str was not found"},
		{name: "replace all not found", file: "abc\n", old: "xyz", new: "q", replaceAll: true, wantErr: ErrNotFound, errHas: "old_str was not found"},
		{name: "empty old_str", file: "abc\n", old: "", new: "q", wantErr: ErrEmptyOld, errHas: "old_str is empty"},
		{name: "identical", file: "abc\n", old: "b", new: "b", replaceAll: true, wantErr: ErrNoChange, errHas: "old_str and new_str are identical"},
		{name: "whitespace-tolerant when unique", file: "\tcall(a,  b)\n", old: "call(a, b)", new: "call(a, c)", want: "\tcall(a, c)\n", n: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := StrReplace([]byte(tt.file), tt.old, tt.new, tt.replaceAll)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				assert.Contains(t, err.Error(), tt.errHas)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, string(res.Content))
			assert.Equal(t, tt.n, res.Replacements)
			got, err := applyDiff(tt.file, res.Diff)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

// applyDiff applies a unified diff made by UnifiedDiff to a, strictly: every
// context and removed line must match.
func applyDiff(a, diff string) (string, error) {
	if diff == "" {
		return a, nil
	}
	src := splitLinesOrEmpty(a)
	lines := splitLinesOrEmpty(diff)
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "--- ") || !strings.HasPrefix(lines[1], "+++ ") {
		return "", errors.New("missing headers")
	}
	var out []string
	pos := 0 // next source line to copy
	for i := 2; i < len(lines); {
		var a0, al, b0, bl int
		if err := parseHunkHeader(lines[i], &a0, &al, &b0, &bl); err != nil {
			return "", err
		}
		start := a0 - 1
		if al == 0 {
			start = a0
		}
		if start < pos || start > len(src) {
			return "", errors.New("hunk out of order: " + lines[i])
		}
		out = append(out, src[pos:start]...)
		pos = start
		i++
		for i < len(lines) && !strings.HasPrefix(lines[i], "@@ ") {
			l := lines[i]
			i++
			text := l[1:]
			if i < len(lines) && lines[i] == "\\ No newline at end of file\n" {
				text = strings.TrimSuffix(text, "\n")
				i++
			}
			switch l[0] {
			case ' ', '-':
				if pos >= len(src) || src[pos] != text {
					return "", errors.New("context mismatch at " + l)
				}
				if l[0] == ' ' {
					out = append(out, text)
				}
				pos++
			case '+':
				out = append(out, text)
			default:
				return "", errors.New("bad line " + l)
			}
		}
	}
	out = append(out, src[pos:]...)
	return strings.Join(out, ""), nil
}

func splitLinesOrEmpty(s string) []string {
	if s == "" {
		return nil
	}
	lines := strings.SplitAfter(s, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

func parseHunkHeader(h string, a0, al, b0, bl *int) error {
	var as, bs string
	if _, err := fmtSscanf(h, "@@ -%s +%s @@\n", &as, &bs); err != nil {
		return errors.New("bad hunk header " + h)
	}
	parse := func(s string, start, n *int) error {
		*n = 1
		if i := strings.IndexByte(s, ','); i >= 0 {
			if _, err := fmtSscanf(s[i+1:], "%d", n); err != nil {
				return err
			}
			s = s[:i]
		}
		_, err := fmtSscanf(s, "%d", start)
		return err
	}
	if err := parse(as, a0, al); err != nil {
		return err
	}
	return parse(bs, b0, bl)
}
