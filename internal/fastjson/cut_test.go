package fastjson

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCut(t *testing.T) {
	long := strings.Repeat("x", 50)
	for _, tc := range []struct {
		name, in, want string
		cut            bool
	}{
		{"short value untouched", `"abc"`, `"abc"`, false},
		{"no long string: as written", `{"a": [1, 2.50, "abcdefgh"]}`, `{"a": [1, 2.50, "abcdefgh"]}`, false},
		{"long string cut", `"` + long + `"`, `"xxxxxxxxxx…"`, true},
		{"structure, keys and numbers kept", `{"previews": {"3000": {"url": "http://x/` + long + `"}}, "n": 12345678901234567890, "f": 1.50e3, "ok": true, "z": null, "history": [{"stdout": "` + long + `"}], "` + long + `": 1}`,
			`{"previews":{"3000":{"url":"http://x/x…"}},"n":12345678901234567890,"f":1.50e3,"ok":true,"z":null,"history":[{"stdout":"xxxxxxxxxx…"}],"` + long + `":1}`, true},
		{"escapes decoded before cutting", `"` + strings.Repeat(`\"`, 20) + `"`, `"\"\"\"\"\"\"\"\"\"\"…"`, true},
		{"escaped but short once decoded", `"\u0041\u0042\u0043\u0044"`, `"\u0041\u0042\u0043\u0044"`, false},
		{"a UTF-8 boundary", `"` + strings.Repeat("é", 20) + `"`, `"ééééé…"`, true}, // é is 2 bytes: 10 bytes hold 5
		{"a boundary mid-rune", `"x` + strings.Repeat("é", 20) + `"`, `"xéééé…"`, true},
		{"not JSON", `"` + long, `"\"xxxxxxxxx…"`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, cut := Cut([]byte(tc.in), 10)
			assert.Equal(t, tc.want, string(got))
			assert.Equal(t, tc.cut, cut)
			assert.True(t, json.Valid(got), "%s", got)
		})
	}
}

func TestCutBound(t *testing.T) {
	// A sandbox node's history: 100 commands, each with outputs cut to
	// 2000 bytes, is over the bound: its strings are cut shorter, and the
	// value keeps its shape.
	var hist []map[string]any
	for i := range 100 {
		hist = append(hist, map[string]any{"command": fmt.Sprint("cmd ", i), "stdout": strings.Repeat("o", 5000), "stderr": strings.Repeat("e", 5000), "exit_code": 0})
	}
	v, _ := json.Marshal(map[string]any{"status": "running", "previews": map[string]any{"8000": map[string]string{"url": "http://p/"}}, "history": hist})
	got, cut := Cut(v, 2000)
	require.True(t, cut)
	assert.LessOrEqual(t, len(got), cutValueBytes)
	var o struct {
		Status   string
		Previews map[string]map[string]string
		History  []map[string]any
	}
	require.NoError(t, json.Unmarshal(got, &o))
	assert.Equal(t, "running", o.Status)
	assert.Equal(t, "http://p/", o.Previews["8000"]["url"])
	require.Len(t, o.History, 100)
	assert.Equal(t, "cmd 99", o.History[99]["command"])
	assert.Equal(t, strings.Repeat("o", shortString)+"…", o.History[99]["stdout"])

	// A long array of small items keeps its first and last 50.
	arr := make([]int, 200000)
	for i := range arr {
		arr[i] = i
	}
	v, _ = json.Marshal(map[string]any{"rows": arr})
	got, cut = Cut(v, 2000)
	require.True(t, cut)
	var a struct{ Rows []any }
	require.NoError(t, json.Unmarshal(got, &a), "%.200s", got)
	require.Len(t, a.Rows, 101)
	assert.Equal(t, 0.0, a.Rows[0])
	assert.Equal(t, "… 199900 items left out …", a.Rows[50])
	assert.Equal(t, 199999.0, a.Rows[100])

	// An object of many keys cannot be cut so: the value becomes the
	// start of its text.
	m := map[string]int{}
	for i := range 50000 {
		m[fmt.Sprint("key", i)] = i
	}
	v, _ = json.Marshal(m)
	got, cut = Cut(v, 2000)
	require.True(t, cut)
	var s string
	require.NoError(t, json.Unmarshal(got, &s))
	assert.True(t, strings.HasPrefix(s, `{"key0":0,"key1":1,`), "%.100s", s)
	assert.True(t, strings.HasSuffix(s, "…"))
	assert.LessOrEqual(t, len(s), 2000+len("…"))
	assert.True(t, utf8.ValidString(s))
}

// FuzzCut: whatever the value, the answer is JSON; a value not cut is
// the value as it was, and a cut one has no string over n bytes but for
// its "…" (in UTF-8).
func FuzzCut(f *testing.F) {
	for _, s := range []string{`"abc"`, `{"a": [1, "two", {"three": "3333333333"}], "b": -1.5e10}`, `[[[["deep string here"]]]]`, `"\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\ud83d\ude00"`, `{"k\"ey": "v\\\\alue\n"}`, `null`, `[]`, `{}`, ` [ 1 , true , false , null ] `} {
		f.Add(s, 3)
	}
	f.Fuzz(func(t *testing.T, in string, n int) {
		if !json.Valid([]byte(in)) || n < 0 || n > 1000 {
			return
		}
		got, cut := Cut([]byte(in), n)
		require.True(t, json.Valid(got), "%q → %q", in, got)
		if !cut {
			assert.Equal(t, in, string(got))
			return
		}
		if !utf8.ValidString(in) { // decoding makes U+FFFD of a bad byte: longer
			return
		}
		var check func(v any)
		check = func(v any) {
			switch v := v.(type) {
			case string:
				assert.LessOrEqual(t, len(strings.TrimSuffix(v, "…")), n, "%q → %q", in, got)
			case []any:
				for _, x := range v {
					check(x)
				}
			case map[string]any:
				for _, x := range v {
					check(x)
				}
			}
		}
		var v any
		require.NoError(t, json.Unmarshal(got, &v))
		check(v)
	})
}
