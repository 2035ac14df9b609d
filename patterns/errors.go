package patterns

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// Error is one problem in a pattern: where, which field, what.
type Error struct {
	Pos  Pos
	Path string // the field: "nodes.clean.exec.command"
	Msg  string
}

// Error is "file:line: path: message".
func (e *Error) Error() string {
	var b strings.Builder
	if s := e.Pos.String(); s != "" {
		b.WriteString(s + ": ")
	}
	if e.Path != "" {
		b.WriteString(e.Path + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// ErrorList is every problem found in a pattern, in source order. Load,
// Parse and Build return one as their error; errors.As reaches it and each
// *Error in it.
type ErrorList []*Error

// Error lists the problems one per line.
func (l ErrorList) Error() string {
	s := make([]string, len(l))
	for i, e := range l {
		s[i] = e.Error()
	}
	return strings.Join(s, "\n")
}

// Unwrap returns the problems.
func (l ErrorList) Unwrap() []error {
	out := make([]error, len(l))
	for i, e := range l {
		out[i] = e
	}
	return out
}

// sort orders the list by file, line and path, dropping exact duplicates.
func (l ErrorList) sort() ErrorList {
	slices.SortStableFunc(l, func(a, b *Error) int {
		return cmp.Or(cmp.Compare(a.Pos.File, b.Pos.File), cmp.Compare(a.Pos.Line, b.Pos.Line))
	})
	return slices.CompactFunc(l, func(a, b *Error) bool { return *a == *b })
}

// errs collects problems, each placed by its field path.
type errs struct {
	list  ErrorList
	where func(path string) Pos
}

func (e *errs) add(path, format string, args ...any) {
	e.list = append(e.list, &Error{Pos: e.where(path), Path: path, Msg: fmt.Sprintf(format, args...)})
}

func (e *errs) err() error {
	if len(e.list) == 0 {
		return nil
	}
	return e.list.sort()
}

// suggest returns ` (did you mean "x"?)` for the candidate nearest to name,
// or "" when none is near enough to be a likely typo.
func suggest(name string, candidates []string) string {
	if s := nearest(name, candidates); s != "" {
		return fmt.Sprintf(" (did you mean %q?)", s)
	}
	return ""
}

// nearest returns the candidate nearest to name by edit distance (a
// case-insensitive match first), or "" when none is within a third of the
// name's length (at least 1).
func nearest(name string, candidates []string) string {
	if len(name) > 100 {
		return ""
	}
	for _, c := range candidates {
		if strings.EqualFold(c, name) && c != name {
			return c
		}
	}
	best, bestD := "", max(utf8.RuneCountInString(name)/3, 1)+1
	for _, c := range candidates {
		if d := distance(name, c); d < bestD && c != name {
			best, bestD = c, d
		}
	}
	return best
}

// distance is the edit distance between a and b in runes, counting a
// transposition of neighbours as one edit (optimal string alignment).
func distance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}

// list renders names as "a, b, c", capped at 12 names.
func list(names []string) string {
	if len(names) > 12 {
		return strings.Join(names[:12], ", ") + fmt.Sprintf(", … (%d more)", len(names)-12)
	}
	return strings.Join(names, ", ")
}
