package statetest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/state"
)

// reserve: a counter admits holders up to its limit, then refuses with
// ErrLimit; counters are independent of each other and of records; a
// limit below 1 admits nobody new.
func (s *suite) reserve(t *testing.T) {
	st := s.store(t)
	assert.Empty(t, holders(t, st, "boxes"), "a counter never reserved")
	require.NoError(t, st.Reserve(ctx, "boxes", "b-2", 2))
	require.NoError(t, st.Reserve(ctx, "boxes", "b-1", 2))
	err := st.Reserve(ctx, "boxes", "b-3", 2)
	require.ErrorIs(t, err, state.ErrLimit)
	assert.Equal(t, []string{"b-1", "b-2"}, holders(t, st, "boxes"), "sorted, and b-3 is not among them")

	require.NoError(t, st.Reserve(ctx, "boxes/s-1", "b-3", 1), "another counter")
	assert.Equal(t, []string{"b-3"}, holders(t, st, "boxes/s-1"))
	require.NoError(t, st.Reserve(ctx, "boxes", "b-3", 3), "a higher limit admits more")
	assert.Equal(t, []string{"b-1", "b-2", "b-3"}, holders(t, st, "boxes"))

	assert.ErrorIs(t, st.Reserve(ctx, "sessions", "s-1", 0), state.ErrLimit, "limit 0")
	assert.ErrorIs(t, st.Reserve(ctx, "sessions", "s-1", -1), state.ErrLimit, "limit -1")
	assert.Empty(t, holders(t, st, "sessions"))
	assert.Empty(t, list(t, st, state.Boxes, ""), "reservations are not records")
}

// reserveIdempotent: a holder holds a counter once: reserving again
// succeeds without a second place, also when the counter is full and when
// the limit is now below the holders.
func (s *suite) reserveIdempotent(t *testing.T) {
	st := s.store(t)
	require.NoError(t, st.Reserve(ctx, "c", "a", 2))
	require.NoError(t, st.Reserve(ctx, "c", "a", 2))
	assert.Equal(t, []string{"a"}, holders(t, st, "c"))
	require.NoError(t, st.Reserve(ctx, "c", "b", 2), "a's second reserve took no place")
	require.NoError(t, st.Reserve(ctx, "c", "a", 2), "full, but a holds it")
	require.NoError(t, st.Reserve(ctx, "c", "b", 1), "a lowered limit keeps the holders it had")
	assert.ErrorIs(t, st.Reserve(ctx, "c", "x", 1), state.ErrLimit)
	assert.Equal(t, []string{"a", "b"}, holders(t, st, "c"))
}

// release: a released place is free for another holder; releasing what is
// not held (or a counter never used) succeeds and changes nothing.
func (s *suite) release(t *testing.T) {
	st := s.store(t)
	require.NoError(t, st.Reserve(ctx, "c", "a", 2))
	require.NoError(t, st.Reserve(ctx, "c", "b", 2))
	require.NoError(t, st.Release(ctx, "c", "a"))
	assert.Equal(t, []string{"b"}, holders(t, st, "c"))
	require.NoError(t, st.Reserve(ctx, "c", "x", 2), "a's place is free")
	assert.ErrorIs(t, st.Reserve(ctx, "c", "a", 2), state.ErrLimit, "a holds nothing any more")
	require.NoError(t, st.Release(ctx, "c", "a"), "not held")
	require.NoError(t, st.Release(ctx, "never", "a"), "a counter never used")
	assert.Equal(t, []string{"b", "x"}, holders(t, st, "c"))
	require.NoError(t, st.Release(ctx, "c", "b"))
	require.NoError(t, st.Release(ctx, "c", "x"))
	assert.Empty(t, holders(t, st, "c"))
	require.NoError(t, st.Reserve(ctx, "c", "y", 1), "an emptied counter starts again")
	assert.Equal(t, []string{"y"}, holders(t, st, "c"))
}

// concurrentReserve: of goroutines that each reserve a place of their own
// on one counter of limit K at once, exactly K succeed, the others get
// ErrLimit, and the holders are the K that succeeded.
func (s *suite) concurrentReserve(t *testing.T) {
	st := s.store(t)
	const workers, limit = 32, 5
	require.NoError(t, st.Reserve(ctx, "boxes", "held-before", limit))
	var mu sync.Mutex
	var won []string
	refused := 0
	within(t, "the reservations", func() {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range workers {
			wg.Go(func() {
				h := fmt.Sprintf("b-%02d", i)
				<-start
				err := st.Reserve(ctx, "boxes", h, limit)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					won = append(won, h)
				case errors.Is(err, state.ErrLimit):
					refused++
				default:
					assert.NoError(t, err)
				}
			})
		}
		close(start)
		wg.Wait()
	})
	assert.Len(t, won, limit-1, "the holder before took one of the %d places", limit)
	assert.Equal(t, workers-(limit-1), refused)
	slices.Sort(won)
	assert.Equal(t, append(won, "held-before"), holders(t, st, "boxes"))
}

// concurrentReserveOneHolder: one holder reserving one counter from many
// goroutines at once holds one place, and every call succeeds.
func (s *suite) concurrentReserveOneHolder(t *testing.T) {
	st := s.store(t)
	within(t, "the reservations", func() {
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() { assert.NoError(t, st.Reserve(ctx, "sessions", "s-1", 1)) })
		}
		wg.Wait()
	})
	assert.Equal(t, []string{"s-1"}, holders(t, st, "sessions"))
	assert.ErrorIs(t, st.Reserve(ctx, "sessions", "s-2", 1), state.ErrLimit)
}
