package fastjson

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var cases = []string{
	`{}`, `[]`, `""`, `0`, `-0`, `1.5e-3`, `-12.0E+7`, `true`, `false`, `null`, ` {"a" : [1, 2, {"b": null}] } `,
	`"` + strings.Repeat("abcdefg\\n", 40) + `"`, `"\u00e9\ud83d\ude00 é中😀"`, `"a\"b\\c\/d\be\ff\ng\rh\ti"`,
	`"12345678\"12345678"`, `"1234567\\"`,
	// invalid
	``, ` `, `{`, `}`, `[1,]`, `{"a":1,}`, `{"a" 1}`, `{a:1}`, `01`, `1.`, `.5`, `1e`, `-`, `+1`, `tru`, `nul`, `"abc`,
	`"a` + "\x01" + `b"`, `"` + strings.Repeat("x", 20) + "\x1f" + `"`, `"\x"`, `"\u12g4"`, `"\u123"`, `1 2`, `{}{}`, `[1 2]`,
	`"` + strings.Repeat("y", 30) + `\`, "\"\x7f\xff\xfe\"", `"` + strings.Repeat("z", 15) + `"` + `x`,
}

// Check agrees with encoding/json on every case.
func TestValidAgreesWithEncodingJSON(t *testing.T) {
	for _, c := range cases {
		assert.Equal(t, json.Valid([]byte(c)), Valid([]byte(c)), "%q", c)
	}
}

func FuzzValid(f *testing.F) {
	for _, c := range cases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if json.Valid(b) != Valid(b) {
			t.Fatalf("json.Valid %v, Valid %v for %q", json.Valid(b), Valid(b), b)
		}
		if Valid(b) {
			var m map[string]json.RawMessage
			want := json.Unmarshal(b, &m) == nil && m != nil // null decodes into a map as nothing
			got, err := SplitObject(b)
			if want != (err == nil) {
				t.Fatalf("json.Unmarshal into a map ok=%v, SplitObject err=%v for %q", want, err, b)
			}
			if want {
				require.Len(t, got, len(m))
				for k, v := range m {
					if string(got[k]) != string(v) {
						t.Fatalf("field %q: %q, want %q", k, got[k], v)
					}
				}
			}
		}
	})
}

func TestSplitObject(t *testing.T) {
	big := strings.Repeat("abcdefg\\n", 1<<14)
	in := `{"path": "a.txt", "content": "` + big + `", "n": 3, "o": {"x": [1]}, "path": "b.txt"}`
	f, err := SplitObject([]byte(in))
	require.NoError(t, err)
	assert.Equal(t, `"b.txt"`, string(f["path"]), "the last of a repeated key")
	assert.Equal(t, `"`+big+`"`, string(f["content"]))
	assert.Equal(t, `3`, string(f["n"]))
	assert.Equal(t, `{"x": [1]}`, string(f["o"]))

	for _, bad := range []string{`[1]`, `{"a":1} x`, `{"a":` + "\"\x01\"}", `{"a\x01":1}`} {
		_, err := SplitObject([]byte(bad))
		var e *Error
		require.ErrorAs(t, err, &e, "%q", bad)
	}
	_, err = SplitObject([]byte(`{"a": "x` + "\x02" + `"}`))
	assert.EqualError(t, err, `control character in a string (found '\x02') at offset 8`)
}

func BenchmarkValid1MiB(b *testing.B) {
	in, _ := json.Marshal(map[string]any{"path": "big.txt", "content": strings.Repeat("abcdefg\n", 1<<17)})
	lines, _ := json.Marshal(map[string]any{"path": "big.txt", "content": strings.Repeat(strings.Repeat("x", 1023)+"\n", 1024)})
	b.SetBytes(int64(len(in)))
	b.Run("fastjson-1KiB-lines", func(b *testing.B) {
		for b.Loop() {
			if !Valid(lines) {
				b.Fatal()
			}
		}
	})
	b.Run("fastjson", func(b *testing.B) {
		for b.Loop() {
			if !Valid(in) {
				b.Fatal()
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		for b.Loop() {
			if !json.Valid(in) {
				b.Fatal()
			}
		}
	})
}

// Long plain runs (past the word-at-a-time look) with a special byte at
// every offset: the vectorised search must stop where the word scan did,
// with the same verdict and error, and Unquote must undo the same escapes.
func TestLongRunsAgreeWithEncodingJSON(t *testing.T) {
	for _, special := range []string{"\x01", "\n", `\n`, `\"`, `\\`, `\u00e9`, `\ud83d\ude00`, `\q`, `\u12`, `"`, "\x1f", "é"} {
		for k := range 80 {
			for _, tail := range []string{"", strings.Repeat("y", 40), `\"` + strings.Repeat("z", 20) + `\"`} {
				doc := `"` + strings.Repeat("x", k) + special + tail + `"`
				in := []byte(doc)
				require.Equal(t, json.Valid(in), Valid(in), "%q", doc)
				if !json.Valid(in) {
					continue
				}
				var want string
				require.NoError(t, json.Unmarshal(in, &want))
				got, err := Unquote(in)
				require.NoError(t, err, "%q", doc)
				require.Equal(t, want, got, "%q", doc)
			}
		}
	}
	_, err := SplitObject([]byte(`{"a": "` + strings.Repeat("x", 100) + "\x02" + `"}`))
	assert.EqualError(t, err, `control character in a string (found '\x02') at offset 107`)
	_, err = SplitObject([]byte(`{"a": "` + strings.Repeat("x", 100)))
	assert.EqualError(t, err, `unexpected end of JSON input at offset 107`)
}

// Depth counts nested arrays and objects, not brackets inside strings, and
// checks the text as Check does.
func TestDepth(t *testing.T) {
	for text, want := range map[string]int{
		`1`: 0, `"[{"`: 0, `[]`: 1, `{}`: 1, `[1]`: 1, `[[]]`: 2, `{"a":{"b":[1,{"c":"]]]"}]}}`: 4, ` [ [ [ ] ] , 1 ] `: 3,
	} {
		d, err := Depth([]byte(text))
		require.NoError(t, err, text)
		assert.Equal(t, want, d, text)
	}
	_, err := Depth([]byte(`[[]`))
	assert.Error(t, err)
}
