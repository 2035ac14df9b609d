package sandbox

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/cellbox/cellbox/internal/fastjson"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// BenchmarkWriteFile1MiB is write_file of 1 MiB through the registry (no
// HTTP): the JSON handling of a large input.
func BenchmarkWriteFile1MiB(b *testing.B) {
	s := newTestService(&testing.T{}, newFakeBackend(&testing.T{}), b.TempDir(), nil)
	id, _, err := s.NewSession(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	in, _ := json.Marshal(map[string]any{"path": "big.txt", "content": strings.Repeat("abcdefg\n", 1<<17)})
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		res, err := s.CallTool(context.Background(), id, "write_file", in)
		if err != nil || !strings.Contains(string(res), `"is_error":false`) {
			b.Fatal(err, string(res))
		}
	}
}

// A long input is still checked against the schema, field by field.
func TestLongInputStillValidated(t *testing.T) {
	s := newTestService(t, newFakeBackend(t), "", nil)
	id, _, err := s.NewSession(context.Background())
	require.NoError(t, err)
	long := strings.Repeat("x", 100<<10)
	for in, want := range map[string]string{
		`{"path": "a.txt", "content": "` + long + `", "append": "yes"}`:      `append`,
		`{"path": "a.txt", "content": "` + long + `", "encoding": "utf-16"}`: `encoding`,
		`{"path": "a.txt", "content": "` + long + `"}`:                       `"is_error":false`,
	} {
		res, err := s.CallTool(context.Background(), id, "write_file", json.RawMessage(in))
		require.NoError(t, err)
		assert.Contains(t, string(res), want, in[:40])
	}
}

// BenchmarkReadFile256KiB is the last read_file window of 256 KiB of a
// 1 MiB file, through the registry (no HTTP).
func BenchmarkReadFile256KiB(b *testing.B) {
	s := newTestService(&testing.T{}, newFakeBackend(&testing.T{}), b.TempDir(), nil)
	id, _, err := s.NewSession(context.Background())
	require.NoError(b, err)
	line := strings.Repeat("x", 127) + "\n" // 2000 lines = 256 KiB, so both caps meet
	in, _ := json.Marshal(map[string]any{"path": "big.txt", "content": strings.Repeat(line, 1<<13)})
	res, err := s.CallTool(context.Background(), id, "write_file", in)
	require.NoError(b, err)
	require.Contains(b, string(res), `"is_error":false`)
	b.SetBytes(1 << 18)
	for b.Loop() {
		// The last window of a 1 MiB file.
		res, err := s.CallTool(context.Background(), id, "read_file", json.RawMessage(`{"path": "big.txt", "offset": 6001}`))
		if err != nil || !strings.Contains(string(res), `"is_error":false`) {
			b.Fatal(err, string(res[:200]))
		}
	}
}

// TestLongStringsDecodeExactly: a long string field (decoded without a
// second parse of the input) holds exactly what encoding/json would
// decode, escapes of every kind included.
func TestLongStringsDecodeExactly(t *testing.T) {
	pad := strings.Repeat("x", 5<<10) // over the skeleton's threshold
	for _, raw := range []string{
		`"` + pad + `"`,
		`"` + pad + `\n\t\r\b\f\/\\\"end"`,
		`"` + pad + `\u00e9\u4e2d\ud83d\ude00 \u0041"`,
		`"` + pad + `é中😀 raw UTF-8"`,
		`"` + strings.Repeat(`ab\n`, 3000) + strings.Repeat("y", 100) + `\"` + strings.Repeat("z", 31) + `\\` + strings.Repeat("w", 33) + `\t"`,
		`"\\` + pad + `\\"`,
	} {
		var want string
		require.NoError(t, json.Unmarshal([]byte(raw), &want))
		got, err := fastjson.Unquote([]byte(raw))
		require.NoError(t, err)
		assert.Equal(t, want, got, raw[len(raw)-40:])
	}

	s := newTestService(t, newFakeBackend(t), "", nil)
	id, _, err := s.NewSession(context.Background())
	require.NoError(t, err)
	content := pad + "\n\"quoted\" \\ back\tslash 😀 é\n"
	in, _ := json.Marshal(map[string]any{"path": "exact.txt", "content": content})
	res, err := s.CallTool(context.Background(), id, "write_file", in)
	require.NoError(t, err)
	require.Contains(t, string(res), `"is_error":false`)
	var sb strings.Builder
	_, err = s.Client(id).Download(context.Background(), "", "exact.txt", &sb)
	require.NoError(t, err)
	assert.Equal(t, content, sb.String())
}
