package cellstest

import (
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/cells"
)

// readOwnWrites: a read-write transaction reads what it wrote before it
// commits.
func (s *suite) readOwnWrites(t *testing.T) {
	st := s.store(t)
	set(t, st, at("gone"), `0`)
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		_, err := tx.Set(at("a"), json.RawMessage(` [1] `))
		require.NoError(t, err)
		c, err := tx.Get(at("a"))
		require.NoError(t, err)
		assert.Equal(t, "[1]", string(c.Value))
		assert.Equal(t, tx.Version(), c.Version)

		require.NoError(t, tx.Delete(at("gone")))
		_, err = tx.Get(at("gone"))
		assert.ErrorIs(t, err, cells.ErrNotFound)

		require.NoError(t, tx.Declare(at("ev"), cells.Spec{Stream: true}))
		l, err := tx.List("")
		require.NoError(t, err)
		assert.Equal(t, []string{"s/p/a", "s/p/ev"}, names(l))

		e1, err := tx.Send(at("ev"), json.RawMessage(`1`))
		require.NoError(t, err)
		e2, err := tx.Send(at("ev"), json.RawMessage(`2`))
		require.NoError(t, err)
		evs, err := tx.Events(at("ev"))
		require.NoError(t, err)
		sameEvents(t, []cells.Event{e1, e2}, evs)
		require.NoError(t, tx.Ack(at("ev"), e1.ID))
		evs, err = tx.Events(at("ev"))
		require.NoError(t, err)
		sameEvents(t, []cells.Event{e2}, evs)

		require.NoError(t, tx.Meta("m").Put("k", []byte("v")))
		v, ok := tx.Meta("m").Get("k")
		assert.True(t, ok)
		assert.Equal(t, "v", string(v))
		return nil
	}))
	assert.Equal(t, []string{"s/p/a", "s/p/ev"}, names(list(t, st, "")))
}

// rollback: an Update whose fn returns an error or panics writes nothing
// (cells, specs, events, acks, meta), takes no version and sends no batch;
// the panic goes on to Update's caller, and the store works on.
func (s *suite) rollback(t *testing.T) {
	st := s.store(t)
	set(t, st, at("a"), `1`)
	var first cells.Event
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		if err := tx.Declare(at("ev"), cells.Spec{Stream: true}); err != nil {
			return err
		}
		var err error
		first, err = tx.Send(at("ev"), json.RawMessage(`"first"`))
		return err
	}))
	w := watch(t, st, "", st.Version())
	boom := errors.New("boom")
	err := st.Update(t.Context(), func(tx cells.Tx) error {
		tx.Set(at("a"), json.RawMessage(`2`))
		tx.Set(at("new"), json.RawMessage(`3`))
		require.NoError(t, tx.Declare(at("n"), cells.Spec{Schema: json.RawMessage(`{"type":"number"}`)}))
		require.NoError(t, tx.Declare(at("a"), cells.Spec{Schema: json.RawMessage(`{"type":"string"}`)}))
		_, err := tx.Send(at("ev"), json.RawMessage(`"second"`))
		require.NoError(t, err)
		require.NoError(t, tx.Ack(at("ev"), first.ID))
		require.NoError(t, tx.Meta("m").Put("k", []byte("v")))
		return boom
	})
	assert.ErrorIs(t, err, boom, "Update returns fn's error")
	assert.Panics(t, func() {
		st.Update(t.Context(), func(tx cells.Tx) error {
			tx.Set(at("a"), json.RawMessage(`4`))
			tx.Delete(at("ev"))
			tx.Meta("m").Put("p", []byte("panicked"))
			panic("mid-transaction")
		})
	})
	assert.Equal(t, "1", value(t, st, at("a")))
	assert.Equal(t, "(none)", value(t, st, at("new")))
	assert.Equal(t, "(none)", value(t, st, at("n")))
	require.NoError(t, st.View(t.Context(), func(tx cells.Tx) error {
		spec, err := tx.Spec(at("a"))
		assert.Equal(t, cells.Spec{}, spec)
		require.NoError(t, err)
		evs, err := tx.Events(at("ev"))
		require.NoError(t, err)
		sameEvents(t, []cells.Event{first}, evs, "the sent event rolled back, the acked one still queued")
		_, ok := tx.Meta("m").Get("k")
		assert.False(t, ok)
		_, ok = tx.Meta("m").Get("p")
		assert.False(t, ok)
		return nil
	}))
	assert.Equal(t, uint64(2), st.Version())

	// The store works on, and the next commit takes the next version.
	within(t, "an Update after a panicking one", func() {
		assert.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
			_, err := tx.Set(at("a"), json.RawMessage(`5`))
			return err
		}))
	})
	b := next(t, w)
	assert.Equal(t, uint64(3), b.Version, "no batch for the rolled back updates")
	require.Len(t, b.Changes, 1)
	assert.Equal(t, "5", string(b.Changes[0].Cell.Value))
}

// setDeleteSet: a cell set, deleted and set again in one transaction ends
// with the last value; rolled back, with its value from before; the batch
// lists its changes so that applying them in order leaves that value.
func (s *suite) setDeleteSet(t *testing.T) {
	st := s.store(t)
	set(t, st, at("a"), `1`)
	w := watch(t, st, "", st.Version())
	setDeleteSet := func(last string) func(tx cells.Tx) error {
		return func(tx cells.Tx) error {
			_, err := tx.Set(at("a"), json.RawMessage(`2`))
			require.NoError(t, err)
			require.NoError(t, tx.Delete(at("a")))
			_, err = tx.Set(at("a"), json.RawMessage(last))
			return err
		}
	}
	boom := errors.New("boom")
	err := st.Update(t.Context(), func(tx cells.Tx) error {
		require.NoError(t, setDeleteSet(`3`)(tx))
		return boom
	})
	require.ErrorIs(t, err, boom)
	assert.Equal(t, "1", value(t, st, at("a")), "rolled back")

	require.NoError(t, st.Update(t.Context(), setDeleteSet(`4`)))
	a := get(t, st, at("a"))
	assert.Equal(t, "4", string(a.Value))
	assert.Equal(t, uint64(2), a.Version)
	all := list(t, st, "s/p/")
	require.Len(t, all, 1)
	assert.Equal(t, "4", string(all[0].Value))

	b := next(t, w)
	assert.Equal(t, uint64(2), b.Version)
	type change struct {
		value   string
		deleted bool
	}
	var got []change
	for _, c := range b.Changes {
		assert.Equal(t, at("a"), c.Cell.Addr)
		assert.Equal(t, uint64(2), c.Cell.Version)
		assert.True(t, a.Changed.Equal(c.Cell.Changed), "the commit's time, on a Deleted change too")
		got = append(got, change{string(c.Cell.Value), c.Deleted})
	}
	assert.Equal(t, []change{{"2", false}, {"null", true}, {"4", false}}, got,
		"the writes before the Delete, the Delete, the writes after it")
}

// updateWithoutChanges: an Update that changes no cell — it only reads,
// writes values equal to the stored ones, changes specs, acks events or
// writes Meta — takes no version and sends no batch; what it wrote
// commits all the same.
func (s *suite) updateWithoutChanges(t *testing.T) {
	st := s.store(t)
	var ev cells.Event
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		if _, err := tx.Set(at("a"), json.RawMessage(`1`)); err != nil {
			return err
		}
		if err := tx.Declare(at("ev"), cells.Spec{Stream: true}); err != nil {
			return err
		}
		var err error
		ev, err = tx.Send(at("ev"), json.RawMessage(`1`))
		return err
	}))
	w := watch(t, st, "", 1)
	for _, c := range []struct {
		name string
		fn   func(tx cells.Tx) error
	}{
		{"nothing", func(cells.Tx) error { return nil }},
		{"reads", func(tx cells.Tx) error {
			_, err := tx.Get(at("a"))
			_, _ = tx.Meta("m").Get("k")
			return err
		}},
		{"equal value", func(tx cells.Tx) error { _, err := tx.Set(at("a"), json.RawMessage(` 1 `)); return err }},
		{"same spec", func(tx cells.Tx) error { return tx.Declare(at("a"), cells.Spec{}) }},
		{"schema", func(tx cells.Tx) error {
			return tx.Declare(at("a"), cells.Spec{Schema: json.RawMessage(`{"type":"number"}`)})
		}},
		{"no error to clear", func(tx cells.Tx) error { _, err := tx.SetError(at("a"), ""); return err }},
		{"delete nothing", func(tx cells.Tx) error { return tx.Delete(at("none")) }},
		{"ack", func(tx cells.Tx) error { return tx.Ack(at("ev"), ev.ID) }},
		{"meta", func(tx cells.Tx) error { return tx.Meta("m").Put("k", []byte("v")) }},
	} {
		require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
			assert.Equal(t, uint64(2), tx.Version(), "%s: the version its writes would get", c.name)
			return c.fn(tx)
		}), c.name)
		assert.Equal(t, uint64(1), st.Version(), c.name)
	}
	require.NoError(t, st.View(t.Context(), func(tx cells.Tx) error {
		evs, err := tx.Events(at("ev"))
		assert.Empty(t, evs, "the ack committed")
		v, _ := tx.Meta("m").Get("k")
		assert.Equal(t, "v", string(v), "the meta write committed")
		spec, _ := tx.Spec(at("a"))
		assert.JSONEq(t, `{"type":"number"}`, string(spec.Schema), "the schema committed")
		return err
	}))
	set(t, st, at("a"), `2`)
	b := next(t, w)
	assert.Equal(t, uint64(2), b.Version, "the first batch is the next change")
	assert.Equal(t, "2", string(b.Changes[0].Cell.Value))
}

// concurrentUpdates: Updates are serializable (read-modify-write loses
// nothing, of cells or of Meta), a View sees a commit whole or not at all,
// and a watcher gets every commit once, in order, whole.
func (s *suite) concurrentUpdates(t *testing.T) {
	st := s.store(t)
	const writers, each = 4, 20
	w := watch(t, st, "", 0)
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for range 2 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				err := st.View(t.Context(), func(tx cells.Tx) error {
					n, errN := tx.Get(at("n"))
					m, errM := tx.Get(at("m"))
					if errors.Is(errN, cells.ErrNotFound) && errors.Is(errM, cells.ErrNotFound) {
						return nil
					}
					if !noErr(t, errN) || !noErr(t, errM) {
						return nil
					}
					assert.Equal(t, string(n.Value), string(m.Value), "a View sees a commit whole")
					assert.Equal(t, n.Version, m.Version)
					assert.LessOrEqual(t, n.Version, tx.Version())
					return nil
				})
				if !noErr(t, err) {
					return
				}
			}
		}()
	}
	var writersWG sync.WaitGroup
	for range writers {
		writersWG.Add(1)
		go func() {
			defer writersWG.Done()
			for range each {
				err := st.Update(t.Context(), func(tx cells.Tx) error {
					n := 0
					if c, err := tx.Get(at("n")); err == nil {
						if n, err = strconv.Atoi(string(c.Value)); err != nil {
							return err
						}
					} else if !errors.Is(err, cells.ErrNotFound) {
						return err
					}
					v := json.RawMessage(strconv.Itoa(n + 1))
					if _, err := tx.Set(at("n"), v); err != nil {
						return err
					}
					_, err := tx.Set(at("m"), v)
					return err
				})
				if !noErr(t, err) {
					return
				}
			}
		}()
	}
	// Writers of Meta alone: commits that change no cell (no version).
	for range writers {
		writersWG.Add(1)
		go func() {
			defer writersWG.Done()
			for range each {
				err := st.Update(t.Context(), func(tx cells.Tx) error {
					n := 0
					if v, ok := tx.Meta("m").Get("n"); ok {
						var err error
						if n, err = strconv.Atoi(string(v)); err != nil {
							return err
						}
					}
					return tx.Meta("m").Put("n", []byte(strconv.Itoa(n+1)))
				})
				if !noErr(t, err) {
					return
				}
			}
		}()
	}
	within(t, "the writers", writersWG.Wait)
	close(stop)
	within(t, "the readers", readers.Wait)
	assert.Equal(t, strconv.Itoa(writers*each), value(t, st, at("n")), "no update lost")
	assert.Equal(t, uint64(writers*each), st.Version())
	require.NoError(t, st.View(t.Context(), func(tx cells.Tx) error {
		v, _ := tx.Meta("m").Get("n")
		assert.Equal(t, strconv.Itoa(writers*each), string(v), "no update of Meta lost")
		return nil
	}))

	bs := collect(t, w, writers*each)
	for i, b := range bs {
		assert.Equal(t, uint64(i+1), b.Version)
		if assert.Len(t, b.Changes, 2, "version %d", b.Version) {
			assert.Equal(t, strconv.Itoa(i+1), string(b.Changes[0].Cell.Value))
			assert.Equal(t, strconv.Itoa(i+1), string(b.Changes[1].Cell.Value))
		}
	}
}

// interleavedUpdates: an Update that another Update commits in the midst
// of loses nothing, of cells or of Meta (in commits that change a cell,
// and in commits that change none). Over a store whose Updates run one at
// a time, the other waits for it; over one whose Updates run at once (an
// optimistic KV), the other commits while the first's fn runs, so the
// first's commit conflicts and its fn runs again, reading what the other
// wrote.
func (s *suite) interleavedUpdates(t *testing.T) {
	st := s.store(t)
	for _, round := range []struct {
		name  string
		cells bool // write a cell too, not Meta alone
	}{{"a cell and Meta", true}, {"Meta alone", false}} {
		// incr reads the counters; the func it returns writes them plus 1.
		incr := func(tx cells.Tx) func() error {
			n, m := 0, 0
			if c, err := tx.Get(at("n")); err == nil {
				n, _ = strconv.Atoi(string(c.Value))
			}
			if v, ok := tx.Meta("m").Get("n"); ok {
				m, _ = strconv.Atoi(string(v))
			}
			return func() error {
				if round.cells {
					if _, err := tx.Set(at("n"), json.RawMessage(strconv.Itoa(n+1))); err != nil {
						return err
					}
				}
				return tx.Meta("m").Put("n", []byte(strconv.Itoa(m+1)))
			}
		}
		var (
			runs, otherRuns int
			otherStarted    = make(chan struct{})
			otherDone       = make(chan error, 1)
			start, started  sync.Once
			otherCommitted  bool // while the first fn ran
		)
		within(t, "the updates", func() {
			noErr(t, st.Update(t.Context(), func(tx cells.Tx) error {
				runs++
				write := incr(tx)
				start.Do(func() {
					go func() {
						otherDone <- st.Update(t.Context(), func(tx cells.Tx) error {
							otherRuns++
							started.Do(func() { close(otherStarted) })
							return incr(tx)()
						})
					}()
					select {
					case <-otherStarted: // it runs at once: let it commit
						select {
						case err := <-otherDone:
							noErr(t, err)
							otherCommitted = true
						case <-time.After(wait / 4):
						}
					case <-time.After(200 * time.Millisecond): // it waits for this one
					}
				})
				return write()
			}))
			if !otherCommitted {
				noErr(t, <-otherDone)
			}
		})
		if otherCommitted {
			assert.Equal(t, 2, runs, "%s: the first fn ran again after the other committed", round.name)
			assert.Equal(t, 1, otherRuns, round.name)
		} else {
			assert.Equal(t, 1, runs, "%s: one fn at a time, each once", round.name)
		}
	}
	assert.Equal(t, "2", value(t, st, at("n")), "no update of a cell lost")
	require.NoError(t, st.View(t.Context(), func(tx cells.Tx) error {
		v, _ := tx.Meta("m").Get("n")
		assert.Equal(t, "4", string(v), "no update of Meta lost")
		return nil
	}))
	assert.Equal(t, uint64(2), st.Version())
}

// meta: Meta buckets keep a client's own keys and values, apart from each
// other and from cells, in key order; their writes commit with the
// transaction and cause no notification.
func (s *suite) meta(t *testing.T) {
	st := s.store(t)
	w := watch(t, st, "", 0)
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		m := tx.Meta("nodes")
		for _, k := range []string{"b", "a", "c", "x", "ab"} {
			require.NoError(t, m.Put(k, []byte("v"+k)))
		}
		require.NoError(t, m.Put("empty", []byte{}))
		require.NoError(t, m.Put("a", []byte("va2")), "a Put replaces")
		require.NoError(t, m.Delete("none"), "a missing key is not an error")
		require.NoError(t, tx.Meta("nodes.x").Put("a", []byte("other bucket")))
		return m.Delete("x")
	}))
	assert.Equal(t, uint64(0), st.Version(), "meta writes are not cell changes")
	require.NoError(t, st.View(t.Context(), func(tx cells.Tx) error {
		v, ok := tx.Meta("nodes").Get("a")
		assert.True(t, ok)
		assert.Equal(t, "va2", string(v))
		v, ok = tx.Meta("nodes").Get("empty")
		assert.True(t, ok, "an empty value is stored")
		assert.Empty(t, v)
		_, ok = tx.Meta("nodes").Get("x")
		assert.False(t, ok, "deleted")
		var keys []string
		require.NoError(t, tx.Meta("nodes").ForEach("", func(k string, _ []byte) error { keys = append(keys, k); return nil }))
		assert.Equal(t, []string{"a", "ab", "b", "c", "empty"}, keys)
		keys = nil
		var vals []string
		require.NoError(t, tx.Meta("nodes").ForEach("a", func(k string, v []byte) error {
			keys, vals = append(keys, k), append(vals, string(v))
			return nil
		}))
		assert.Equal(t, []string{"a", "ab"}, keys, "keys starting with the prefix")
		assert.Equal(t, []string{"va2", "vab"}, vals)
		stop := errors.New("stop")
		keys = nil
		err := tx.Meta("nodes").ForEach("", func(k string, _ []byte) error { keys = append(keys, k); return stop })
		assert.ErrorIs(t, err, stop, "ForEach returns fn's error")
		assert.Equal(t, []string{"a"}, keys, "and stops there")
		require.NoError(t, tx.Meta("none").ForEach("", func(string, []byte) error { t.Error("a key in an empty bucket"); return nil }))
		_, ok = tx.Meta("other").Get("a")
		assert.False(t, ok, "buckets are apart")
		v, _ = tx.Meta("nodes.x").Get("a")
		assert.Equal(t, "other bucket", string(v))
		l, err := tx.List("")
		assert.Empty(t, l, "meta keys are not cells")
		return err
	}))
	set(t, st, at("a"), `1`)
	assert.Equal(t, uint64(1), next(t, w).Version, "no batch for the meta writes")
}
