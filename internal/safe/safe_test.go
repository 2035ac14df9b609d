package safe

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRecover(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	err := func() (err error) {
		defer Recover(log, "a test", &err)
		panic("boom")
	}()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "internal error in a test: boom")
	assert.Contains(t, logs.String(), "boom")
	assert.Contains(t, logs.String(), "safe_test.go", "the stack is logged")

	done := make(chan struct{})
	Go(log, "a goroutine", func() {
		defer close(done)
		panic("bang")
	})
	<-done
}
