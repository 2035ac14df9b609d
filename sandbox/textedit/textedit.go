// Package textedit applies exact (and, failing that, whitespace-tolerant)
// text replacements to file contents and renders unified diffs of the result.
// It is pure: no I/O. Error messages are written for an LLM to act on.
//
// Matching is done on a normalized view of the file: a UTF-8 byte order mark
// is stripped and CRLF line endings are read as LF; old and new texts are
// normalized the same way. The output keeps the BOM, every untouched byte of
// the original, and writes new text with the file's dominant line ending.
package textedit

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Replacement is one edit: replace OldText, which must occur exactly once in
// the original content, with NewText.
type Replacement struct {
	OldText string `json:"oldText"`
	NewText string `json:"newText"`
}

// Result is the outcome of a successful Edit or StrReplace.
type Result struct {
	Content      []byte // the new file content (original BOM and line endings kept)
	Diff         string // unified diff from the original to Content (see DiffOptions)
	Replacements int    // number of replacements made
	Fuzzy        []int  // indexes of the edits that were matched whitespace-tolerantly
}

// DiffOptions sets the diff in a Result. Path names the file in the
// ---/+++ headers (default "file"); Context is the number of unchanged lines
// shown around each change (0 means the default, 3; negative means none).
type DiffOptions struct {
	Path    string
	Context int
}

// Error kinds; test with errors.Is. Every error returned by Edit and
// StrReplace wraps one of them (several joined when several edits fail).
var (
	ErrEmptyOld  = errors.New("old text is empty")
	ErrNotFound  = errors.New("old text not found")
	ErrAmbiguous = errors.New("old text matches more than once")
	ErrOverlap   = errors.New("edits overlap")
	ErrNoChange  = errors.New("edit changes nothing")
)

// Error is one problem with an edit request. Edit is the index of the edit
// it concerns, or -1 when it concerns the request as a whole.
type Error struct {
	Kind    error
	Edit    int
	Matches int // how many times old text matched (ErrAmbiguous), else 0
	Msg     string
}

func (e *Error) Error() string { return e.Msg }
func (e *Error) Unwrap() error { return e.Kind }

// Edit applies edits to original. Every edit is matched against the original
// content, not against the result of earlier edits, so edits must not
// overlap. Each old text must match exactly once; when it does not occur
// verbatim, a match that ignores differences in indentation, trailing
// whitespace and runs of spaces/tabs is used if it is unique (and the new
// text is re-indented to the file's indentation); its index is listed in
// Result.Fuzzy.
func Edit(original []byte, edits []Replacement, opts ...DiffOptions) (Result, error) {
	if len(edits) == 0 {
		return Result{}, &Error{Kind: ErrNoChange, Edit: -1,
			Msg: "edits is empty: give at least one {oldText, newText} pair"}
	}
	d := newDoc(original)
	var errs []error
	var spans []span
	var fuzzy []int
	for i, e := range edits {
		s, err := d.find(fmt.Sprintf("edits[%d].oldText", i), fmt.Sprintf("edits[%d].newText", i), i,
			normalize(e.OldText), normalize(e.NewText), "")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if s.fuzzy {
			fuzzy = append(fuzzy, i)
		}
		spans = append(spans, s)
	}
	if len(errs) > 0 {
		return Result{}, errors.Join(errs...)
	}
	slices.SortFunc(spans, func(a, b span) int { return a.start - b.start })
	for i := 1; i < len(spans); i++ {
		a, b := spans[i-1], spans[i]
		if b.start < a.end {
			x, y := min(a.edit, b.edit), max(a.edit, b.edit)
			return Result{}, &Error{Kind: ErrOverlap, Edit: y, Msg: fmt.Sprintf(
				"edits[%d] and edits[%d] overlap (both touch line %d): every edit is matched against the original file, "+
					"not against the result of earlier edits. Merge them into one edit, or make their oldText cover disjoint text",
				x, y, d.line(b.start))}
		}
	}
	return d.result(original, spans, fuzzy, opts)
}

// StrReplace replaces oldStr with newStr. Unless replaceAll is set, oldStr
// must match exactly once (whitespace-tolerantly, as in Edit, if it does not
// occur verbatim); with replaceAll every non-overlapping verbatim occurrence
// is replaced.
func StrReplace(original []byte, oldStr, newStr string, replaceAll bool, opts ...DiffOptions) (Result, error) {
	d := newDoc(original)
	old, repl := normalize(oldStr), normalize(newStr)
	if !replaceAll {
		s, err := d.find("old_str", "new_str", 0, old, repl, " or set replace_all")
		if err != nil {
			return Result{}, err
		}
		var fuzzy []int
		if s.fuzzy {
			fuzzy = []int{0}
		}
		return d.result(original, []span{s}, fuzzy, opts)
	}
	if err := checkTexts("old_str", "new_str", 0, old, repl); err != nil {
		return Result{}, err
	}
	var spans []span
	for off := 0; ; {
		i := strings.Index(d.norm[off:], old)
		if i < 0 {
			break
		}
		spans = append(spans, span{start: off + i, end: off + i + len(old), text: repl})
		off += i + len(old)
	}
	if len(spans) == 0 {
		return Result{}, d.notFound("old_str", 0, old)
	}
	return d.result(original, spans, nil, opts)
}

// span is a replacement of d.norm[start:end] by text.
type span struct {
	start, end int
	text       string
	edit       int
	fuzzy      bool
}

// doc is a file prepared for matching.
type doc struct {
	bom   bool
	raw   string // original without the BOM
	norm  string // raw with CRLF read as LF
	crlf  bool   // CRLF is the dominant line ending
	crPos []int  // norm index of every '\n' that was "\r\n" in raw (ascending)
	lines []int  // norm index of every line start (ascending)
	canon *canonical
}

const bom = "\uFEFF"

func newDoc(b []byte) *doc {
	d := &doc{raw: string(b)}
	if strings.HasPrefix(d.raw, bom) {
		d.bom, d.raw = true, d.raw[len(bom):]
	}
	var sb strings.Builder
	sb.Grow(len(d.raw))
	d.lines = []int{0}
	lf := 0
	for i := 0; i < len(d.raw); i++ {
		c := d.raw[i]
		if c == '\r' && i+1 < len(d.raw) && d.raw[i+1] == '\n' {
			continue
		}
		if c == '\n' {
			if i > 0 && d.raw[i-1] == '\r' {
				d.crPos = append(d.crPos, sb.Len())
			} else {
				lf++
			}
			d.lines = append(d.lines, sb.Len()+1)
		}
		sb.WriteByte(c)
	}
	d.norm = sb.String()
	d.crlf = len(d.crPos) > lf
	return d
}

// normalize reads CRLF as LF and drops a leading BOM.
func normalize(s string) string {
	return strings.ReplaceAll(strings.TrimPrefix(s, bom), "\r\n", "\n")
}

// rawPos maps an index in d.norm to the index in d.raw. An index at a '\n'
// that was "\r\n" maps to the '\r', so spans never split a CRLF.
func (d *doc) rawPos(i int) int {
	n, _ := slices.BinarySearch(d.crPos, i) // number of CRs before norm index i
	return i + n
}

// line returns the 1-based line number of norm index i.
func (d *doc) line(i int) int {
	n, found := slices.BinarySearch(d.lines, i)
	if found {
		return n + 1
	}
	return n
}

func (d *doc) lineList(pos []int) string {
	const max = 8
	var parts []string
	for i, p := range pos {
		if i == max {
			parts = append(parts, "...")
			break
		}
		parts = append(parts, fmt.Sprint(d.line(p)))
	}
	return strings.Join(parts, ", ")
}

func checkTexts(oldName, newName string, edit int, old, repl string) error {
	if old == "" {
		return &Error{Kind: ErrEmptyOld, Edit: edit, Msg: oldName + " is empty: it must quote existing text of the file. " +
			"To insert text, quote a neighbouring line in " + oldName + " and repeat it with the addition in " + newName +
			"; to create or overwrite a whole file use write_file"}
	}
	if old == repl {
		return &Error{Kind: ErrNoChange, Edit: edit, Msg: oldName + " and " + newName + " are identical, so the edit would change nothing"}
	}
	return nil
}

// find locates old in the document: exactly, else whitespace-tolerantly.
// hint ends the message of an ambiguous match.
func (d *doc) find(oldName, newName string, edit int, old, repl, hint string) (span, error) {
	if err := checkTexts(oldName, newName, edit, old, repl); err != nil {
		return span{}, err
	}
	exact := indexAll(d.norm, old)
	switch {
	case len(exact) == 1:
		return span{start: exact[0], end: exact[0] + len(old), text: repl, edit: edit}, nil
	case len(exact) > 1:
		return span{}, &Error{Kind: ErrAmbiguous, Edit: edit, Matches: len(exact), Msg: fmt.Sprintf(
			"%s matches %d times (at lines %s); it must match exactly once: add surrounding lines to make it unique%s",
			oldName, len(exact), d.lineList(exact), hint)}
	}
	if d.canon == nil {
		d.canon = canonicalize(d.norm)
	}
	cands := d.canon.find(d.norm, old)
	switch len(cands) {
	case 0:
		return span{}, d.notFound(oldName, edit, old)
	case 1:
		s := cands[0]
		atLineStart := s[0] == 0 || d.norm[s[0]-1] == '\n'
		return span{start: s[0], end: s[1], text: reindent(old, d.norm[s[0]:s[1]], repl, atLineStart), edit: edit, fuzzy: true}, nil
	}
	starts := make([]int, len(cands))
	for i, c := range cands {
		starts[i] = c[0]
	}
	return span{}, &Error{Kind: ErrAmbiguous, Edit: edit, Matches: len(cands), Msg: fmt.Sprintf(
		"%s does not occur verbatim, and ignoring whitespace differences it matches %d times (at lines %s): "+
			"copy the text exactly from the file (including indentation) and add surrounding lines to make it unique%s",
		oldName, len(cands), d.lineList(starts), hint)}
}

// notFound explains a failed match, pointing at where the first line of old
// occurs, if anywhere.
func (d *doc) notFound(oldName string, edit int, old string) error {
	msg := oldName + " was not found in the file, not even ignoring whitespace differences. " +
		"Read the file again and copy the text exactly"
	if first := firstLine(old); first != "" {
		if d.canon == nil {
			d.canon = canonicalize(d.norm)
		}
		if at := d.canon.lineMatches(first); len(at) > 0 {
			msg += fmt.Sprintf("; its first line %q occurs at line %s, so the lines after it differ from the file",
				clip(first), d.lineList(at))
		} else {
			msg += fmt.Sprintf("; even its first line %q does not occur in the file", clip(first))
		}
	}
	return &Error{Kind: ErrNotFound, Edit: edit, Msg: msg}
}

func firstLine(s string) string {
	for l := range strings.SplitSeq(s, "\n") {
		if c := canonLine(l); c != "" {
			return c
		}
	}
	return ""
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:77] + "..."
	}
	return s
}

// indexAll returns the start of every occurrence of sub in s, overlapping
// ones included.
func indexAll(s, sub string) []int {
	var at []int
	for off := 0; ; {
		i := strings.Index(s[off:], sub)
		if i < 0 {
			return at
		}
		at = append(at, off+i)
		off += i + 1
	}
}

// result builds the output from the original bytes and the sorted spans.
func (d *doc) result(original []byte, spans []span, fuzzy []int, opts []DiffOptions) (Result, error) {
	var sb strings.Builder
	sb.Grow(len(original))
	if d.bom {
		sb.WriteString(bom)
	}
	prev := 0
	for _, s := range spans {
		sb.WriteString(d.raw[prev:d.rawPos(s.start)])
		text := s.text
		if d.crlf {
			text = strings.ReplaceAll(text, "\n", "\r\n")
		}
		sb.WriteString(text)
		prev = d.rawPos(s.end)
	}
	sb.WriteString(d.raw[prev:])
	out := []byte(sb.String())
	if string(out) == string(original) {
		return Result{}, &Error{Kind: ErrNoChange, Edit: -1,
			Msg: "the edit leaves the file unchanged: new text equals the text it replaces"}
	}
	o := DiffOptions{Path: "file", Context: 3}
	if len(opts) > 0 {
		if opts[0].Path != "" {
			o.Path = opts[0].Path
		}
		switch {
		case opts[0].Context < 0:
			o.Context = 0
		case opts[0].Context > 0:
			o.Context = opts[0].Context
		}
	}
	return Result{
		Content:      out,
		Diff:         UnifiedDiff(o.Path, original, out, o.Context),
		Replacements: len(spans),
		Fuzzy:        fuzzy,
	}, nil
}
