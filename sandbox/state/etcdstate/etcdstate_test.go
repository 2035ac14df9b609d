package etcdstate_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/etcdtest"
	"github.com/cellbox/cellbox/sandbox/state"
	"github.com/cellbox/cellbox/sandbox/state/etcdstate"
	"github.com/cellbox/cellbox/sandbox/state/statetest"
)

// TestStore runs the state conformance suite on etcd, each store under a
// prefix of its own, reopened over the same prefix.
func TestStore(t *testing.T) {
	c := etcdtest.Start(t, 1).Dial(t)
	statetest.Run(t, func(t *testing.T) (state.Store, func(*testing.T) state.Store) {
		prefix := etcdtest.Prefix()
		return etcdstate.Open(c, prefix), func(*testing.T) state.Store { return etcdstate.Open(c, prefix) }
	})
}

// TestCapAcrossServers: servers on two clients of a three-member cluster
// reserve one cap at once and never admit more than its limit between
// them, and both read the one instance id.
func TestCapAcrossServers(t *testing.T) {
	cl := etcdtest.Start(t, 3)
	a := etcdstate.Open(cl.Dial(t), "")
	b := etcdstate.Open(cl.Dial(t), "")
	ia, err := a.Instance(t.Context())
	require.NoError(t, err)
	ib, err := b.Instance(t.Context())
	require.NoError(t, err)
	assert.Equal(t, ia, ib, "one instance id for every server")

	const limit = 5
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := 0
	for i := range 20 {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.Reserve(t.Context(), "boxes", fmt.Sprintf("box-%d", i), limit)
			if err == nil {
				mu.Lock()
				won++
				mu.Unlock()
			} else {
				assert.ErrorIs(t, err, state.ErrLimit)
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, limit, won)
	hs, err := b.Holders(t.Context(), "boxes")
	require.NoError(t, err)
	assert.Len(t, hs, limit)
}

// TestTooLarge: a record past the server's request limit is refused with
// an error that names the flag, and nothing is written.
func TestTooLarge(t *testing.T) {
	s := etcdstate.Open(etcdtest.Start(t, 1).Dial(t), "")
	_, err := s.Commit(t.Context(), state.Put(state.Boxes, "big", []byte(strings.Repeat("x", 9<<20))))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--max-request-bytes")
	_, err = s.Get(t.Context(), state.Boxes, "big")
	assert.ErrorIs(t, err, state.ErrNotFound)
}

// TestFence: a commit under fences goes through while each fence's key
// keeps its create revision, and fails with state.ErrFenced, writing
// nothing, once one was made anew (the lease is another holder's) or is
// gone (it ran out); a guard that fails beside a fence that holds is
// still a conflict.
func TestFence(t *testing.T) {
	c := etcdtest.Start(t, 1).Dial(t)
	ctx := t.Context()
	s := etcdstate.Open(c, etcdtest.Prefix())
	mine, err := c.Put(ctx, "/lease/a", "me")
	require.NoError(t, err)
	_, err = c.Put(ctx, "/lease/b", "me")
	require.NoError(t, err)
	fa := state.Fence{Key: "/lease/a", Rev: mine.Header.Revision}
	got, err := c.Get(ctx, "/lease/b")
	require.NoError(t, err)
	fb := state.Fence{Key: "/lease/b", Rev: got.Kvs[0].CreateRevision}
	fenced := state.WithFences(ctx, fa, fb)

	_, err = s.Commit(fenced, state.Put(state.Sessions, "s-1", []byte("v1")))
	require.NoError(t, err, "both leases are the writer's")
	_, err = s.Commit(fenced, state.Put(state.Sessions, "s-1", []byte("v2")).If(1))
	require.ErrorIs(t, err, state.ErrConflict, "a stale guard, the fences holding")

	// Another holder takes lease b between two renewals.
	_, err = c.Delete(ctx, "/lease/b")
	require.NoError(t, err)
	_, err = c.Put(ctx, "/lease/b", "another")
	require.NoError(t, err)
	_, err = s.Commit(fenced, state.Put(state.Sessions, "s-1", []byte("stale")), state.Delete(state.Boxes, "b-1"))
	require.ErrorIs(t, err, state.ErrFenced)
	assert.Contains(t, err.Error(), "/lease/b")
	r, err := s.Get(ctx, state.Sessions, "s-1")
	require.NoError(t, err)
	assert.Equal(t, "v1", string(r.Value), "nothing written")

	// Lease a ran out (its key is gone).
	_, err = c.Delete(ctx, "/lease/a")
	require.NoError(t, err)
	_, err = s.Commit(state.WithFences(ctx, fa), state.Put(state.Sessions, "s-1", []byte("stale")))
	require.ErrorIs(t, err, state.ErrFenced)
	_, err = s.Commit(ctx, state.Put(state.Sessions, "s-1", []byte("v2")))
	require.NoError(t, err, "a commit without fences")
}
