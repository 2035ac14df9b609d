package cellstest

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/cells"
)

// streams: Send queues events on a stream, each a Change of its commit's
// batch; a handler acks in the transaction that writes its effect, so a
// crash before the commit leaves the event queued and the effect
// unwritten, and a replayed ack is refused with ErrHandled; queued events
// and acks last (across a reopen, for a store that keeps its data).
func (s *suite) streams(t *testing.T) {
	st, reopen := s.storeWith(t, cells.Options{})
	ev := at("node.run")
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error { return tx.Declare(ev, cells.Spec{Stream: true}) }))
	w := watch(t, st, "", st.Version())
	var sent []cells.Event
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		for _, p := range []string{`{"command":"ls"}`, `{ "command" : "pwd" }`} {
			e, err := tx.Send(ev, json.RawMessage(p))
			require.NoError(t, err)
			sent = append(sent, e)
		}
		return nil
	}))
	assert.Less(t, sent[0].ID, sent[1].ID)
	assert.Equal(t, `{"command":"pwd"}`, string(sent[1].Payload), "the payload is stored compact")
	assert.WithinDuration(t, time.Now(), sent[0].Sent, time.Minute)
	batch := next(t, w)
	assert.Equal(t, uint64(2), batch.Version)
	require.Len(t, batch.Changes, 2, "one change per event")
	for i, c := range batch.Changes {
		require.NotNil(t, c.Event)
		sameEvents(t, sent[i:i+1], []cells.Event{*c.Event})
		assert.Equal(t, ev, c.Cell.Addr)
		assert.True(t, c.Cell.Stream)
		assert.Equal(t, "null", string(c.Cell.Value))
		assert.Equal(t, uint64(2), c.Cell.Version, "the stream's version moved to the commit's")
		assert.True(t, c.Event.Sent.Equal(c.Cell.Changed), "an event is sent when its commit happens")
		assert.False(t, c.Deleted)
	}
	assert.JSONEq(t, `{"command":"pwd"}`, string(batch.Changes[1].Event.Payload))
	assert.Equal(t, uint64(2), get(t, st, ev).Version)

	// A handler that crashes before its transaction commits leaves the
	// event queued and its writes unwritten.
	crash := errors.New("crash before commit")
	handle := func(tx cells.Tx) error {
		evs, err := tx.Events(ev)
		require.NoError(t, err)
		require.NotEmpty(t, evs)
		if err := tx.Ack(ev, evs[0].ID); err != nil {
			return err
		}
		_, err = tx.Set(at("history"), evs[0].Payload)
		return err
	}
	assert.ErrorIs(t, st.Update(t.Context(), func(tx cells.Tx) error { handle(tx); return crash }), crash)
	_, err := st.Get(t.Context(), at("history"))
	assert.ErrorIs(t, err, cells.ErrNotFound)
	require.NoError(t, st.Update(t.Context(), handle))
	// Acking it again (a replayed handler) is refused.
	err = st.Update(t.Context(), func(tx cells.Tx) error { return tx.Ack(ev, sent[0].ID) })
	assert.ErrorIs(t, err, cells.ErrHandled)

	if reopen != nil {
		st = reopen()
	}
	require.NoError(t, st.View(t.Context(), func(tx cells.Tx) error {
		evs, err := tx.Events(ev)
		require.NoError(t, err)
		sameEvents(t, sent[1:], evs, "the handled event is gone, the other queued")
		return nil
	}))
	h := get(t, st, at("history"))
	assert.JSONEq(t, `{"command":"ls"}`, string(h.Value))
	err = st.Update(t.Context(), func(tx cells.Tx) error { return tx.Ack(ev, sent[0].ID) })
	assert.ErrorIs(t, err, cells.ErrHandled, "the receipt lasts")
}

// eventsAndAcks: event IDs are unique in the store and increase with every
// Send, whatever the stream; Events lists a stream's unacked events oldest
// first; Ack drops every event up to and including its id, refuses an id
// at or below the last acked with ErrHandled, and changes no cell.
func (s *suite) eventsAndAcks(t *testing.T) {
	st := s.store(t)
	x, y := at("x.run"), at("y.run")
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		if err := tx.Declare(x, cells.Spec{Stream: true}); err != nil {
			return err
		}
		return tx.Declare(y, cells.Spec{Stream: true})
	}))
	var sent []cells.Event // x1 y1 x2 | x3 y2
	send := func(tx cells.Tx, a cells.Address, p string) {
		e, err := tx.Send(a, json.RawMessage(p))
		require.NoError(t, err)
		sent = append(sent, e)
	}
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		send(tx, x, `"x1"`)
		send(tx, y, `"y1"`)
		send(tx, x, `"x2"`)
		return nil
	}))
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		send(tx, x, `"x3"`)
		send(tx, y, `"y2"`)
		return nil
	}))
	for i := 1; i < len(sent); i++ {
		assert.Less(t, sent[i-1].ID, sent[i].ID, "IDs increase with every Send, across streams and commits")
	}
	assert.True(t, sent[0].Sent.Equal(sent[2].Sent), "events of one commit have its time")
	events := func(a cells.Address) []cells.Event {
		t.Helper()
		var evs []cells.Event
		require.NoError(t, st.View(t.Context(), func(tx cells.Tx) error {
			var err error
			evs, err = tx.Events(a)
			return err
		}))
		return evs
	}
	sameEvents(t, []cells.Event{sent[0], sent[2], sent[3]}, events(x), "oldest first, this stream's only")
	sameEvents(t, []cells.Event{sent[1], sent[4]}, events(y))

	ack := func(a cells.Address, id uint64) error {
		return st.Update(t.Context(), func(tx cells.Tx) error { return tx.Ack(a, id) })
	}
	w := watch(t, st, "", st.Version())
	before := st.Version()
	require.NoError(t, ack(x, sent[2].ID))
	sameEvents(t, []cells.Event{sent[3]}, events(x), "acked up to and including x2")
	sameEvents(t, []cells.Event{sent[1], sent[4]}, events(y), "another stream's events stay")
	assert.Equal(t, before, st.Version(), "an ack is no cell change")
	assert.ErrorIs(t, ack(x, sent[2].ID), cells.ErrHandled, "the same id again")
	assert.ErrorIs(t, ack(x, sent[0].ID), cells.ErrHandled, "an id below")
	require.NoError(t, ack(y, sent[1].ID), "each stream has its own receipt")
	require.NoError(t, ack(x, sent[4].ID), "an id of another stream's event acks up to it")
	assert.Empty(t, events(x))
	sameEvents(t, []cells.Event{sent[4]}, events(y))
	set(t, st, at("a"), `1`)
	assert.Equal(t, before+1, next(t, w).Version, "no batch for the acks")

	_, err := func() ([]cells.Event, error) {
		var evs []cells.Event
		err := st.View(t.Context(), func(tx cells.Tx) error {
			var err error
			evs, err = tx.Events(at("none"))
			return err
		})
		return evs, err
	}()
	assert.ErrorIs(t, err, cells.ErrNotFound, "the events of no stream")
	assert.ErrorIs(t, ack(at("none"), 1), cells.ErrNotFound, "an ack on no stream")
	err = st.Update(t.Context(), func(tx cells.Tx) error { _, err := tx.Send(at("none"), json.RawMessage(`1`)); return err })
	assert.ErrorIs(t, err, cells.ErrNotFound, "a send to no stream")
}
