package fastjson

// Cut shortens a JSON value for display, keeping its shape: a page that
// lists a pattern's cells, some of tens of MiB (a sandbox node's files and
// history), wants each one's keys and structure but not all its text. It
// walks the value's bytes rather than decoding it, so numbers and key
// order come out exactly as written, in one pass (two 40 MB values in
// about 30 ms).

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cellbox/cellbox/internal/textcut"
)

// Bounds of Cut.
const (
	// cutValueBytes bounds a cut value as a whole (or 4×n, if that is
	// larger): a value still over it once its strings are cut has its
	// strings cut to shortString, then its long arrays cut to their first
	// and last keepItems/2 items, and if still over, it is replaced by the
	// start of its text, as a string.
	cutValueBytes = 256 << 10
	shortString   = 100
	keepItems     = 100
	// cutMark ends a cut string.
	cutMark = "…"
)

// Cut returns the JSON value v with every string longer than n bytes
// (keys aside) cut to n bytes, at a UTF-8 boundary, and "…" added, and
// whether it cut anything. Objects, arrays and numbers are kept as they
// are (whitespace is dropped). A value still larger than 256 KiB (or 4n,
// if larger) then has its strings cut to 100 bytes (n if smaller), and if
// still over, its arrays of more than 100 items cut to their first and
// last 50 with a string "… K items left out …" between; a value still
// over, or one that is not JSON, becomes a string: the start of its text,
// cut to n bytes. A value of at most n bytes is returned as it is.
func Cut(v []byte, n int) ([]byte, bool) {
	if len(v) <= n {
		return v, false
	}
	limit := max(cutValueBytes, 4*n)
	short := min(n, shortString)
	type stage struct{ n, items int }
	stages := []stage{{n, 0}, {short, 0}, {short, keepItems}}
	var text []byte // the start of the value's text, for the string preview
	for i, st := range stages {
		if i > 0 && st == stages[i-1] {
			continue
		}
		c := clipper{n: st.n, items: st.items, limit: limit}
		end, err := c.value(v, skipWS(v, 0))
		if err == nil && skipWS(v, end) != len(v) {
			err = errSyntax
		}
		if err == nil && len(c.out) > limit {
			err = errTooBig
		}
		if err == nil && !c.cut && i == 0 {
			return v, false
		}
		if err == nil && !Valid(c.out) { // v was not JSON after all
			err = errSyntax
		}
		if err == nil {
			return c.out, true
		}
		if err != errTooBig {
			text = v
			break
		}
		text = c.out
	}
	return AppendString(nil, string(textcut.Prefix(text, n))+cutMark, false), true
}

var (
	errTooBig = errors.New("the value is over the bound")
	errSyntax = errors.New("not JSON")
)

// clipper copies a JSON value, cutting strings longer than n bytes and
// (items > 0) arrays of more than items items, and gives up (errTooBig)
// once its output is over limit. The input is a stored value, JSON
// already; what is not is reported as errSyntax where it is noticed.
type clipper struct {
	n, items, limit int
	out             []byte
	cut             bool
}

func (c *clipper) value(b []byte, i int) (int, error) {
	if len(c.out) > c.limit {
		return 0, errTooBig
	}
	if i >= len(b) {
		return 0, errSyntax
	}
	switch b[i] {
	case '"':
		return c.str(b, i)
	case '{':
		return c.object(b, i)
	case '[':
		return c.array(b, i)
	}
	j := scalarEnd(b, i) // a number, true, false or null: as written
	if j == i {
		return 0, errSyntax
	}
	c.out = append(c.out, b[i:j]...)
	return j, nil
}

func (c *clipper) str(b []byte, i int) (int, error) {
	end, esc := stringEnd(b, i)
	if end < 0 {
		return 0, errSyntax
	}
	raw := b[i+1 : end-1]
	if len(raw) <= c.n { // unescaped, a string is no longer than it is written
		c.out = append(c.out, b[i:end]...)
		return end, nil
	}
	if !esc {
		c.cut = true
		c.out = append(c.out, '"')
		c.out = append(c.out, textcut.Prefix(raw, c.n)...)
		c.out = append(c.out, cutMark+`"`...)
		return end, nil
	}
	s, err := Unquote(b[i:end])
	if err != nil {
		var v string
		if json.Unmarshal(b[i:end], &v) != nil {
			return 0, errSyntax
		}
		s = v
	}
	if len(s) <= c.n {
		c.out = append(c.out, b[i:end]...)
		return end, nil
	}
	c.cut = true
	c.out = AppendString(c.out, textcut.Prefix(s, c.n)+cutMark, false)
	return end, nil
}

func (c *clipper) object(b []byte, i int) (int, error) {
	c.out = append(c.out, '{')
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		c.out = append(c.out, '}')
		return i + 1, nil
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return 0, errSyntax
		}
		end, _ := stringEnd(b, i)
		if end < 0 {
			return 0, errSyntax
		}
		c.out = append(c.out, b[i:end]...) // keys are kept whole: cut ones could collide
		i = skipWS(b, end)
		if i >= len(b) || b[i] != ':' {
			return 0, errSyntax
		}
		c.out = append(c.out, ':')
		var err error
		if i, err = c.value(b, skipWS(b, i+1)); err != nil {
			return 0, err
		}
		var done bool
		if i, done, err = c.next(b, i, '}'); err != nil || done {
			return i, err
		}
	}
}

// next reads what follows an item of an object or array (close: '}' or
// ']') and copies it: a comma (then i is where the next item starts) or
// the end (done; i is the index after it).
func (c *clipper) next(b []byte, i int, close byte) (_ int, done bool, _ error) {
	i = skipWS(b, i)
	switch {
	case i < len(b) && b[i] == ',':
		c.out = append(c.out, ',')
		return skipWS(b, i+1), false, nil
	case i < len(b) && b[i] == close:
		c.out = append(c.out, close)
		return i + 1, true, nil
	}
	return 0, false, errSyntax
}

func (c *clipper) array(b []byte, i int) (int, error) {
	c.out = append(c.out, '[')
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		c.out = append(c.out, ']')
		return i + 1, nil
	}
	if c.items > 0 {
		starts, end, err := items(b, i)
		if err != nil {
			return 0, err
		}
		if len(starts) > c.items {
			c.cut = true
			head := c.items / 2
			tail := len(starts) - (c.items - head)
			for _, s := range starts[:head] {
				if _, err := c.value(b, s); err != nil {
					return 0, err
				}
				c.out = append(c.out, ',')
			}
			c.out = fmt.Appendf(c.out, `"… %d items left out …"`, tail-head)
			for _, s := range starts[tail:] {
				c.out = append(c.out, ',')
				if _, err := c.value(b, s); err != nil {
					return 0, err
				}
			}
			c.out = append(c.out, ']')
			return end, nil
		}
	}
	for {
		var err error
		if i, err = c.value(b, i); err != nil {
			return 0, err
		}
		var done bool
		if i, done, err = c.next(b, i, ']'); err != nil || done {
			return i, err
		}
	}
}

// items returns where each item of the array whose first item is at i
// starts, and the index after the array.
func items(b []byte, i int) ([]int, int, error) {
	var starts []int
	for {
		starts = append(starts, i)
		j, err := skipValue(b, i)
		if err != nil {
			return nil, 0, err
		}
		j = skipWS(b, j)
		switch {
		case j < len(b) && b[j] == ',':
			i = skipWS(b, j+1)
		case j < len(b) && b[j] == ']':
			return starts, j + 1, nil
		default:
			return nil, 0, errSyntax
		}
	}
}

// skipValue returns the index after the value at i.
func skipValue(b []byte, i int) (int, error) {
	depth := 0
	for i < len(b) {
		switch ch := b[i]; {
		case ch == '"':
			end, _ := stringEnd(b, i)
			if end < 0 {
				return 0, errSyntax
			}
			i = end
		case ch == '{' || ch == '[':
			depth++
			i++
		case ch == '}' || ch == ']':
			if depth == 0 {
				return 0, errSyntax
			}
			depth--
			i++
		case depth == 0:
			j := scalarEnd(b, i)
			if j == i {
				return 0, errSyntax
			}
			return j, nil
		default:
			i++
		}
		if depth == 0 {
			return i, nil
		}
	}
	return 0, errSyntax
}

// stringEnd returns the index after the JSON string that starts at i (-1
// if it does not end), and whether it holds an escape.
func stringEnd(b []byte, i int) (int, bool) {
	for j := i + 1; ; {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return -1, false
		}
		q := j + k
		bs := 0
		for p := q - 1; p > i && b[p] == '\\'; p-- {
			bs++
		}
		if bs%2 == 0 {
			return q + 1, bs > 0 || bytes.IndexByte(b[i+1:q], '\\') >= 0
		}
		j = q + 1
	}
}

// scalarEnd returns the index after the number or literal at i.
func scalarEnd(b []byte, i int) int {
	j := i
	for j < len(b) {
		switch b[j] {
		case ',', ']', '}', ' ', '\t', '\n', '\r', '"', '[', '{', ':':
			return j
		}
		j++
	}
	return j
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
