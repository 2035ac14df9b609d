package sandboxclient

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/api"
)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func okResult() *http.Response {
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(`{"is_error":false}`))}
}

// An input encoded into a kept buffer can be sent again (GetBody: the
// transport does, on a keep-alive connection the server had closed), and
// the buffer is not handed back while a body of it may still be read,
// though the first body was closed and other calls encode meanwhile.
func TestInputBodyCanBeSentAgain(t *testing.T) {
	var first, again []byte
	c := New("http://cellbox.invalid", "s", "")
	c.hc = &http.Client{Transport: roundTripFunc(func(req *http.Request) (*http.Response, error) {
		first, _ = io.ReadAll(req.Body)
		req.Body.Close()
		require.NotNil(t, req.GetBody, "the body can be made again")
		b, err := req.GetBody()
		require.NoError(t, err)
		for range 3 { // other calls' inputs, in kept buffers too
			k, err := encodeInput(api.WriteFileInput{Path: "other", Content: strings.Repeat("y", 10<<10)})
			require.NoError(t, err)
			k.release()
		}
		again, _ = io.ReadAll(b)
		b.Close()
		return okResult(), nil
	})}
	_, err := c.Tool(context.Background(), "write_file", api.WriteFileInput{Path: "f.txt", Content: strings.Repeat("x", 10<<10)})
	require.NoError(t, err)
	assert.Contains(t, string(first), `"path":"f.txt"`)
	assert.Equal(t, string(first), string(again))
}

// JSON the caller gives is sent as it is and never taken into the kept
// buffers (a later call would write over the caller's bytes).
func TestCallerJSONNotKept(t *testing.T) {
	raw := json.RawMessage(`{"path":"mine.txt","content":"my own bytes"}`)
	want := string(raw)
	c := New("http://cellbox.invalid", "s", "")
	c.hc = &http.Client{Transport: roundTripFunc(func(req *http.Request) (*http.Response, error) {
		io.Copy(io.Discard, req.Body)
		req.Body.Close()
		return okResult(), nil
	})}
	_, err := c.Tool(context.Background(), "write_file", raw)
	require.NoError(t, err)
	for range 3 {
		k, err := encodeInput(api.ReadFileInput{Path: "o"}) // fits in the caller's array

		require.NoError(t, err)
		k.release()
	}
	assert.Equal(t, want, string(raw))
}
