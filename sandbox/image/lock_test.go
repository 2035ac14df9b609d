package image

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two builds of one image, from two processes (here two locks of their
// own), do not run at once: the second waits for the first, and gives up
// with its context.
func TestBuildLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "build.lock")
	log := slog.New(slog.DiscardHandler)
	unlock, err := lockBuild(context.Background(), path, log, "base")
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = lockBuild(ctx, path, log, "base")
	assert.ErrorContains(t, err, "waiting for another build")

	got := make(chan error, 1)
	go func() {
		u, err := lockBuild(context.Background(), path, log, "base")
		if err == nil {
			u()
		}
		got <- err
	}()
	select {
	case <-got:
		t.Fatal("the second build did not wait for the first")
	case <-time.After(300 * time.Millisecond):
	}
	unlock()
	require.NoError(t, <-got, "it goes on once the first is done")
}
