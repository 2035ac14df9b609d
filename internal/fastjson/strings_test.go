package fastjson

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var texts = []string{
	"", "plain", "a\"b\\c/d\be\ff\ng\rh\ti\x00\x01\x1f\x7f", "<a href='x'>&amp;</a>",
	"é中😀 \u2028 \u2029 x", "bad \xff\xfe utf-8 \xc3", "cut rune \xe4\xb8",
	strings.Repeat("abcdefg\n", 40) + "\"" + strings.Repeat("12345678", 3) + "<\\>",
	strings.Repeat("x", 1023) + "\n", "1234567\"", "12345678\x1f", "\u00e9\u00e9\u00e9\u00e9\u00e9",
}

// encodingJSON is the string as encoding/json writes it.
func encodingJSON(s string, escapeHTML bool) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(escapeHTML)
	enc.Encode(s)
	return strings.TrimSuffix(b.String(), "\n")
}

func TestAppendStringAgreesWithEncodingJSON(t *testing.T) {
	for _, s := range texts {
		for _, html := range []bool{false, true} {
			assert.Equal(t, encodingJSON(s, html), string(AppendString(nil, s, html)), "%q html=%v", s, html)
		}
	}
}

func FuzzAppendString(f *testing.F) {
	for _, s := range texts {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, html := range []bool{false, true} {
			if want, got := encodingJSON(s, html), string(AppendString([]byte("x"), s, html)[1:]); want != got {
				t.Fatalf("html=%v: %q, encoding/json %q", html, got, want)
			}
		}
	})
}

var quoted = []string{
	`""`, `"plain"`, `"\n\t\r\b\f\/\\\"end"`, `"\u00e9\u4e2d\ud83d\ude00 \u0041"`, `"é中😀 raw UTF-8"`,
	`"` + strings.Repeat(`ab\n`, 3000) + strings.Repeat("y", 100) + `\"` + strings.Repeat("z", 31) + `\\` + strings.Repeat("w", 33) + `\t"`,
	`"\\` + strings.Repeat("x", 5000) + `\\"`, `"12345678\\"`, `"\uDBFF\uDFFF"`,
}

func TestUnquoteAgreesWithEncodingJSON(t *testing.T) {
	for _, q := range quoted {
		var want string
		require.NoError(t, json.Unmarshal([]byte(q), &want))
		got, err := Unquote([]byte(q))
		require.NoError(t, err, q)
		assert.Equal(t, want, got, q)
	}
	for _, lone := range []string{`"\ud800"`, `"\udc80x"`, `"\ud800\u0041"`, `"\ud83dx\ude00"`} {
		_, err := Unquote([]byte(lone))
		assert.ErrorIs(t, err, ErrLoneSurrogate, lone)
	}
}

// FuzzUnquote: for a valid JSON string of valid UTF-8, Unquote gives what
// json.Unmarshal gives, or ErrLoneSurrogate where that writes U+FFFD.
func FuzzUnquote(f *testing.F) {
	for _, q := range quoted {
		f.Add([]byte(q))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		// A value's exact text, as SplitObject gives it (no whitespace around).
		if !Valid(b) || len(b) < 2 || b[0] != '"' || b[len(b)-1] != '"' || !utf8.Valid(b) {
			return
		}
		var want string
		require.NoError(t, json.Unmarshal(b, &want))
		got, err := Unquote(b)
		if err == ErrLoneSurrogate {
			require.Contains(t, want, "\uFFFD")
			return
		}
		require.NoError(t, err)
		require.Equal(t, want, got)
	})
}

func BenchmarkAppendString1MiB(b *testing.B) {
	s := strings.Repeat(strings.Repeat("x", 1023)+"\n", 1024)
	b.SetBytes(int64(len(s)))
	buf := make([]byte, 0, 2<<20)
	for b.Loop() {
		buf = AppendString(buf[:0], s, false)
	}
}

func BenchmarkEncodingJSONString1MiB(b *testing.B) {
	s := strings.Repeat(strings.Repeat("x", 1023)+"\n", 1024)
	b.SetBytes(int64(len(s)))
	for b.Loop() {
		json.Marshal(s)
	}
}

func BenchmarkUnquote1MiB(b *testing.B) {
	q := AppendString(nil, strings.Repeat(strings.Repeat("x", 1023)+"\n", 1024), false)
	b.SetBytes(int64(len(q)))
	for b.Loop() {
		Unquote(q)
	}
}

func BenchmarkUnquoteShortLines1MiB(b *testing.B) {
	q := AppendString(nil, strings.Repeat(strings.Repeat("x", 39)+"\n", 1<<15), false)
	b.SetBytes(int64(len(q)))
	for b.Loop() {
		Unquote(q)
	}
}

// AppendString over long plain runs with a byte to escape at every offset
// writes what encoding/json writes.
func TestAppendStringLongRuns(t *testing.T) {
	for _, special := range []string{"\x01", "\n", `"`, `\`, "<", ">", "&", "é", "\u2028", "\xff", "中"} {
		for k := range 80 {
			for _, tail := range []string{"", strings.Repeat("y", 40), `"` + strings.Repeat("z", 20) + `<&\`} {
				s := strings.Repeat("x", k) + special + tail
				want, err := json.Marshal(s)
				require.NoError(t, err)
				require.Equal(t, string(want), string(AppendString(nil, s, true)), "%q", s)
				var b bytes.Buffer
				enc := json.NewEncoder(&b)
				enc.SetEscapeHTML(false)
				require.NoError(t, enc.Encode(s))
				require.Equal(t, strings.TrimSuffix(b.String(), "\n"), string(AppendString(nil, s, false)), "%q", s)
			}
		}
	}
}
