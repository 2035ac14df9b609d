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

// setGetVersions: an empty store is at version 0; a transaction that
// changes cells takes the next version, and every cell it writes gets it
// (and one Changed); a value equal to the stored one changes nothing and
// takes no version; errors keep the value, Set clears them.
func (s *suite) setGetVersions(t *testing.T) {
	st := s.store(t)
	assert.Equal(t, uint64(0), st.Version())
	_, err := st.Get(t.Context(), at("a"))
	assert.ErrorIs(t, err, cells.ErrNotFound)
	assert.Empty(t, list(t, st, ""), "an empty store lists nothing")
	require.NoError(t, st.View(t.Context(), func(tx cells.Tx) error {
		assert.Equal(t, uint64(0), tx.Version(), "a read-only transaction has the store's version")
		return nil
	}))

	// Several writes, one commit, one version.
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		assert.Equal(t, uint64(1), tx.Version(), "the version this transaction's writes get")
		for _, n := range []string{"a", "b"} {
			changed, err := tx.Set(at(n), json.RawMessage(`{ "x" : 1 }`))
			require.NoError(t, err)
			assert.True(t, changed)
		}
		return nil
	}))
	a := get(t, st, at("a"))
	assert.Equal(t, at("a"), a.Addr)
	assert.JSONEq(t, `{"x":1}`, string(a.Value))
	assert.Equal(t, `{"x":1}`, string(a.Value), "stored compact")
	assert.Equal(t, uint64(1), a.Version)
	assert.WithinDuration(t, time.Now(), a.Changed, time.Minute)
	assert.False(t, a.Stream)
	assert.Empty(t, a.Error)
	assert.Equal(t, uint64(1), st.Version())
	b := get(t, st, at("b"))
	assert.Equal(t, uint64(1), b.Version, "every cell of a commit gets its version")
	assert.True(t, a.Changed.Equal(b.Changed), "and its time")
	require.NoError(t, st.View(t.Context(), func(tx cells.Tx) error {
		assert.Equal(t, uint64(1), tx.Version())
		return nil
	}))

	// An equal value (once compact) changes nothing and takes no version.
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		for _, v := range []string{`{"x":1}`, ` { "x": 1 } `} {
			changed, err := tx.Set(at("a"), json.RawMessage(v))
			require.NoError(t, err)
			assert.False(t, changed, v)
		}
		return nil
	}))
	assert.Equal(t, uint64(1), st.Version())

	set(t, st, at("b"), `2`)
	b = get(t, st, at("b"))
	assert.Equal(t, uint64(2), b.Version)
	assert.False(t, b.Changed.Before(a.Changed))
	assert.Equal(t, uint64(1), get(t, st, at("a")).Version, "a cell the commit did not write keeps its version")

	// Errors keep the value; Set clears them, even with the same value.
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		changed, err := tx.SetError(at("b"), "boom")
		assert.True(t, changed)
		return err
	}))
	b = get(t, st, at("b"))
	assert.Equal(t, "boom", b.Error)
	assert.Equal(t, "2", string(b.Value))
	assert.Equal(t, uint64(3), b.Version)
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		changed, err := tx.Set(at("b"), json.RawMessage(`2`))
		assert.True(t, changed, "clearing the error is a change")
		return err
	}))
	b = get(t, st, at("b"))
	assert.Empty(t, b.Error)
	assert.Equal(t, uint64(4), b.Version)

	got := list(t, st, "s/p/")
	require.Len(t, got, 2)
	assert.Equal(t, "a", got[0].Addr.Name)
	assert.Equal(t, "b", got[1].Addr.Name)
}

// setValues: Set takes any JSON value, stores it compact (strings kept
// byte for byte), creates the cell, and refuses what is not one JSON value.
func (s *suite) setValues(t *testing.T) {
	st := s.store(t)
	for _, tc := range []struct{ in, stored string }{
		{`null`, `null`},
		{`true`, `true`},
		{`-12`, `-12`},
		{`1.5e3`, `1.5e3`},
		{` 7 `, `7`},
		{`"a  b\n"`, `"a  b\n"`},
		{`[ 1, [2] , {} ]`, `[1,[2],{}]`},
		{"{\n\t\"k\": \"v w\"\n}", `{"k":"v w"}`},
	} {
		require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
			_, err := tx.Set(at("v"), json.RawMessage(tc.in))
			return err
		}), tc.in)
		assert.Equal(t, tc.stored, value(t, st, at("v")), tc.in)
	}

	// A declared cell holds null: setting null changes nothing.
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error { return tx.Declare(at("d"), cells.Spec{}) }))
	before := st.Version()
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		changed, err := tx.Set(at("d"), json.RawMessage(`null`))
		assert.False(t, changed)
		return err
	}))
	assert.Equal(t, before, st.Version())

	for _, bad := range []string{``, ` `, `{x`, `1 2`, `nul`, `{"a":1}}`} {
		err := st.Update(t.Context(), func(tx cells.Tx) error {
			_, err := tx.Set(at("v"), json.RawMessage(bad))
			return err
		})
		assert.Error(t, err, "%q", bad)
	}
	assert.Equal(t, `{"k":"v w"}`, value(t, st, at("v")), "refused values leave the cell")
	assert.Equal(t, before, st.Version())
}

// setError: SetError marks a cell failed, keeping its value, creates a
// missing cell (value null) unless msg is "", and reports whether anything
// changed.
func (s *suite) setError(t *testing.T) {
	st := s.store(t)
	setErr := func(a cells.Address, msg string) (changed bool) {
		t.Helper()
		require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
			var err error
			changed, err = tx.SetError(a, msg)
			return err
		}))
		return changed
	}
	assert.False(t, setErr(at("none"), ""), "clearing the error of no cell")
	_, err := st.Get(t.Context(), at("none"))
	assert.ErrorIs(t, err, cells.ErrNotFound, "makes no cell")
	assert.Equal(t, uint64(0), st.Version())

	assert.True(t, setErr(at("new"), "failed"))
	c := get(t, st, at("new"))
	assert.Equal(t, "failed", c.Error)
	assert.Equal(t, "null", string(c.Value))
	assert.Equal(t, uint64(1), c.Version)

	set(t, st, at("a"), `"good"`)
	assert.True(t, setErr(at("a"), "boom"))
	assert.False(t, setErr(at("a"), "boom"), "the same error again")
	assert.Equal(t, uint64(3), st.Version())
	assert.True(t, setErr(at("a"), "other"))
	c = get(t, st, at("a"))
	assert.Equal(t, "other", c.Error)
	assert.Equal(t, `"good"`, string(c.Value), "the last good value stays")
	assert.True(t, setErr(at("a"), ""))
	c = get(t, st, at("a"))
	assert.Empty(t, c.Error)
	assert.Equal(t, `"good"`, string(c.Value))
	assert.Equal(t, uint64(5), c.Version)
	assert.False(t, setErr(at("a"), ""), "no error to clear")
	assert.Equal(t, uint64(5), st.Version())
}

// declare: Declare makes a cell (value null, a version and a batch of its
// own) or changes the spec of one in place (no version, no batch); the
// spec reads back; a cell's kind is fixed.
func (s *suite) declare(t *testing.T) {
	st := s.store(t)
	w := watch(t, st, "", 0)
	spec := func(a cells.Address) cells.Spec {
		t.Helper()
		var sp cells.Spec
		require.NoError(t, st.View(t.Context(), func(tx cells.Tx) error {
			var err error
			sp, err = tx.Spec(a)
			return err
		}))
		return sp
	}
	declare := func(a cells.Address, sp cells.Spec) error {
		return st.Update(t.Context(), func(tx cells.Tx) error { return tx.Declare(a, sp) })
	}

	assert.Equal(t, cells.Spec{}, spec(at("none")), "a missing cell has the zero spec")
	require.NoError(t, declare(at("v"), cells.Spec{}))
	v := get(t, st, at("v"))
	assert.Equal(t, "null", string(v.Value))
	assert.False(t, v.Stream)
	assert.Equal(t, uint64(1), v.Version)
	b := next(t, w)
	assert.Equal(t, uint64(1), b.Version)
	require.Len(t, b.Changes, 1)
	assert.Equal(t, at("v"), b.Changes[0].Cell.Addr)
	assert.Equal(t, "null", string(b.Changes[0].Cell.Value))

	require.NoError(t, declare(at("ev"), cells.Spec{Stream: true}))
	ev := get(t, st, at("ev"))
	assert.True(t, ev.Stream)
	assert.Equal(t, "null", string(ev.Value), "a stream's value is null")
	assert.Equal(t, cells.Spec{Stream: true}, spec(at("ev")))
	assert.Equal(t, uint64(2), next(t, w).Version)

	// Declaring again, or changing the schema, takes no version.
	require.NoError(t, declare(at("v"), cells.Spec{}))
	set(t, st, at("v"), `"text"`)
	assert.Equal(t, uint64(3), next(t, w).Version)
	schema := `{"type":"number"}`
	require.NoError(t, declare(at("v"), cells.Spec{Schema: json.RawMessage(schema)}))
	assert.Equal(t, uint64(3), st.Version(), "a spec change is not a cell change")
	assert.JSONEq(t, schema, string(spec(at("v")).Schema))
	assert.False(t, spec(at("v")).Stream)
	assert.Equal(t, `"text"`, value(t, st, at("v")), "declaring a schema does not check or change the current value")
	err := st.Update(t.Context(), func(tx cells.Tx) error { _, err := tx.Set(at("v"), json.RawMessage(`"more"`)); return err })
	var se *cells.SchemaError
	assert.ErrorAs(t, err, &se, "the schema holds from then on")
	set(t, st, at("v"), `5`)
	assert.Equal(t, uint64(4), next(t, w).Version, "no batch for the spec changes")

	// Declaring without a schema removes it.
	require.NoError(t, declare(at("v"), cells.Spec{}))
	assert.Empty(t, spec(at("v")).Schema)
	set(t, st, at("v"), `"free"`)
	assert.Equal(t, uint64(5), st.Version())

	// A cell made by Set has the zero spec; it can be declared later.
	set(t, st, at("plain"), `1`)
	assert.Equal(t, cells.Spec{}, spec(at("plain")))
	require.NoError(t, declare(at("plain"), cells.Spec{Schema: json.RawMessage(schema)}))
	assert.JSONEq(t, schema, string(spec(at("plain")).Schema))
	assert.Equal(t, "1", value(t, st, at("plain")))

	// The kind is fixed.
	assert.ErrorContains(t, declare(at("ev"), cells.Spec{}), "declare s/p/ev as a value cell: it is a stream")
	assert.ErrorContains(t, declare(at("v"), cells.Spec{Stream: true}), "declare s/p/v as a stream: it is a value cell")
	assert.ErrorContains(t, declare(at("bad"), cells.Spec{Schema: json.RawMessage(`{"type":`)}), "schema is not valid JSON")
	_, err = st.Get(t.Context(), at("bad"))
	assert.ErrorIs(t, err, cells.ErrNotFound)
	assert.Equal(t, uint64(6), st.Version())

	// Until the cell is deleted.
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error { return tx.Delete(at("ev")) }))
	require.NoError(t, declare(at("ev"), cells.Spec{}))
	assert.False(t, get(t, st, at("ev")).Stream)
}

// schema: a Set that breaks the cell's schema is refused with a
// *SchemaError naming the cell and each violation's path, and leaves the
// value.
func (s *suite) schema(t *testing.T) {
	st := s.store(t)
	schema := `{"type":"object","properties":{"n":{"type":"integer","minimum":0}},"required":["n"]}`
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		return tx.Declare(at("cfg"), cells.Spec{Schema: json.RawMessage(schema)})
	}))
	set(t, st, at("cfg"), `{"n":3}`)
	err := st.Update(t.Context(), func(tx cells.Tx) error {
		_, err := tx.Set(at("cfg"), json.RawMessage(`{"n":-1}`))
		return err
	})
	var se *cells.SchemaError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, at("cfg"), se.Addr)
	assert.Error(t, se.Err)
	assert.ErrorContains(t, err, "set s/p/cfg:")
	assert.ErrorContains(t, err, "/n:")
	assert.Equal(t, `{"n":3}`, value(t, st, at("cfg")), "refused write left the value")
	require.NoError(t, st.View(t.Context(), func(tx cells.Tx) error {
		spec, err := tx.Spec(at("cfg"))
		assert.JSONEq(t, schema, string(spec.Schema))
		return err
	}))

	// A refused Set fails that call only: the transaction may go on.
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		_, err := tx.Set(at("cfg"), json.RawMessage(`{}`))
		assert.ErrorAs(t, err, &se)
		_, err = tx.Set(at("other"), json.RawMessage(`1`))
		return err
	}))
	assert.Equal(t, `{"n":3}`, value(t, st, at("cfg")))
	assert.Equal(t, "1", value(t, st, at("other")))
}

// delete: Delete removes a cell with its spec and queued events, in a
// commit of its own version; deleting no cell is not an error and changes
// nothing.
func (s *suite) delete(t *testing.T) {
	st := s.store(t)
	del := func(a cells.Address) {
		t.Helper()
		require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error { return tx.Delete(a) }))
	}
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		if err := tx.Declare(at("n"), cells.Spec{Schema: json.RawMessage(`{"type":"number"}`)}); err != nil {
			return err
		}
		if _, err := tx.Set(at("n"), json.RawMessage(`1`)); err != nil {
			return err
		}
		if err := tx.Declare(at("ev"), cells.Spec{Stream: true}); err != nil {
			return err
		}
		_, err := tx.Send(at("ev"), json.RawMessage(`"queued"`))
		return err
	}))
	set(t, st, at("keep"), `true`)
	w := watch(t, st, "", st.Version())

	del(at("n"))
	_, err := st.Get(t.Context(), at("n"))
	assert.ErrorIs(t, err, cells.ErrNotFound)
	assert.Equal(t, uint64(3), st.Version())
	b := next(t, w)
	assert.Equal(t, uint64(3), b.Version)
	require.Len(t, b.Changes, 1)
	d := b.Changes[0]
	assert.True(t, d.Deleted)
	assert.Equal(t, at("n"), d.Cell.Addr)
	assert.Equal(t, "null", string(d.Cell.Value))
	assert.Equal(t, uint64(3), d.Cell.Version, "a deleted cell's change has the commit's version")
	assert.Nil(t, d.Event)
	assert.Equal(t, []string{"s/p/ev", "s/p/keep"}, names(list(t, st, "")))

	// Its spec went with it.
	set(t, st, at("n"), `"not a number"`)
	require.NoError(t, st.View(t.Context(), func(tx cells.Tx) error {
		spec, err := tx.Spec(at("n"))
		assert.Equal(t, cells.Spec{}, spec)
		return err
	}))
	next(t, w)

	// So did a stream's queued events and its receipt; event IDs go on.
	var first cells.Event
	require.NoError(t, st.View(t.Context(), func(tx cells.Tx) error {
		evs, err := tx.Events(at("ev"))
		require.Len(t, evs, 1)
		first = evs[0]
		return err
	}))
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		_, err := tx.Send(at("ev"), json.RawMessage(`"acked"`))
		require.NoError(t, err)
		return tx.Ack(at("ev"), first.ID+1)
	}))
	del(at("ev"))
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error { return tx.Declare(at("ev"), cells.Spec{Stream: true}) }))
	require.NoError(t, st.View(t.Context(), func(tx cells.Tx) error {
		evs, err := tx.Events(at("ev"))
		assert.Empty(t, evs)
		return err
	}))
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		e, err := tx.Send(at("ev"), json.RawMessage(`"again"`))
		require.NoError(t, err)
		assert.Greater(t, e.ID, first.ID+1, "an ID is never reused")
		return tx.Ack(at("ev"), first.ID+1)
	}), "the old receipt went with the stream")
	collect(t, w, 4)

	// Deleting no cell changes nothing.
	before := st.Version()
	del(at("none"))
	assert.Equal(t, before, st.Version())
	set(t, st, at("keep"), `false`)
	assert.Equal(t, before+1, next(t, w).Version, "no batch for deleting nothing")
}

// setRef: SetRef writes what Set writes, across transactions, through
// deletes, re-creations and rollbacks of its cell.
func (s *suite) setRef(t *testing.T) {
	st := s.store(t)
	_, err := cells.NewRef(cells.Address{Space: "s", Pattern: "p", Name: "a/b"})
	require.ErrorContains(t, err, "contains '/'")
	r, err := cells.NewRef(at("a"))
	require.NoError(t, err)
	assert.Equal(t, at("a"), r.Addr())
	setRef := func(v string) (changed bool) {
		t.Helper()
		require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
			changed, err = tx.SetRef(r, json.RawMessage(v))
			return err
		}))
		return changed
	}
	assert.True(t, setRef(`1`))
	assert.False(t, setRef(`1`), "unchanged")
	set(t, st, at("a"), `2`)
	assert.False(t, setRef(`2`), "sees Set's write")
	assert.True(t, setRef(`3`))
	assert.Equal(t, "3", value(t, st, at("a")))
	assert.Equal(t, uint64(3), get(t, st, at("a")).Version)
	assert.True(t, setRef(` [ 3 ] `))
	assert.Equal(t, "[3]", value(t, st, at("a")), "stored compact")

	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error { return tx.Delete(at("a")) }))
	assert.Equal(t, "(none)", value(t, st, at("a")))
	assert.True(t, setRef(`4`), "a new cell")
	assert.Equal(t, "4", value(t, st, at("a")))

	boom := errors.New("boom")
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error { return tx.Delete(at("a")) }))
	require.ErrorIs(t, st.Update(t.Context(), func(tx cells.Tx) error {
		_, err := tx.SetRef(r, json.RawMessage(`5`))
		require.NoError(t, err)
		return boom
	}), boom)
	assert.Equal(t, "(none)", value(t, st, at("a")), "rolled back")
	assert.True(t, setRef(`6`))
	assert.Equal(t, "6", value(t, st, at("a")))

	// SetRefStored returns the value as stored, apart from the buffer it
	// was given (which the caller may reuse).
	buf := []byte(` [ 7 ] `)
	var stored json.RawMessage
	var changed bool
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		stored, changed, err = tx.SetRefStored(r, buf)
		if err == nil {
			copy(buf, "xxxxxxx")
		}
		return err
	}))
	assert.True(t, changed)
	assert.Equal(t, "[7]", string(stored))
	assert.Equal(t, "[7]", value(t, st, at("a")))
	buf = append(buf[:0], "8"...)
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		stored, changed, err = tx.SetRefStored(r, buf)
		buf[0] = 'x'
		return err
	}))
	assert.True(t, changed)
	assert.Equal(t, "8", string(stored))
	assert.Equal(t, "8", value(t, st, at("a")))
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		stored, changed, err = tx.SetRefStored(r, json.RawMessage(`8`))
		return err
	}))
	assert.False(t, changed, "unchanged")
	assert.Nil(t, stored)

	// Set's checks hold: errors cleared, schemas, streams, bad JSON.
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error { _, err := tx.SetError(at("a"), "boom"); return err }))
	assert.True(t, setRef(`6`), "clears the error")
	assert.Empty(t, get(t, st, at("a")).Error)
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		return tx.Declare(at("a"), cells.Spec{Schema: json.RawMessage(`{"type":"number"}`)})
	}))
	var se *cells.SchemaError
	assert.ErrorAs(t, st.Update(t.Context(), func(tx cells.Tx) error { _, err := tx.SetRef(r, json.RawMessage(`"x"`)); return err }), &se)
	assert.Error(t, st.Update(t.Context(), func(tx cells.Tx) error { _, err := tx.SetRef(r, json.RawMessage(`{x`)); return err }))
	assert.Equal(t, "6", value(t, st, at("a")))
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error { return tx.Declare(at("ev"), cells.Spec{Stream: true}) }))
	ev, err := cells.NewRef(at("ev"))
	require.NoError(t, err)
	require.ErrorContains(t, st.Update(t.Context(), func(tx cells.Tx) error {
		_, err := tx.SetRef(ev, json.RawMessage(`1`))
		return err
	}), "it is a stream")
}

// list: List returns the cells under a prefix in address order, with
// their state (streams, errors, versions).
func (s *suite) list(t *testing.T) {
	st := s.store(t)
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		for _, a := range []string{"s/q/b", "s/p/c", "s/p/a", "t/p/a", "s/p/b"} {
			a, err := cells.Parse(a)
			require.NoError(t, err)
			if _, err := tx.Set(a, json.RawMessage(`"`+a.String()+`"`)); err != nil {
				return err
			}
		}
		return tx.Declare(at("b.run"), cells.Spec{Stream: true})
	}))
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error { _, err := tx.SetError(at("c"), "boom"); return err }))
	assert.Equal(t, []string{"s/p/a", "s/p/b", "s/p/b.run", "s/p/c", "s/q/b", "t/p/a"}, names(list(t, st, "")))
	got := list(t, st, "s/p")
	require.Equal(t, []string{"s/p/a", "s/p/b", "s/p/b.run", "s/p/c"}, names(got))
	assert.Equal(t, `"s/p/a"`, string(got[0].Value))
	assert.Equal(t, uint64(1), got[0].Version)
	assert.True(t, got[2].Stream)
	assert.Equal(t, "null", string(got[2].Value))
	assert.Equal(t, "boom", got[3].Error)
	assert.Equal(t, `"s/p/c"`, string(got[3].Value))
	assert.Equal(t, uint64(2), got[3].Version)
	sameCell(t, get(t, st, at("c")), got[3], "List and Get agree")
	assert.Empty(t, list(t, st, "x"))
}

// badInput: bad addresses, values and kinds are refused with an error
// saying so, and a failed Update commits nothing.
func (s *suite) badInput(t *testing.T) {
	st := s.store(t)
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error { return tx.Declare(at("ev"), cells.Spec{Stream: true}) }))
	set(t, st, at("v"), `1`)
	bad := cells.Address{Space: "s", Pattern: "", Name: "a"}
	slash := cells.Address{Space: "s", Pattern: "p", Name: "a/b"}
	for _, tc := range []struct {
		name string
		fn   func(tx cells.Tx) error
		err  string
	}{
		{"invalid JSON", func(tx cells.Tx) error { _, err := tx.Set(at("a"), json.RawMessage(`{x`)); return err }, "s/p/a: value is not JSON"},
		{"empty value", func(tx cells.Tx) error { _, err := tx.Set(at("a"), nil); return err }, "set s/p/a"},
		{"set a stream", func(tx cells.Tx) error { _, err := tx.Set(at("ev"), json.RawMessage(`1`)); return err }, "it is a stream"},
		{"send to a value", func(tx cells.Tx) error {
			tx.Set(at("w"), json.RawMessage(`1`))
			_, err := tx.Send(at("w"), json.RawMessage(`1`))
			return err
		}, "it is a value cell, not a stream"},
		{"send to nothing", func(tx cells.Tx) error { _, err := tx.Send(at("nope"), json.RawMessage(`1`)); return err }, "no such stream"},
		{"send invalid JSON", func(tx cells.Tx) error { _, err := tx.Send(at("ev"), json.RawMessage(`{x`)); return err }, "payload is not JSON"},
		{"send nothing", func(tx cells.Tx) error { _, err := tx.Send(at("ev"), nil); return err }, "payload is not JSON"},
		{"events of a value", func(tx cells.Tx) error { _, err := tx.Events(at("v")); return err }, "it is a value cell, not a stream"},
		{"ack on a value", func(tx cells.Tx) error { return tx.Ack(at("v"), 1) }, "it is a value cell, not a stream"},
		{"bad address", func(tx cells.Tx) error { _, err := tx.Set(bad, json.RawMessage(`1`)); return err }, "empty pattern"},
		{"redeclare kind", func(tx cells.Tx) error { return tx.Declare(at("ev"), cells.Spec{}) }, "declare s/p/ev as a value cell: it is a stream"},
		{"meta empty key", func(tx cells.Tx) error { return tx.Meta("m").Put("", []byte("v")) }, "empty key"},
	} {
		err := st.Update(t.Context(), tc.fn)
		assert.ErrorContains(t, err, tc.err, tc.name)
	}
	// An address with an empty or slashed part is refused by every call
	// that takes one.
	for _, a := range []cells.Address{bad, slash, {}} {
		_, err := st.Get(t.Context(), a)
		assert.Error(t, err, "Get %q", a)
		assert.NotErrorIs(t, err, cells.ErrNotFound, "Get %q: not a missing cell but a bad address", a)
		for name, fn := range map[string]func(tx cells.Tx) error{
			"Get":      func(tx cells.Tx) error { _, err := tx.Get(a); return err },
			"Spec":     func(tx cells.Tx) error { _, err := tx.Spec(a); return err },
			"Declare":  func(tx cells.Tx) error { return tx.Declare(a, cells.Spec{}) },
			"Set":      func(tx cells.Tx) error { _, err := tx.Set(a, json.RawMessage(`1`)); return err },
			"SetError": func(tx cells.Tx) error { _, err := tx.SetError(a, "x"); return err },
			"Delete":   func(tx cells.Tx) error { return tx.Delete(a) },
			"Send":     func(tx cells.Tx) error { _, err := tx.Send(a, json.RawMessage(`1`)); return err },
			"Events":   func(tx cells.Tx) error { _, err := tx.Events(a); return err },
			"Ack":      func(tx cells.Tx) error { return tx.Ack(a, 1) },
		} {
			assert.Error(t, st.Update(t.Context(), fn), "%s %q", name, a)
		}
	}
	assert.Equal(t, uint64(2), st.Version(), "failed updates commit nothing")
	assert.Equal(t, "(none)", value(t, st, at("w")))
	assert.Equal(t, []string{"s/p/ev", "s/p/v"}, names(list(t, st, "")))

	// A refused call writes nothing and leaves its transaction usable.
	w := watch(t, st, "", st.Version())
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		_, err := tx.Set(at("v"), json.RawMessage(`{x`))
		assert.Error(t, err)
		_, err = tx.Set(at("ev"), json.RawMessage(`1`))
		assert.Error(t, err)
		_, err = tx.Send(at("ev"), json.RawMessage(`{x`))
		assert.Error(t, err)
		_, err = tx.Send(at("v"), json.RawMessage(`1`))
		assert.Error(t, err)
		assert.Error(t, tx.Declare(at("ev"), cells.Spec{}))
		assert.Error(t, tx.Declare(at("v"), cells.Spec{Schema: json.RawMessage(`{`)}))
		assert.Error(t, tx.Delete(bad))
		assert.Error(t, tx.Meta("m").Put("", []byte("v")))
		_, err = tx.Set(at("ok"), json.RawMessage(`true`))
		return err
	}))
	b := next(t, w)
	assert.Equal(t, uint64(3), b.Version)
	require.Len(t, b.Changes, 1, "only the call that was not refused")
	assert.Equal(t, at("ok"), b.Changes[0].Cell.Addr)
	assert.Equal(t, "1", value(t, st, at("v")))
	require.NoError(t, st.View(t.Context(), func(tx cells.Tx) error {
		evs, err := tx.Events(at("ev"))
		assert.Empty(t, evs)
		spec, _ := tx.Spec(at("v"))
		assert.Equal(t, cells.Spec{}, spec)
		return err
	}))
}

// readOnly: every write in a View fails with ErrReadOnly and writes
// nothing.
func (s *suite) readOnly(t *testing.T) {
	st := s.store(t)
	var id uint64
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		if _, err := tx.Set(at("a"), json.RawMessage(`1`)); err != nil {
			return err
		}
		if err := tx.Declare(at("ev"), cells.Spec{Stream: true}); err != nil {
			return err
		}
		ev, err := tx.Send(at("ev"), json.RawMessage(`1`))
		id = ev.ID
		if err != nil {
			return err
		}
		return tx.Meta("m").Put("k", []byte("v"))
	}))
	r, err := cells.NewRef(at("a"))
	require.NoError(t, err)
	require.NoError(t, st.View(t.Context(), func(tx cells.Tx) error {
		for name, fn := range map[string]func() error{
			"Set":         func() error { _, err := tx.Set(at("a"), json.RawMessage(`2`)); return err },
			"Set new":     func() error { _, err := tx.Set(at("new"), json.RawMessage(`2`)); return err },
			"SetRef":      func() error { _, err := tx.SetRef(r, json.RawMessage(`2`)); return err },
			"SetError":    func() error { _, err := tx.SetError(at("a"), "boom"); return err },
			"Declare":     func() error { return tx.Declare(at("new"), cells.Spec{}) },
			"Delete":      func() error { return tx.Delete(at("a")) },
			"Send":        func() error { _, err := tx.Send(at("ev"), json.RawMessage(`2`)); return err },
			"Ack":         func() error { return tx.Ack(at("ev"), id) },
			"Meta.Put":    func() error { return tx.Meta("m").Put("k", []byte("w")) },
			"Meta.Delete": func() error { return tx.Meta("m").Delete("k") },
		} {
			assert.ErrorIs(t, fn(), cells.ErrReadOnly, name)
		}
		// Reads work.
		c, err := tx.Get(at("a"))
		assert.NoError(t, err)
		assert.Equal(t, "1", string(c.Value))
		evs, err := tx.Events(at("ev"))
		assert.NoError(t, err)
		assert.Len(t, evs, 1)
		v, ok := tx.Meta("m").Get("k")
		assert.True(t, ok)
		assert.Equal(t, "v", string(v))
		return nil
	}))
	assert.Equal(t, uint64(1), st.Version())
	a := get(t, st, at("a"))
	assert.Equal(t, "1", string(a.Value))
	assert.Empty(t, a.Error)
	assert.Equal(t, []string{"s/p/a", "s/p/ev"}, names(list(t, st, "")))

	// View returns fn's error.
	boom := errors.New("boom")
	assert.ErrorIs(t, st.View(t.Context(), func(cells.Tx) error { return boom }), boom)
}

// copies: byte slices a transaction returns are the caller's to keep and
// change, after the transaction too; slices passed to a write are copied
// (the caller may reuse them once the call returns).
func (s *suite) copies(t *testing.T) {
	st := s.store(t)
	val := []byte(`"value"`)
	meta := []byte("meta")
	payload := []byte(`"payload"`)
	schema := []byte(`{"type":"string"}`)
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		if err := tx.Declare(at("a"), cells.Spec{Schema: schema}); err != nil {
			return err
		}
		if _, err := tx.Set(at("a"), val); err != nil {
			return err
		}
		if err := tx.Declare(at("ev"), cells.Spec{Stream: true}); err != nil {
			return err
		}
		if _, err := tx.Send(at("ev"), payload); err != nil {
			return err
		}
		if err := tx.Meta("m").Put("k", meta); err != nil {
			return err
		}
		// The caller reuses its buffers.
		copy(val, `"XXXXX"`)
		copy(meta, "XXXX")
		copy(payload, `"XXXXXXX"`)
		copy(schema, `{"type":"number"}`)
		return nil
	}))

	scribble := func(b []byte) {
		for i := range b {
			b[i] = 'Z'
		}
	}
	var kept [][]byte
	require.NoError(t, st.View(t.Context(), func(tx cells.Tx) error {
		c, err := tx.Get(at("a"))
		require.NoError(t, err)
		l, err := tx.List("")
		require.NoError(t, err)
		require.Len(t, l, 2)
		sp, err := tx.Spec(at("a"))
		require.NoError(t, err)
		evs, err := tx.Events(at("ev"))
		require.NoError(t, err)
		require.Len(t, evs, 1)
		m, ok := tx.Meta("m").Get("k")
		require.True(t, ok)
		var each []byte
		require.NoError(t, tx.Meta("m").ForEach("", func(_ string, v []byte) error { each = v; return nil }))
		kept = [][]byte{c.Value, l[0].Value, sp.Schema, evs[0].Payload, m, each}
		return nil
	}))
	c, err := st.Get(t.Context(), at("a"))
	require.NoError(t, err)
	kept = append(kept, c.Value)
	assert.Equal(t, []string{`"value"`, `"value"`, `{"type":"string"}`, `"payload"`, "meta", "meta", `"value"`},
		[]string{string(kept[0]), string(kept[1]), string(kept[2]), string(kept[3]), string(kept[4]), string(kept[5]), string(kept[6])},
		"what was read is kept after the transaction, and writes copied what they were given")
	set(t, st, at("b"), `"more"`) // a later write does not touch what was read
	for _, b := range kept {
		scribble(b)
	}
	require.NoError(t, st.View(t.Context(), func(tx cells.Tx) error {
		c, err := tx.Get(at("a"))
		assert.NoError(t, err)
		assert.Equal(t, `"value"`, string(c.Value))
		sp, err := tx.Spec(at("a"))
		assert.NoError(t, err)
		assert.JSONEq(t, `{"type":"string"}`, string(sp.Schema))
		evs, err := tx.Events(at("ev"))
		assert.NoError(t, err)
		if assert.Len(t, evs, 1) {
			assert.Equal(t, `"payload"`, string(evs[0].Payload))
		}
		m, _ := tx.Meta("m").Get("k")
		assert.Equal(t, "meta", string(m), "changing what was read changes nothing stored")
		return nil
	}))
}
