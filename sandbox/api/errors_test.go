package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCodes(t *testing.T) {
	seen := map[error]string{}
	for _, c := range codes {
		require.Equal(t, c.err, Sentinel(c.code))
		other, dup := seen[c.err]
		require.False(t, dup, "codes %s and %s share a sentinel", c.code, other)
		seen[c.err] = c.code
	}
	assert.Nil(t, Sentinel(""))
	assert.Nil(t, Sentinel("from_a_newer_server"))
	assert.Same(t, fs.ErrNotExist, ErrNotFound)
}

func TestWithCode(t *testing.T) {
	base := errors.New(`no sandbox named "x" in this session`)
	err := fmt.Errorf("cleanup: %w", WithCode(CodeNoBox, base))
	assert.Equal(t, `cleanup: no sandbox named "x" in this session`, err.Error(), "the message is kept")
	assert.ErrorIs(t, err, ErrNoBox)
	assert.ErrorIs(t, err, base)
	assert.NotErrorIs(t, err, ErrNotFound)
	assert.Equal(t, CodeNoBox, CodeOf(err))

	assert.NoError(t, WithCode(CodeNoBox, nil))
	assert.Same(t, base, WithCode("", base))
	assert.Equal(t, "", CodeOf(base))
	assert.Equal(t, CodeNotFound, CodeOf(fmt.Errorf("stat: %w", fs.ErrNotExist)), "a sentinel is its code")
}

func TestToolErrorCode(t *testing.T) {
	err := ResultError("sandbox_destroy", json.RawMessage(`{"is_error":true,"error":"no sandbox named \"x\"","code":"no_box"}`))
	var te *ToolError
	require.ErrorAs(t, err, &te)
	assert.Equal(t, CodeNoBox, te.Code)
	assert.ErrorIs(t, err, ErrNoBox)
	assert.NotErrorIs(t, err, ErrNotFound)
	assert.Equal(t, CodeNoBox, CodeOf(err))

	old := ResultError("read_file", json.RawMessage(`{"is_error":true,"error":"boom"}`))
	require.ErrorAs(t, old, &te)
	assert.Equal(t, "", te.Code, "a result without a code")
	assert.NotErrorIs(t, old, ErrInternal)
}
