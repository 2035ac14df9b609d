package fastjson

import (
	"bytes"
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Why hand-written: a tool result or input is mostly one long string (a
// file's content), and encoding/json quotes and unquotes it a byte at a
// time (about 1 ms a megabyte each way here, after a separate validity
// scan on the way in). These skip the plain runs, which are nearly all of
// a text, with bytes.IndexByte and words of eight bytes (scan.go), and
// copy them whole. Fuzz tests hold both to encoding/json's output.

// ErrLoneSurrogate is Unquote's error for a \ud800-\udfff escape that is
// not half of a pair (encoding/json turns it into U+FFFD).
var ErrLoneSurrogate = errors.New("a string holds a lone surrogate escape")

// Unquote is the string a JSON string value holds. v must have passed
// Check (SplitObject does that), so this only unescapes, in one pass. It
// copies invalid UTF-8 as it is and refuses a lone surrogate escape
// (ErrLoneSurrogate), where encoding/json writes U+FFFD for both: callers
// that need encoding/json's exact result check utf8.Valid first and fall
// back on that error.
func Unquote(v []byte) (string, error) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", errors.New("not a JSON string")
	}
	v = v[1 : len(v)-1]
	var out strings.Builder // Unescaping only shrinks: one allocation of len(v) holds it.
	out.Grow(len(v))
	for i := 0; i < len(v); {
		j := backslash(v, i)
		out.Write(v[i:j])
		if i = j; i >= len(v) {
			break
		}
		if i+1 >= len(v) {
			return "", errors.New("a string ends in a lone backslash")
		}
		i++
		switch c := v[i]; c {
		case '"', '\\', '/':
			out.WriteByte(c)
		case 'b':
			out.WriteByte('\b')
		case 'f':
			out.WriteByte('\f')
		case 'n':
			out.WriteByte('\n')
		case 'r':
			out.WriteByte('\r')
		case 't':
			out.WriteByte('\t')
		case 'u':
			r, n := hex4(v[i+1:])
			if n == 0 {
				return "", errors.New(`a string holds a bad \u escape`)
			}
			i += n
			if utf16.IsSurrogate(r) {
				r2, n2 := rune(-1), 0
				if r < 0xdc00 && i+2 < len(v) && v[i+1] == '\\' && v[i+2] == 'u' {
					r2, n2 = hex4(v[i+3:])
				}
				if n2 == 0 || r2 < 0xdc00 || r2 >= 0xe000 {
					return "", ErrLoneSurrogate
				}
				r = utf16.DecodeRune(r, r2)
				i += 2 + n2
			}
			out.WriteRune(r) // at most 4 bytes for 6 or 12 read
		default:
			return "", fmt.Errorf("a string holds a bad escape \\%c", c)
		}
		i++
	}
	return out.String(), nil
}

// backslash is the index of the next backslash of v at or after i, or
// len(v). As runEnd: the next 16 bytes a word at a time (escapes
// close together), then bytes.IndexByte (vectorised) for a long run.
func backslash(v []byte, i int) int {
	for n := 0; n < 2 && i+8 <= len(v); n++ {
		// special marks quotes and control characters too: a checked
		// string has none, and the loop below steps over them anyway.
		if m := special(load8(v, i)); m != 0 {
			i += bits.TrailingZeros64(m) / 8
			for i < len(v) && v[i] != '\\' {
				i++
			}
			return i
		}
		i += 8
	}
	if j := bytes.IndexByte(v[i:], '\\'); j >= 0 {
		return i + j
	}
	return len(v)
}

// hex4 reads the four hex digits of a \u escape: the rune and 4, or 0, 0.
func hex4(b []byte) (rune, int) {
	if len(b) < 4 {
		return 0, 0
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, 0
		}
		r = r<<4 | rune(c)
	}
	return r, 4
}

// AppendString appends s as a JSON string, exactly as encoding/json writes
// it (escapeHTML as json.Marshal, false as an Encoder with
// SetEscapeHTML(false)): \n \r \t \b \f \" \\ escaped, other control
// characters as \u00XX, invalid UTF-8 as \ufffd, U+2028 and U+2029
// escaped.
func AppendString(dst []byte, s string, escapeHTML bool) []byte {
	dst = append(dst, '"')
	start := 0
	// Skip plain ASCII: stop at a byte that is special (quote, backslash,
	// control), non-ASCII or, with escapeHTML, one of <>&.
	stops := `"\`
	if escapeHTML {
		stops = `"\<>&`
	}
	next := [5]int{-1, -1, -1, -1, -1} // see runEnd
	for i := 0; i < len(s); {
		i = runEnd(s, i, stops, true, next[:len(stops)])
		if i >= len(s) {
			break
		}
		b := s[i]
		if b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && !(escapeHTML && (b == '<' || b == '>' || b == '&')) {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default: // other control characters, and <>& with escapeHTML
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case c == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case c == '\u2028' || c == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[c&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

const hexDigits = "0123456789abcdef"

// html marks, like special, the bytes of w that are <, > or & (ASCII
// bytes only; the caller stops at a non-ASCII byte anyway).
func html(w uint64) uint64 {
	lt := w ^ (lsb * '<')
	gt := w ^ (lsb * '>')
	amp := w ^ (lsb * '&')
	hit := ((lt - lsb) &^ lt) | ((gt - lsb) &^ gt) | ((amp - lsb) &^ amp)
	return hit &^ w & msb
}
