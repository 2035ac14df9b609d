package runtime

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// encodeScalar's shortcut writes exactly what the encoder writes, on the
// values where the two could differ (exponent bounds, negative zero, the
// largest ints), and leaves the rest to the encoder.
func TestEncodeScalarMatchesEncoder(t *testing.T) {
	vals := []any{nil, true, false, 0, -1, 42, math.MaxInt64, math.MinInt64, int64(-7),
		0.0, math.Copysign(0, -1), 1.5, -2.25, 1e-6, 9.99e-7, 1e20, 1e21, 123456789.125, 0.1 + 0.2, 3.0, -1e-300,
		-12345.0, float64(1 << 52), float64(1<<53 - 1), float64(1 << 53), float64(1<<53 + 2), 1e18, -1e18}
	for _, v := range vals {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		require.NoError(t, enc.Encode(v))
		want := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
		got, err := encode(v)
		require.NoError(t, err)
		assert.Equal(t, string(want), string(got), "%#v", v)
		if a, ok := appendScalar([]byte("x"), v); ok { // what computes write into the batch's buffer
			assert.Equal(t, "x"+string(want), string(a), "%#v", v)
		}
	}
	for _, v := range []any{"s", 1e21, 1e-7, []any{1}, map[string]any{"a": 1}} {
		_, ok := encodeScalar(v)
		assert.False(t, ok, "%#v takes the encoder", v)
	}
	_, err := encode(math.NaN())
	assert.Error(t, err, "NaN is no JSON")
}

// decodedAs only keeps a compute's output as its decoded form where a
// reader would decode the same value from the stored JSON.
func TestDecodedAsAgreesWithDecode(t *testing.T) {
	for _, out := range []any{nil, true, false, 0, 7, -300, math.MaxInt64, 2.5, 3.0, int64(4), "s", []any{1.0}, map[string]any{"a": 1.0},
		0.0, math.Copysign(0, -1), -12345.0, 0.1 + 0.2, 1e-7, 1e20, 1e21, 1e18, float64(1 << 53), float64(1<<53 - 1), -1e300, 123456789.125} {
		raw, err := encode(out)
		require.NoError(t, err)
		v := decodedAs(raw, out)
		assert.Equal(t, decode(raw), v.get(), "%#v", out)
	}
}
