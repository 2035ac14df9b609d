package runapi

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCutterOf(t *testing.T) {
	for q, want := range map[string]cutter{"": {}, "?max_string=0": {on: true}, "?max_string=2000": {on: true, n: 2000}, "?max_string=99999999999999999999999": {on: true, n: maxString}} {
		r, _ := http.NewRequest("GET", "/v1/patterns"+q, nil)
		got, err := cutterOf(r)
		require.NoError(t, err, q)
		assert.Equal(t, want, got, q)
	}
	for _, q := range []string{"?max_string=", "?max_string=-1", "?max_string=2k"} {
		r, _ := http.NewRequest("GET", "/v1/patterns"+q, nil)
		_, err := cutterOf(r)
		var e *Error
		require.ErrorAs(t, err, &e, q)
		assert.Equal(t, 400, e.Status)
	}
}
