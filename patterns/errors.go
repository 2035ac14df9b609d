package patterns

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
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

// list renders names as "a, b, c", capped at 12 names.
func list(names []string) string {
	if len(names) > 12 {
		return strings.Join(names[:12], ", ") + fmt.Sprintf(", … (%d more)", len(names)-12)
	}
	return strings.Join(names, ", ")
}
