package fastjson

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// result is shaped like a tool result: a long content among short fields.
type result struct {
	IsError    bool   `json:"is_error"`
	Content    string `json:"content"`
	Encoding   string `json:"encoding,omitempty"`
	NextOffset int    `json:"next_offset,omitempty"`
	Other      string `json:"other,omitempty"`
	Tagged     string `json:"tagged,string,omitempty"`
	Hidden     string `json:"-"`
}

// upper has its own text encoding: Marshal must leave it to encoding/json.
type upper string

func (u upper) MarshalText() ([]byte, error) { return []byte(strings.ToUpper(string(u))), nil }

type withCodec struct {
	U upper `json:"u"`
	S string
}

func long(s string) string { return strings.Repeat(s, LongString/max(len(s), 1)+1) }

func TestMarshalAgreesWithEncodingJSON(t *testing.T) {
	for _, v := range []any{
		result{Content: long("abc\n\"<>&é\xff\u2028")},
		&result{Content: long("x"), Other: long("y\t"), Encoding: "utf-8", NextOffset: 3},
		result{Content: "short", Other: long("y")},
		result{Tagged: long("t"), Hidden: long("h")},
		withCodec{U: upper(long("u")), S: long("s")},
		map[string]string{"content": long("m")},
		long("a bare string"),
		(*result)(nil),
	} {
		for _, html := range []bool{false, true} {
			want, err := marshal(v, html)
			require.NoError(t, err)
			got, err := Marshal(v, html)
			require.NoError(t, err)
			assert.Equal(t, string(want), string(got), "%T html=%v", v, html)
			got, err = AppendMarshal([]byte("prefix"), v, html)
			require.NoError(t, err)
			assert.Equal(t, "prefix"+string(want), string(got), "%T html=%v", v, html)
		}
	}
	got, err := AppendMarshal([]byte("prefix"), map[string]any{"f": func() {}}, false)
	assert.Error(t, err)
	assert.Equal(t, "prefix", string(got), "dst as it was on an error")
}

func TestUnmarshalAgreesWithEncodingJSON(t *testing.T) {
	c := long(`abc\n\"é\u00e9\ud83d\ude00`)
	for _, in := range []string{
		`{"is_error":false,"content":"` + c + `","next_offset":3}`,
		` {"content" : "` + c + `" , "other":"` + c + `"} `,
		`{"Content":"` + c + `"}`,                          // case-folded key
		`{"content":"` + c + `","CONTENT":"short"}`,        // a later key folding to it wins
		`{"CONTENT":"short","content":"` + c + `"}`,        //
		`{"content":"` + c + `","content":"again"}`,        // a repeated key: the last
		`{"content":"` + long(`\udc80`) + `"}`,             // lone surrogates: U+FFFD
		`{"content":"` + long("bad \xff") + `"}`,           // invalid UTF-8: U+FFFD
		`{"tagged":"` + long("x") + `"}`,                   // ,string: not a plain field
		`{"content":"` + c + `","next_offset":"three"}`,    // a type error
		`{"content":"` + c + `"`,                           // a syntax error
		`{"content":"` + c + `","nested":{"content":"x"}}`, // an unknown field
		`{"unknown":"` + c + `","content":"x"}`,
	} {
		var want, got result
		wantErr := json.Unmarshal([]byte(in), &want)
		gotErr := Unmarshal([]byte(in), &got)
		assert.Equal(t, wantErr, gotErr, in[:30])
		assert.Equal(t, want, got, in[:30])
	}
}

// FuzzMarshalUnmarshal: with a fuzzed text made long, Marshal writes what
// encoding/json writes and Unmarshal of any object around it reads what
// encoding/json reads.
func FuzzMarshalUnmarshal(f *testing.F) {
	f.Add("abc\n\"<>&é\xff\u2028", `"content"`, `"other"`)
	f.Add(`x\u00e9\ud800`, `"Content"`, `"content"`)
	f.Fuzz(func(t *testing.T, s, k1, k2 string) {
		v := result{Content: long(s), Other: s, Encoding: long(s + "e")}
		for _, html := range []bool{false, true} {
			want, err := marshal(v, html)
			require.NoError(t, err)
			got, err := Marshal(v, html)
			require.NoError(t, err)
			require.Equal(t, string(want), string(got))
		}
		body := "{" + k1 + `:"` + long(s) + `",` + k2 + `:` + string(AppendString(nil, s, false)) + "}"
		var want, got result
		wantErr := json.Unmarshal([]byte(body), &want)
		gotErr := Unmarshal([]byte(body), &got)
		require.Equal(t, wantErr == nil, gotErr == nil, "%v / %v", wantErr, gotErr)
		if wantErr == nil {
			require.Equal(t, want, got)
		}
	})
}
