package statetest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/state"
)

// instance: the instance id is not empty, the same on every call, and two
// stores' are different (made at random).
func (s *suite) instance(t *testing.T) {
	a, b := s.store(t), s.store(t)
	ia, err := a.Instance(ctx)
	require.NoError(t, err)
	assert.NotEmpty(t, ia)
	again, err := a.Instance(ctx)
	require.NoError(t, err)
	assert.Equal(t, ia, again)
	ib, err := b.Instance(ctx)
	require.NoError(t, err)
	assert.NotEqual(t, ia, ib, "two stores' data have ids of their own")
}

// context: every call with a done context returns the context's error and
// writes nothing.
func (s *suite) context(t *testing.T) {
	st := s.store(t)
	put(t, st, state.Boxes, "a", "1")
	require.NoError(t, st.Reserve(ctx, "c", "h", 5))
	before := dump(t, st)
	done, cancel := context.WithCancel(ctx)
	cancel()
	_, err := st.Commit(done, state.Put(state.Boxes, "b", []byte("2")), state.Delete(state.Boxes, "a"))
	assert.ErrorIs(t, err, context.Canceled, "Commit")
	assert.ErrorIs(t, st.Reserve(done, "c", "h2", 5), context.Canceled, "Reserve")
	assert.ErrorIs(t, st.Release(done, "c", "h"), context.Canceled, "Release")
	_, err = st.Get(done, state.Boxes, "a")
	assert.ErrorIs(t, err, context.Canceled, "Get")
	_, err = st.List(done, state.Boxes, "")
	assert.ErrorIs(t, err, context.Canceled, "List")
	_, err = st.Holders(done, "c")
	assert.ErrorIs(t, err, context.Canceled, "Holders")
	_, err = st.Instance(done)
	assert.ErrorIs(t, err, context.Canceled, "Instance")
	assert.Equal(t, before, dump(t, st), "calls with a done context write nothing")
}

// close: after Close every call fails with ErrClosed (and writes nothing:
// see Reopen); Close again returns nil.
func (s *suite) close(t *testing.T) {
	st := s.store(t)
	put(t, st, state.Boxes, "a", "1")
	require.NoError(t, st.Close())
	_, err := st.Commit(ctx, state.Put(state.Boxes, "b", nil))
	assert.ErrorIs(t, err, state.ErrClosed, "Commit")
	_, err = st.Commit(ctx)
	assert.ErrorIs(t, err, state.ErrClosed, "Commit of nothing")
	_, err = st.Get(ctx, state.Boxes, "a")
	assert.ErrorIs(t, err, state.ErrClosed, "Get")
	_, err = st.List(ctx, state.Boxes, "")
	assert.ErrorIs(t, err, state.ErrClosed, "List")
	assert.ErrorIs(t, st.Reserve(ctx, "c", "h", 1), state.ErrClosed, "Reserve")
	assert.ErrorIs(t, st.Release(ctx, "c", "h"), state.ErrClosed, "Release")
	_, err = st.Holders(ctx, "c")
	assert.ErrorIs(t, err, state.ErrClosed, "Holders")
	_, err = st.Instance(ctx)
	assert.ErrorIs(t, err, state.ErrClosed, "Instance")
	assert.NoError(t, st.Close(), "a second Close")
}

// reopen: a store that keeps its data past Close (reopen not nil) has it
// all when opened again — records with their values and revisions,
// deletions, reservations, the instance id — and its revisions go on from
// where they were; what calls made after Close tried is not there.
func (s *suite) reopen(t *testing.T) {
	st, reopen := s.storeWith(t)
	if reopen == nil {
		t.Skip("the store keeps nothing past Close")
	}
	put(t, st, state.Sessions, "s-1", "one")
	put(t, st, state.Boxes, "gone", "x")
	commit(t, st,
		state.Put(state.Boxes, "b-1", []byte("box")),
		state.Put(state.Snapshots, "x", []byte("snap")),
		state.Put(state.SnapshotManifests, "x", []byte("files")),
		state.Delete(state.Boxes, "gone"))
	last := put(t, st, state.Previews, "p", "\x00bytes\xff")
	require.NoError(t, st.Reserve(ctx, "boxes", "b-1", 3))
	require.NoError(t, st.Reserve(ctx, "boxes", "b-2", 3))
	require.NoError(t, st.Reserve(ctx, "sessions", "s-1", 3))
	require.NoError(t, st.Release(ctx, "boxes", "b-2"))
	id, err := st.Instance(ctx)
	require.NoError(t, err)
	before := dump(t, st)
	require.NotEmpty(t, before)

	closed := st
	st = reopen()
	_, err = closed.Commit(ctx, state.Put(state.Boxes, "late", nil))
	require.ErrorIs(t, err, state.ErrClosed)
	assert.Equal(t, before, dump(t, st), "everything, with its revision")
	assert.Equal(t, "(none)", value(t, st, state.Boxes, "late"))
	again, err := st.Instance(ctx)
	require.NoError(t, err)
	assert.Equal(t, id, again, "the instance id")
	assert.Greater(t, put(t, st, state.Boxes, "next", "v"), last, "revisions go on")
	r := get(t, st, state.Sessions, "s-1")
	commit(t, st, state.Put(state.Sessions, "s-1", []byte("two")).If(r.Revision))
	assert.ErrorIs(t, st.Reserve(ctx, "boxes", "b-3", 1), state.ErrLimit, "the reservations count")

	st = reopen()
	assert.Equal(t, "two", value(t, st, state.Sessions, "s-1"), "a second reopen")
}
