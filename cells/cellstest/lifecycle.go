package cellstest

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/cells"
)

// close: Close ends every watch (its channel closes; a last batch, if
// any, carries Err); afterwards Get, View, Update and Watch fail with
// ErrClosed, without calling fn, and Close again returns nil.
func (s *suite) close(t *testing.T) {
	st := s.store(t)
	set(t, st, at("a"), `1`)
	live := watch(t, st, "", st.Version())
	unread := watch(t, st, "", 0)
	require.NoError(t, st.Close())
	for _, w := range []<-chan cells.Batch{live, unread} {
		bs := closes(t, w)
		for i, b := range bs {
			if i == len(bs)-1 && b.Err != nil {
				continue
			}
			assert.NoError(t, b.Err, "only the last batch may carry Err")
			assert.Equal(t, uint64(1), b.Version)
		}
	}
	_, err := st.Get(t.Context(), at("a"))
	assert.ErrorIs(t, err, cells.ErrClosed, "Get")
	called := false
	assert.ErrorIs(t, st.View(t.Context(), func(cells.Tx) error { called = true; return nil }), cells.ErrClosed, "View")
	assert.ErrorIs(t, st.Update(t.Context(), func(cells.Tx) error { called = true; return nil }), cells.ErrClosed, "Update")
	assert.False(t, called, "fn runs on no closed store")
	_, err = st.Watch(context.Background(), "", 0)
	assert.ErrorIs(t, err, cells.ErrClosed, "Watch")
	assert.NoError(t, st.Close(), "a second Close")
}

// endedContext: Get, View and Update given a context that has ended
// return its error, without running fn, and write nothing; the store goes
// on.
func (s *suite) endedContext(t *testing.T) {
	st := s.store(t)
	set(t, st, at("a"), `1`)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := st.Get(ctx, at("a"))
	assert.ErrorIs(t, err, context.Canceled, "Get")
	called := false
	assert.ErrorIs(t, st.View(ctx, func(cells.Tx) error { called = true; return nil }), context.Canceled, "View")
	assert.ErrorIs(t, st.Update(ctx, func(tx cells.Tx) error {
		called = true
		_, err := tx.Set(at("a"), json.RawMessage(`2`))
		return err
	}), context.Canceled, "Update")
	assert.False(t, called, "fn runs with no ended context")
	assert.Equal(t, "1", value(t, st, at("a")))
	assert.Equal(t, uint64(1), st.Version())
	set(t, st, at("a"), `3`)
	assert.Equal(t, "3", value(t, st, at("a")), "the store goes on")
}

// reopen: a store that keeps its data past Close (reopen not nil) has it
// all when opened again — cells with their versions, errors and specs,
// queued events and receipts, Meta, and the change log, which a watch from
// 0 replays — and its version and event sequences go on from where they
// were.
func (s *suite) reopen(t *testing.T) {
	st, reopen := s.storeWith(t, cells.Options{})
	if reopen == nil {
		t.Skip("the store keeps nothing past Close")
	}
	schema := `{"type":"number"}`
	var sent []cells.Event
	set(t, st, at("a"), `1`)
	set(t, st, at("a"), `2`)
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		if err := tx.Declare(at("n"), cells.Spec{Schema: json.RawMessage(schema)}); err != nil {
			return err
		}
		if _, err := tx.SetError(at("n"), "failed"); err != nil {
			return err
		}
		if err := tx.Declare(at("ev"), cells.Spec{Stream: true}); err != nil {
			return err
		}
		for _, p := range []string{`1`, `2`} {
			e, err := tx.Send(at("ev"), json.RawMessage(p))
			if err != nil {
				return err
			}
			sent = append(sent, e)
		}
		return tx.Meta("m").Put("k", []byte("v"))
	}))
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error { return tx.Ack(at("ev"), sent[0].ID) }))
	before := list(t, st, "")

	st = reopen()
	assert.Equal(t, uint64(3), st.Version())
	after := list(t, st, "")
	require.Len(t, after, len(before))
	for i := range before {
		sameCell(t, before[i], after[i], "%s", before[i].Addr)
	}
	require.NoError(t, st.View(t.Context(), func(tx cells.Tx) error {
		spec, err := tx.Spec(at("n"))
		require.NoError(t, err)
		assert.JSONEq(t, schema, string(spec.Schema))
		spec, err = tx.Spec(at("ev"))
		require.NoError(t, err)
		assert.True(t, spec.Stream)
		evs, err := tx.Events(at("ev"))
		require.NoError(t, err)
		sameEvents(t, sent[1:], evs)
		v, ok := tx.Meta("m").Get("k")
		assert.True(t, ok)
		assert.Equal(t, "v", string(v))
		return nil
	}))
	assert.ErrorIs(t, st.Update(t.Context(), func(tx cells.Tx) error { return tx.Ack(at("ev"), sent[0].ID) }), cells.ErrHandled)
	var se *cells.SchemaError
	assert.ErrorAs(t, st.Update(t.Context(), func(tx cells.Tx) error { _, err := tx.Set(at("n"), json.RawMessage(`"x"`)); return err }), &se)

	got := collect(t, watch(t, st, "", 0), 3)
	assert.Equal(t, []uint64{1, 2, 3}, versions(got), "the log survives")
	assert.Equal(t, "1", string(got[0].Changes[0].Cell.Value))

	set(t, st, at("a"), `3`)
	assert.Equal(t, uint64(4), get(t, st, at("a")).Version, "the sequence continues")
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		e, err := tx.Send(at("ev"), json.RawMessage(`3`))
		assert.Greater(t, e.ID, sent[1].ID, "event IDs continue")
		return err
	}))
}
