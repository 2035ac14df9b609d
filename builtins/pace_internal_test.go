package builtins

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/api"
)

// A box rewriting a bound output file in a loop: the runner reads a share
// of the versions, not each one, and always the last.
func TestPacedReadsBurst(t *testing.T) {
	const out = "/workspace/out.txt"
	var (
		content atomic.Int64 // the file's version in the "box"
		mu      sync.Mutex
		reads   int
		seen    int64
	)
	read := func(_ context.Context, paths []string) {
		assert.Equal(t, []string{out}, paths)
		v := content.Load()
		time.Sleep(5 * time.Millisecond) // a read and a store commit
		mu.Lock()
		reads++
		seen = v
		mu.Unlock()
	}
	ch := make(chan []api.WatchEvent)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		pacedReads(ctx, ch, []string{out}, readPace, read)
	}()
	const versions = 100
	for i := 1; i <= versions; i++ {
		content.Store(int64(i))
		// Each version reported, with a file that is no output.
		ch <- []api.WatchEvent{{Path: out}, {Path: "/workspace/.out.txt.cellbox-1"}}
		time.Sleep(time.Millisecond)
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return seen == versions
	}, 5*time.Second, time.Millisecond, "the last version is read")
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	// Unpaced, every report is a read: 100. Paced, a read of 5 ms costs
	// 25 ms of budget: after the first 100 ms of burst, about one read per
	// 25 ms of the ~150 ms the versions take.
	assert.Less(t, reads, versions/3, "reads of %d versions", versions)
	assert.GreaterOrEqual(t, reads, 2)
}

// A change after a quiet spell is read at once, and files that are no
// outputs are never read.
func TestPacedReadsQuiet(t *testing.T) {
	const out = "/workspace/out.txt"
	got := make(chan []string, 10)
	ch := make(chan []api.WatchEvent)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go pacedReads(ctx, ch, []string{out}, readPace, func(_ context.Context, paths []string) { got <- paths })
	ch <- []api.WatchEvent{{Path: "/workspace/other.txt"}}
	ch <- []api.WatchEvent{{Path: out}}
	select {
	case paths := <-got:
		assert.Equal(t, []string{out}, paths)
	case <-time.After(5 * time.Second):
		t.Fatal("a change after a quiet spell was not read")
	}
	close(ch)
	select {
	case paths := <-got:
		t.Fatalf("read %v after the watch ended", paths)
	case <-time.After(50 * time.Millisecond):
	}
}
