// Package fastjson checks JSON text and splits a JSON object into its
// fields, the two things the tool API does to every input before it
// decodes it.
//
// Why hand-written: encoding/json checks text byte by byte through a
// state machine, about 4 ms for a megabyte here, and write_file's content
// crossed it three times (the HTTP body check, json.Unmarshal's own check,
// the split into fields) — most of a 1 MiB write_file's time. The peers
// measured (goccy/go-json) are 2–3× faster, not 20×. Here the inside of a
// string — nearly all of a large input — is scanned only for the bytes
// that matter there (a quote, a backslash, a control character), with
// bytes.IndexByte and words of eight bytes (scan.go); everything else
// follows RFC 8259's grammar exactly, and a fuzz test holds Valid to
// encoding/json's json.Valid.
package fastjson

import (
	"encoding/json"
	"fmt"
)

// Error is a syntax error at byte Offset of the text.
type Error struct {
	Offset int
	Msg    string
}

func (e *Error) Error() string { return fmt.Sprintf("%s at offset %d", e.Msg, e.Offset) }

// Valid reports whether b is one JSON value (with optional whitespace
// around it), as encoding/json's json.Valid does.
func Valid(b []byte) bool { return Check(b) == nil }

// Check returns nil if b is one JSON value, else an *Error saying where
// it breaks.
func Check(b []byte) error {
	_, err := Depth(b)
	return err
}

// Depth checks b as Check does and returns how deeply it nests arrays and
// objects: 0 for a scalar, 1 for [1] or {}, 2 for [[]].
func Depth(b []byte) (int, error) {
	p := parser{b: b}
	p.ws()
	if err := p.value(0); err != nil {
		return 0, err
	}
	p.ws()
	if p.i != len(b) {
		return 0, p.fail("invalid character after the top-level value")
	}
	return p.most, nil
}

// SplitObject checks that b is one JSON object and returns its fields:
// each value's text, a subslice of b (not a copy). A key given twice keeps
// its last value, as json.Unmarshal into a map does.
func SplitObject(b []byte) (map[string]json.RawMessage, error) {
	fields := map[string]json.RawMessage{}
	err := walkObject(b, func(key []byte, vs, ve int) error {
		var k string
		if err := json.Unmarshal(key, &k); err != nil { // a key is short; unquote it exactly
			return &Error{Offset: ve, Msg: "bad object key"}
		}
		fields[k] = json.RawMessage(b[vs:ve])
		return nil
	})
	if err != nil {
		return nil, err
	}
	return fields, nil
}

// maxDepth bounds nesting, as encoding/json's 10,000.
const maxDepth = 10000

type parser struct {
	b    []byte
	i    int
	most int // the deepest array or object seen (Depth)
}

func (p *parser) fail(msg string) error {
	if p.i >= len(p.b) {
		return &Error{Offset: len(p.b), Msg: "unexpected end of JSON input"}
	}
	return &Error{Offset: p.i, Msg: fmt.Sprintf("%s (found %q)", msg, p.b[p.i])}
}

func (p *parser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *parser) value(depth int) error {
	if depth > maxDepth {
		return p.fail("exceeded max depth")
	}
	if p.i >= len(p.b) {
		return p.fail("want a value")
	}
	switch c := p.b[p.i]; {
	case c == '"':
		return p.str()
	case c == '{':
		p.most = max(p.most, depth+1)
		return p.object(depth, nil)
	case c == '[':
		p.most = max(p.most, depth+1)
		p.i++
		p.ws()
		if p.i < len(p.b) && p.b[p.i] == ']' {
			p.i++
			return nil
		}
		for {
			p.ws()
			if err := p.value(depth + 1); err != nil {
				return err
			}
			p.ws()
			if p.i < len(p.b) && p.b[p.i] == ',' {
				p.i++
				continue
			}
			if p.i < len(p.b) && p.b[p.i] == ']' {
				p.i++
				return nil
			}
			return p.fail("want ',' or ']' in an array")
		}
	case c == 't':
		return p.lit("true")
	case c == 'f':
		return p.lit("false")
	case c == 'n':
		return p.lit("null")
	case c == '-' || c >= '0' && c <= '9':
		return p.num()
	}
	return p.fail("want a value")
}

// object reads an object starting at its '{', calling field (if set) with
// each key's and value's text.
func (p *parser) object(depth int, field func(key, value []byte) error) error {
	p.i++
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == '}' {
		p.i++
		return nil
	}
	for {
		p.ws()
		ks := p.i
		if err := p.str(); err != nil {
			return err
		}
		ke := p.i
		p.ws()
		if p.i >= len(p.b) || p.b[p.i] != ':' {
			return p.fail("want ':' after an object key")
		}
		p.i++
		p.ws()
		vs := p.i
		if err := p.value(depth + 1); err != nil {
			return err
		}
		if field != nil {
			if err := field(p.b[ks:ke], p.b[vs:p.i]); err != nil {
				return err
			}
		}
		p.ws()
		if p.i < len(p.b) && p.b[p.i] == ',' {
			p.i++
			continue
		}
		if p.i < len(p.b) && p.b[p.i] == '}' {
			p.i++
			return nil
		}
		return p.fail("want ',' or '}' in an object")
	}
}

func (p *parser) lit(word string) error {
	if len(p.b)-p.i < len(word) || string(p.b[p.i:p.i+len(word)]) != word {
		return p.fail("invalid literal")
	}
	p.i += len(word)
	return nil
}

// num reads -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (p *parser) num() error {
	b := p.b
	if b[p.i] == '-' {
		p.i++
	}
	digits := func() int {
		n := 0
		for p.i < len(b) && b[p.i] >= '0' && b[p.i] <= '9' {
			p.i++
			n++
		}
		return n
	}
	switch {
	case p.i < len(b) && b[p.i] == '0':
		p.i++
	case p.i < len(b) && b[p.i] >= '1' && b[p.i] <= '9':
		digits()
	default:
		return p.fail("bad number")
	}
	if p.i < len(b) && b[p.i] == '.' {
		p.i++
		if digits() == 0 {
			return p.fail("bad number: want digits after '.'")
		}
	}
	if p.i < len(b) && (b[p.i] == 'e' || b[p.i] == 'E') {
		p.i++
		if p.i < len(b) && (b[p.i] == '+' || b[p.i] == '-') {
			p.i++
		}
		if digits() == 0 {
			return p.fail("bad number: want digits in the exponent")
		}
	}
	return nil
}

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// special marks, for 8 bytes (little-endian), the ones that are a quote,
// a backslash or a control character (< 0x20): the bytes a string's
// inside must be checked for. Each test sets a byte's high bit for a byte
// it matches (the "has zero byte" trick on w^c, and "has byte less than
// n" for n = 0x20); bytes >= 0x80 are masked out, as UTF-8 bytes are none
// of the three. A borrow can also mark a byte above a true match, never
// below one, so the lowest mark is exact: 0 means none of the eight.
func special(w uint64) uint64 {
	q := w ^ (lsb * '"')
	s := w ^ (lsb * '\\')
	hit := ((q - lsb) &^ q) | ((s - lsb) &^ s) | (w - lsb*0x20)
	return hit &^ w & msb
}

// str reads a string starting at its opening quote: no raw control
// characters, only JSON's escapes. It does not check UTF-8 (json.Valid
// does not either).
func (p *parser) str() error {
	b := p.b
	if p.i >= len(b) || b[p.i] != '"' {
		return p.fail("want a string")
	}
	p.i++
	next := [2]int{-1, -1} // see runEnd
	for {
		p.i = runEnd(b, p.i, `"\`, false, next[:])
		if p.i >= len(b) {
			return p.fail("unterminated string")
		}
		switch c := b[p.i]; {
		case c == '"':
			p.i++
			return nil
		case c == '\\':
			if p.i+1 >= len(b) {
				return p.fail("unterminated string")
			}
			switch b[p.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				p.i += 2
			case 'u':
				if _, n := hex4(b[p.i+2:]); n == 0 {
					p.i++
					return p.fail(`bad \u escape`)
				}
				p.i += 6
			default:
				p.i++
				return p.fail("bad escape")
			}
		default:
			return p.fail("control character in a string")
		}
	}
}
