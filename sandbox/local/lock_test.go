package local

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/backend"
)

// TestLocksPruned: the per-box lock map used to keep an entry for every box
// ever created, a leak in a long-running server. Entries now live only
// while an operation holds or waits for them.
func TestLocksPruned(t *testing.T) {
	testenv.RequireBwrap(t)
	b, err := New(Options{Root: t.TempDir(), CgroupRoot: "-"})
	require.NoError(t, err)
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("lock-%d", i)
			spec := backend.Spec{ID: id, AgentBinary: testenv.CellboxBinary(t), HostDir: t.TempDir()}
			_, err := b.Create(ctx, spec)
			assert.NoError(t, err)
			_, err = b.Inspect(ctx, id)
			assert.NoError(t, err)
			assert.NoError(t, b.Remove(ctx, id))
		}()
	}
	wg.Wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	assert.Empty(t, b.locks, "no entry outlives the operations on its box")
}
