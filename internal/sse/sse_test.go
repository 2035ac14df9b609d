package sse

import (
	"bufio"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type ev struct{ name, data string }

func readAll(t *testing.T, s string, maxLine int) ([]ev, error) {
	t.Helper()
	var got []ev
	err := Read(strings.NewReader(s), maxLine, func(e string, d []byte) error {
		got = append(got, ev{e, string(d)})
		return nil
	})
	return got, err
}

func TestRead(t *testing.T) {
	got, err := readAll(t, ": keep-alive\n\nevent: a\ndata: 1\ndata:2\nid: 7\n\ndata: {\"x\": 1}\n\nevent: end\n\ndata: last, no blank line", 1<<10)
	require.NoError(t, err)
	assert.Equal(t, []ev{{"a", "1\n2"}, {"", `{"x": 1}`}, {"end", ""}, {"", "last, no blank line"}}, got)

	_, err = readAll(t, "data: "+strings.Repeat("x", 100)+"\n\n", 64)
	assert.ErrorIs(t, err, bufio.ErrTooLong)
	assert.ErrorContains(t, err, "event stream: a line of more than", "the cap is named, not only the scanner's words")
}

func TestReadStops(t *testing.T) {
	n := 0
	err := Read(strings.NewReader("data: 1\n\ndata: 2\n\ndata: 3\n\n"), 1<<10, func(string, []byte) error {
		if n++; n == 2 {
			return Stop
		}
		return nil
	})
	assert.NoError(t, err)
	assert.Equal(t, 2, n)

	boom := errors.New("boom")
	err = Read(strings.NewReader("data: 1\n\n"), 1<<10, func(string, []byte) error { return boom })
	assert.ErrorIs(t, err, boom)
}
