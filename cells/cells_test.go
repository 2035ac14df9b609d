package cells

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// backend opens a fresh store; reopen (nil for memory) reopens it over
// the same data after Close.
type backend struct {
	name string
	open func(t *testing.T, opts Options) (s Store, reopen func() Store)
}

func backends() []backend {
	return []backend{
		{"memory", func(t *testing.T, opts Options) (Store, func() Store) {
			s := NewMemory(opts)
			t.Cleanup(func() { s.Close() })
			return s, nil
		}},
		{"bolt", func(t *testing.T, opts Options) (Store, func() Store) {
			path := filepath.Join(t.TempDir(), "cells.db")
			s, err := OpenBolt(path, opts)
			require.NoError(t, err)
			t.Cleanup(func() { s.Close() })
			return s, func() Store {
				s, err := OpenBolt(path, opts)
				require.NoError(t, err)
				t.Cleanup(func() { s.Close() })
				return s
			}
		}},
	}
}

// each runs a test against both stores.
func each(t *testing.T, fn func(t *testing.T, b backend)) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) { fn(t, b) })
	}
}

func addr(name string) Address { return Address{"s", "p", name} }

func set(t *testing.T, s Store, name, value string) {
	t.Helper()
	require.NoError(t, s.Update(func(tx Tx) error {
		_, err := tx.Set(addr(name), json.RawMessage(value))
		return err
	}))
}

func TestAddress(t *testing.T) {
	for _, tc := range []struct {
		in, err string
	}{
		{"space/pat/name", ""},
		{"space/pat/node.run", ""},
		{"space/pat", "want space/pattern/name"},
		{"a/b/c/d", "want space/pattern/name"},
		{"a//c", "empty pattern"},
		{"/b/c", "empty space"},
	} {
		a, err := Parse(tc.in)
		if tc.err != "" {
			assert.ErrorContains(t, err, tc.err, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.in, a.String())
	}
	assert.ErrorContains(t, Address{"s", "p", "a/b"}.Valid(), `name "a/b" contains '/'`)
}

func TestSetGetVersions(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		s, _ := b.open(t, Options{})
		assert.Equal(t, uint64(0), s.Version())
		_, err := s.Get(addr("a"))
		assert.ErrorIs(t, err, ErrNotFound)

		// Several writes, one commit, one version.
		require.NoError(t, s.Update(func(tx Tx) error {
			assert.Equal(t, uint64(1), tx.Version())
			for _, n := range []string{"a", "b"} {
				changed, err := tx.Set(addr(n), json.RawMessage(`{ "x" : 1 }`))
				require.NoError(t, err)
				assert.True(t, changed)
			}
			return nil
		}))
		a, err := s.Get(addr("a"))
		require.NoError(t, err)
		assert.JSONEq(t, `{"x":1}`, string(a.Value))
		assert.Equal(t, `{"x":1}`, string(a.Value), "stored compact")
		assert.Equal(t, uint64(1), a.Version)
		assert.WithinDuration(t, time.Now(), a.Changed, time.Minute)
		assert.Equal(t, uint64(1), s.Version())

		// An equal value changes nothing and takes no version.
		require.NoError(t, s.Update(func(tx Tx) error {
			changed, err := tx.Set(addr("a"), json.RawMessage(`{"x":1}`))
			assert.False(t, changed)
			return err
		}))
		assert.Equal(t, uint64(1), s.Version())

		set(t, s, "b", `2`)
		bc, _ := s.Get(addr("b"))
		assert.Equal(t, uint64(2), bc.Version)

		// Errors keep the value; Set clears them.
		require.NoError(t, s.Update(func(tx Tx) error {
			_, err := tx.SetError(addr("b"), "boom")
			return err
		}))
		bc, _ = s.Get(addr("b"))
		assert.Equal(t, "boom", bc.Error)
		assert.Equal(t, "2", string(bc.Value))
		set(t, s, "b", `2`)
		bc, _ = s.Get(addr("b"))
		assert.Empty(t, bc.Error)

		var list []Cell
		require.NoError(t, s.View(func(tx Tx) error {
			list, err = tx.List("s/p/")
			return err
		}))
		require.Len(t, list, 2)
		assert.Equal(t, "a", list[0].Addr.Name)
	})
}

func TestBadWrites(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		s, _ := b.open(t, Options{})
		require.NoError(t, s.Update(func(tx Tx) error { return tx.Declare(addr("ev"), Spec{Stream: true}) }))
		for _, tc := range []struct {
			name string
			fn   func(tx Tx) error
			err  string
		}{
			{"invalid JSON", func(tx Tx) error { _, err := tx.Set(addr("a"), json.RawMessage(`{x`)); return err }, "s/p/a: value is not JSON"},
			{"set a stream", func(tx Tx) error { _, err := tx.Set(addr("ev"), json.RawMessage(`1`)); return err }, "it is a stream"},
			{"send to a value", func(tx Tx) error {
				tx.Set(addr("v"), json.RawMessage(`1`))
				_, err := tx.Send(addr("v"), json.RawMessage(`1`))
				return err
			}, "it is a value cell, not a stream"},
			{"send to nothing", func(tx Tx) error { _, err := tx.Send(addr("nope"), json.RawMessage(`1`)); return err }, "no such stream"},
			{"bad address", func(tx Tx) error { _, err := tx.Set(Address{"s", "", "a"}, json.RawMessage(`1`)); return err }, "empty pattern"},
			{"redeclare kind", func(tx Tx) error { return tx.Declare(addr("ev"), Spec{}) }, "declare s/p/ev as a value cell: it is a stream"},
		} {
			err := s.Update(tc.fn)
			assert.ErrorContains(t, err, tc.err, tc.name)
		}
		assert.Equal(t, uint64(1), s.Version(), "failed updates commit nothing")
		assert.Error(t, s.View(func(tx Tx) error { _, err := tx.Set(addr("a"), json.RawMessage(`1`)); return err }), "read-only")
	})
}

func TestRollback(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		s, _ := b.open(t, Options{})
		set(t, s, "a", `1`)
		boom := errors.New("boom")
		err := s.Update(func(tx Tx) error {
			tx.Set(addr("a"), json.RawMessage(`2`))
			tx.Set(addr("new"), json.RawMessage(`3`))
			require.NoError(t, tx.Meta("m").Put("k", []byte("v")))
			return boom
		})
		assert.ErrorIs(t, err, boom)
		assert.Panics(t, func() {
			s.Update(func(tx Tx) error {
				tx.Set(addr("a"), json.RawMessage(`4`))
				panic("mid-transaction")
			})
		})
		a, _ := s.Get(addr("a"))
		assert.Equal(t, "1", string(a.Value))
		_, err = s.Get(addr("new"))
		assert.ErrorIs(t, err, ErrNotFound)
		require.NoError(t, s.View(func(tx Tx) error {
			_, ok := tx.Meta("m").Get("k")
			assert.False(t, ok)
			return nil
		}))
		assert.Equal(t, uint64(1), s.Version())
	})
}

// A cell set, deleted and set again in one transaction ends with the last
// value, once; rolled back, with its value from before.
func TestSetDeleteSetInOneTransaction(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		s, _ := b.open(t, Options{})
		set(t, s, "a", `1`)
		setDeleteSet := func(last string) func(tx Tx) error {
			return func(tx Tx) error {
				_, err := tx.Set(addr("a"), json.RawMessage(`2`))
				require.NoError(t, err)
				require.NoError(t, tx.Delete(addr("a")))
				_, err = tx.Set(addr("a"), json.RawMessage(last))
				return err
			}
		}
		boom := errors.New("boom")
		err := s.Update(func(tx Tx) error {
			require.NoError(t, setDeleteSet(`3`)(tx))
			return boom
		})
		require.ErrorIs(t, err, boom)
		a, err := s.Get(addr("a"))
		require.NoError(t, err)
		assert.Equal(t, "1", string(a.Value), "rolled back")

		require.NoError(t, s.Update(setDeleteSet(`4`)))
		a, err = s.Get(addr("a"))
		require.NoError(t, err)
		assert.Equal(t, "4", string(a.Value))
		var all []Cell
		require.NoError(t, s.View(func(tx Tx) error {
			all, err = tx.List("s/p/")
			return err
		}))
		require.Len(t, all, 1)
		assert.Equal(t, "4", string(all[0].Value))
	})
}

// SetRef writes what Set writes, across transactions, through deletes,
// re-creations and rollbacks of its cell (the memory store's remembered
// entry must not outlive the cell).
func TestSetRef(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		s, _ := b.open(t, Options{})
		_, err := NewRef(Address{"s", "p", "a/b"})
		require.ErrorContains(t, err, "contains '/'")
		r, err := NewRef(addr("a"))
		require.NoError(t, err)
		assert.Equal(t, addr("a"), r.Addr())
		setRef := func(v string) (changed bool) {
			require.NoError(t, s.Update(func(tx Tx) error {
				changed, err = tx.SetRef(r, json.RawMessage(v))
				return err
			}))
			return changed
		}
		value := func() string {
			c, err := s.Get(addr("a"))
			if errors.Is(err, ErrNotFound) {
				return "(none)"
			}
			require.NoError(t, err)
			return string(c.Value)
		}
		assert.True(t, setRef(`1`))
		assert.False(t, setRef(`1`), "unchanged")
		set(t, s, "a", `2`)
		assert.False(t, setRef(`2`), "sees Set's write")
		assert.True(t, setRef(`3`))
		assert.Equal(t, "3", value())

		require.NoError(t, s.Update(func(tx Tx) error { return tx.Delete(addr("a")) }))
		assert.Equal(t, "(none)", value())
		assert.True(t, setRef(`4`), "a new cell")
		assert.Equal(t, "4", value())

		boom := errors.New("boom")
		require.NoError(t, s.Update(func(tx Tx) error { return tx.Delete(addr("a")) }))
		require.ErrorIs(t, s.Update(func(tx Tx) error {
			_, err := tx.SetRef(r, json.RawMessage(`5`))
			require.NoError(t, err)
			return boom
		}), boom)
		assert.Equal(t, "(none)", value(), "rolled back")
		assert.True(t, setRef(`6`))
		assert.Equal(t, "6", value())

		require.NoError(t, s.Update(func(tx Tx) error { return tx.Declare(addr("ev"), Spec{Stream: true}) }))
		ev, err := NewRef(addr("ev"))
		require.NoError(t, err)
		require.ErrorContains(t, s.Update(func(tx Tx) error {
			_, err := tx.SetRef(ev, json.RawMessage(`1`))
			return err
		}), "it is a stream")
	})
}

func TestSchema(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		s, _ := b.open(t, Options{})
		schema := `{"type":"object","properties":{"n":{"type":"integer","minimum":0}},"required":["n"]}`
		require.NoError(t, s.Update(func(tx Tx) error {
			return tx.Declare(addr("cfg"), Spec{Schema: json.RawMessage(schema)})
		}))
		set(t, s, "cfg", `{"n":3}`)
		err := s.Update(func(tx Tx) error {
			_, err := tx.Set(addr("cfg"), json.RawMessage(`{"n":-1}`))
			return err
		})
		var se *SchemaError
		require.ErrorAs(t, err, &se)
		assert.Equal(t, addr("cfg"), se.Addr)
		assert.ErrorContains(t, err, "set s/p/cfg:")
		assert.ErrorContains(t, err, "/n:")
		c, _ := s.Get(addr("cfg"))
		assert.Equal(t, `{"n":3}`, string(c.Value), "refused write left the value")
		require.NoError(t, s.View(func(tx Tx) error {
			spec, err := tx.Spec(addr("cfg"))
			assert.JSONEq(t, schema, string(spec.Schema))
			return err
		}))
	})
}

func TestMeta(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		s, _ := b.open(t, Options{})
		require.NoError(t, s.Update(func(tx Tx) error {
			m := tx.Meta("nodes")
			for _, k := range []string{"b", "a", "c", "x"} {
				require.NoError(t, m.Put(k, []byte("v"+k)))
			}
			return m.Delete("x")
		}))
		assert.Equal(t, uint64(0), s.Version(), "meta writes are not cell changes")
		require.NoError(t, s.View(func(tx Tx) error {
			v, ok := tx.Meta("nodes").Get("a")
			assert.True(t, ok)
			assert.Equal(t, "va", string(v))
			var keys []string
			require.NoError(t, tx.Meta("nodes").ForEach("", func(k string, _ []byte) error { keys = append(keys, k); return nil }))
			assert.Equal(t, []string{"a", "b", "c"}, keys)
			_, ok = tx.Meta("other").Get("a")
			assert.False(t, ok)
			return nil
		}))
	})
}

func collect(t *testing.T, ch <-chan Batch, n int) []Batch {
	t.Helper()
	var out []Batch
	for len(out) < n {
		select {
		case b, ok := <-ch:
			require.True(t, ok, "watch closed")
			out = append(out, b)
		case <-time.After(5 * time.Second):
			t.Fatalf("got %d batches, want %d", len(out), n)
		}
	}
	return out
}

func TestWatch(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		s, _ := b.open(t, Options{})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		set(t, s, "a", `1`)
		require.NoError(t, s.Update(func(tx Tx) error {
			tx.Set(addr("a"), json.RawMessage(`2`))
			tx.Set(addr("b"), json.RawMessage(`3`))
			tx.Set(addr("a"), json.RawMessage(`4`))
			_, err := tx.Set(Address{"s", "other", "z"}, json.RawMessage(`0`))
			return err
		}))

		// Replay from the start, filtered by prefix, then live.
		all, err := s.Watch(ctx, "s/p/", 0)
		require.NoError(t, err)
		got := collect(t, all, 2)
		assert.Equal(t, uint64(1), got[0].Version)
		assert.Equal(t, uint64(2), got[1].Version)
		require.Len(t, got[1].Changes, 2, "one change per cell, the last write")
		assert.Equal(t, "a", got[1].Changes[0].Cell.Addr.Name)
		assert.Equal(t, "4", string(got[1].Changes[0].Cell.Value))
		assert.Equal(t, uint64(2), got[1].Changes[0].Cell.Version)

		// A reconnecting client resumes from the last version it saw.
		resumed, err := s.Watch(ctx, "", 1)
		require.NoError(t, err)
		r := collect(t, resumed, 1)
		assert.Equal(t, uint64(2), r[0].Version)
		assert.Len(t, r[0].Changes, 3)

		set(t, s, "c", `"live"`)
		live := collect(t, all, 1)[0]
		assert.Equal(t, uint64(3), live.Version)
		assert.False(t, live.Snapshot)
		assert.Equal(t, `"live"`, string(live.Changes[0].Cell.Value))
		collect(t, resumed, 1)

		// Changes outside the prefix are not sent.
		set(t, s, "c", `"x"`)
		require.NoError(t, s.Update(func(tx Tx) error { _, err := tx.Set(Address{"s", "other", "z"}, json.RawMessage(`9`)); return err }))
		set(t, s, "c", `"y"`)
		got = collect(t, all, 2)
		assert.Equal(t, []uint64{4, 6}, []uint64{got[0].Version, got[1].Version})

		// Deletes are changes too.
		require.NoError(t, s.Update(func(tx Tx) error { return tx.Delete(addr("c")) }))
		d := collect(t, all, 1)[0]
		assert.True(t, d.Changes[0].Deleted)
		assert.Equal(t, uint64(7), d.Changes[0].Cell.Version)

		cancel()
		for range all {
		}
	})
}

// A prefix names whole segments of an address (space / pattern / name,
// and a node's streams after its name: "repl.run"), in List and Watch
// alike: big/s is not big/small.
func TestPrefixWholeSegments(t *testing.T) {
	addrs := []string{
		"default/big/s", "default/big/s.run", "default/big/small", "default/big/small.run",
		"default/big.v2/s", "default/bigger/s", "big/s/a", "big/small/a", "bigs/s/a",
	}
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{"", addrs},
		{"default", addrs[:6]},
		{"default/", addrs[:6]},
		{"def", nil},
		{"default/big", addrs[:4]},
		{"default/big/", addrs[:4]},
		{"default/bi", nil},
		{"default/big.v2", []string{"default/big.v2/s"}},
		{"default/big.", nil},
		{"default/big/s", []string{"default/big/s", "default/big/s.run"}},
		{"default/big/s.", []string{"default/big/s.run"}},
		{"default/big/s.run", []string{"default/big/s.run"}},
		{"default/big/s.r", nil},
		{"default/big/sm", nil},
		{"default/big/s/", nil},
		{"big", []string{"big/s/a", "big/small/a"}},
		{"big/s", []string{"big/s/a"}},
		{"big/s/", []string{"big/s/a"}},
		{"big/sm", nil},
		{"big/s/a", []string{"big/s/a"}},
		{"big/s/a/", nil},
	} {
		t.Run(tc.prefix, func(t *testing.T) {
			each(t, func(t *testing.T, b backend) {
				s, _ := b.open(t, Options{})
				require.NoError(t, s.Update(func(tx Tx) error {
					for _, a := range addrs {
						a, err := Parse(a)
						require.NoError(t, err)
						if _, err := tx.Set(a, json.RawMessage(`1`)); err != nil {
							return err
						}
					}
					return nil
				}))
				want := slices.Sorted(slices.Values(tc.want))
				var got []string
				require.NoError(t, s.View(func(tx Tx) error {
					list, err := tx.List(tc.prefix)
					for _, c := range list {
						got = append(got, c.Addr.String())
					}
					return err
				}))
				assert.Equal(t, want, got, "List(%q), in address order", tc.prefix)

				if len(tc.want) == 0 {
					return // a watch with nothing to send sends nothing
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				w, err := s.Watch(ctx, tc.prefix, 0)
				require.NoError(t, err)
				batch := collect(t, w, 1)[0]
				got = nil
				for _, c := range batch.Changes {
					got = append(got, c.Cell.Addr.String())
				}
				assert.ElementsMatch(t, want, got, "Watch(%q) replaying the log", tc.prefix)
				w, err = s.Watch(ctx, tc.prefix, 99)
				require.NoError(t, err)
				batch = collect(t, w, 1)[0]
				require.True(t, batch.Snapshot)
				got = nil
				for _, c := range batch.Changes {
					got = append(got, c.Cell.Addr.String())
				}
				assert.Equal(t, want, got, "Watch(%q)'s snapshot", tc.prefix)
			})
		})
	}
}

func TestWatchCompacted(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		s, _ := b.open(t, Options{LogLimit: 3})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		for i := range 10 {
			set(t, s, "a", string(rune('0'+i)))
		}
		set(t, s, "b", `true`)
		// Version 11; the log keeps 9..11. From 8 replays; from 7 snapshots.
		w, err := s.Watch(ctx, "", 8)
		require.NoError(t, err)
		got := collect(t, w, 3)
		assert.Equal(t, uint64(9), got[0].Version)
		assert.False(t, got[0].Snapshot)

		w, err = s.Watch(ctx, "s/p/", 2)
		require.NoError(t, err)
		snap := collect(t, w, 1)[0]
		assert.True(t, snap.Snapshot)
		assert.Equal(t, uint64(11), snap.Version)
		require.Len(t, snap.Changes, 2)
		assert.Equal(t, "9", string(snap.Changes[0].Cell.Value))
		assert.Equal(t, "true", string(snap.Changes[1].Cell.Value))
		set(t, s, "a", `"after"`)
		assert.Equal(t, uint64(12), collect(t, w, 1)[0].Version, "live after the snapshot")

		// A version from the future (another store) also gets a snapshot.
		w, err = s.Watch(ctx, "", 99)
		require.NoError(t, err)
		assert.True(t, collect(t, w, 1)[0].Snapshot)
	})
}

// TestLogBytes: the change log keeps at most LogBytes of entries (it kept
// LogLimit commits whatever their size: 10,000 commits of a 10 MB value
// would be 100 GB), the newest always, and counts a store's log from
// before the count once; a watch from before the log's start gets a
// snapshot, as past LogLimit.
func TestLogBytes(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		s, _ := b.open(t, Options{LogBytes: 1 << 20})
		big := func(c byte) string { return `"` + string(bytes.Repeat([]byte{c}, 300<<10)) + `"` }
		for i := range 10 {
			set(t, s, "a", big(byte('a'+i)))
		}
		logStart := func() (start, size uint64) {
			require.NoError(t, s.View(func(x Tx) error {
				info, err := x.(*tx).bucket(bucketInfo)
				require.NoError(t, err)
				start, size = readU64(info.get(keyLogStart)), readU64(info.get(keyLogBytes))
				return nil
			}))
			return start, size
		}
		start, size := logStart()
		assert.Equal(t, uint64(8), start, "3 entries of 300 KiB pass 1 MiB: versions 8-10 stay")
		assert.LessOrEqual(t, size, uint64(1<<20))
		assert.Greater(t, size, uint64(600<<10))

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		w, err := s.Watch(ctx, "", 3)
		require.NoError(t, err)
		snap := collect(t, w, 1)[0]
		assert.True(t, snap.Snapshot)
		assert.Equal(t, big('j'), string(snap.Changes[0].Cell.Value))

		// A value larger than the cap stays as the newest entry.
		set(t, s, "a", `"`+string(bytes.Repeat([]byte{'z'}, 2<<20))+`"`)
		start, _ = logStart()
		assert.Equal(t, uint64(11), start)

		// A store from before the count: it is counted at the next commit.
		require.NoError(t, s.Update(func(x Tx) error {
			info, err := x.(*tx).write(bucketInfo)
			require.NoError(t, err)
			return info.del([]byte(keyLogBytes))
		}))
		set(t, s, "b", `1`)
		start, size = logStart()
		assert.Equal(t, uint64(12), start, "the 2 MiB entry was counted, and so dropped")
		assert.Less(t, size, uint64(100))
	})
}

func TestStreams(t *testing.T) {
	each(t, func(t *testing.T, b backend) {
		s, reopen := b.open(t, Options{})
		ev := addr("node.run")
		require.NoError(t, s.Update(func(tx Tx) error { return tx.Declare(ev, Spec{Stream: true}) }))
		w, err := s.Watch(context.Background(), "", s.Version())
		require.NoError(t, err)
		var sent []Event
		require.NoError(t, s.Update(func(tx Tx) error {
			for _, p := range []string{`{"command":"ls"}`, `{"command":"pwd"}`} {
				e, err := tx.Send(ev, json.RawMessage(p))
				require.NoError(t, err)
				sent = append(sent, e)
			}
			return nil
		}))
		assert.Less(t, sent[0].ID, sent[1].ID)
		batch := collect(t, w, 1)[0]
		require.Len(t, batch.Changes, 2, "one change per event")
		assert.Equal(t, sent[0].ID, batch.Changes[0].Event.ID)
		assert.JSONEq(t, `{"command":"pwd"}`, string(batch.Changes[1].Event.Payload))
		assert.True(t, batch.Changes[0].Cell.Stream)

		// A handler that crashes before its transaction commits leaves the
		// event queued and its writes unwritten.
		crash := errors.New("crash before commit")
		handle := func(tx Tx) error {
			evs, err := tx.Events(ev)
			require.NoError(t, err)
			require.NotEmpty(t, evs)
			if err := tx.Ack(ev, evs[0].ID); err != nil {
				return err
			}
			_, err = tx.Set(addr("history"), evs[0].Payload)
			return err
		}
		assert.ErrorIs(t, s.Update(func(tx Tx) error { handle(tx); return crash }), crash)
		_, err = s.Get(addr("history"))
		assert.ErrorIs(t, err, ErrNotFound)
		require.NoError(t, s.Update(handle))
		// Acking it again (a replayed handler) is refused.
		err = s.Update(func(tx Tx) error { return tx.Ack(ev, sent[0].ID) })
		assert.ErrorIs(t, err, ErrHandled)

		if reopen != nil {
			require.NoError(t, s.Close())
			s = reopen()
		}
		require.NoError(t, s.View(func(tx Tx) error {
			evs, err := tx.Events(ev)
			require.NoError(t, err)
			require.Len(t, evs, 1, "the handled event is gone, the other queued")
			assert.Equal(t, sent[1].ID, evs[0].ID)
			return nil
		}))
		h, err := s.Get(addr("history"))
		require.NoError(t, err)
		assert.JSONEq(t, `{"command":"ls"}`, string(h.Value))
	})
}

func TestBoltReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cells.db")
	s, err := OpenBolt(path, Options{})
	require.NoError(t, err)
	set(t, s, "a", `1`)
	set(t, s, "a", `2`)
	require.NoError(t, s.Close())
	assert.ErrorIs(t, s.Update(func(Tx) error { return nil }), ErrClosed)

	s, err = OpenBolt(path, Options{})
	require.NoError(t, err)
	assert.Equal(t, uint64(2), s.Version())
	w, err := s.Watch(context.Background(), "", 0)
	require.NoError(t, err)
	assert.Len(t, collect(t, w, 2), 2, "the log survives")
	set(t, s, "a", `3`)
	a, _ := s.Get(addr("a"))
	assert.Equal(t, uint64(3), a.Version, "the sequence continues")
	require.NoError(t, s.Close())
}

func TestBoltLayout(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		prep func(tx *bolt.Tx) error
		err  string
	}{
		{"newer layout", func(tx *bolt.Tx) error {
			b, _ := tx.CreateBucketIfNotExists([]byte(bucketInfo))
			return b.Put([]byte(keyLayout), []byte("2"))
		}, "layout version 2, newer than this cellbox understands (1)"},
		{"not a cellbox store", func(tx *bolt.Tx) error {
			b, _ := tx.CreateBucketIfNotExists([]byte(bucketCells))
			return b.Put([]byte("x"), []byte("y"))
		}, "not a cellbox store"},
	} {
		path := filepath.Join(dir, tc.name+".db")
		db, err := bolt.Open(path, 0o600, nil)
		require.NoError(t, err)
		require.NoError(t, db.Update(tc.prep))
		require.NoError(t, db.Close())
		_, err = OpenBolt(path, Options{})
		assert.ErrorContains(t, err, tc.err, tc.name)
		assert.ErrorContains(t, err, path, tc.name)
	}
}

// A store over a shared bbolt file keeps to its buckets, tolerates other
// state's, and leaves the file open when it closes; reopened, it has its
func TestOpenBoltDBShared(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "cellbox.db"), 0o600, nil)
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte("sessions"))
		if err != nil {
			return err
		}
		return b.Put([]byte("s-1"), []byte(`{"id":"s-1"}`))
	}))
	a := Address{Space: "s", Pattern: "p", Name: "x"}
	s, err := OpenBoltDB(db, Options{})
	require.NoError(t, err)
	require.NoError(t, s.Update(func(tx Tx) error { _, err := tx.Set(a, json.RawMessage(`1`)); return err }))
	require.NoError(t, s.Close())

	require.NoError(t, db.View(func(tx *bolt.Tx) error {
		assert.Equal(t, `{"id":"s-1"}`, string(tx.Bucket([]byte("sessions")).Get([]byte("s-1"))), "the other state is untouched")
		return nil
	}), "the file is still open")
	s, err = OpenBoltDB(db, Options{})
	require.NoError(t, err)
	defer s.Close()
	c, err := s.Get(a)
	require.NoError(t, err)
	assert.Equal(t, "1", string(c.Value))
}

// A watch that meets an unreadable change log entry ends with a last batch
// that says why, instead of just closing.
func TestWatchEndsWithReason(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "cellbox.db"), 0o600, nil)
	require.NoError(t, err)
	defer db.Close()
	s, err := OpenBoltDB(db, Options{})
	require.NoError(t, err)
	defer s.Close()
	a := Address{Space: "s", Pattern: "p", Name: "x"}
	for _, v := range []string{`1`, `2`, `3`} {
		require.NoError(t, s.Update(func(tx Tx) error { _, err := tx.Set(a, json.RawMessage(v)); return err }))
	}
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(bucketLog)).Put(u64(2), []byte{0xff, 0xff, 0xff})
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch, err := s.Watch(ctx, "", 0)
	require.NoError(t, err)
	var got []Batch
	for b := range ch {
		got = append(got, b)
	}
	require.Len(t, got, 2, "version 1, then the reason")
	assert.Equal(t, uint64(1), got[0].Version)
	assert.NoError(t, got[0].Err)
	assert.Equal(t, uint64(1), got[1].Version, "the last version delivered")
	assert.Empty(t, got[1].Changes)
	require.Error(t, got[1].Err)
	assert.Contains(t, got[1].Err.Error(), `watch "" after version 1: change log entry 2:`)
}

// TestBoltUpdateWithoutWrites: a read-write transaction that writes
// nothing leaves the file alone (no commit and its sync: a run with
// nothing to do makes several), and one that writes commits as before.
func TestBoltUpdateWithoutWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cells.db")
	s, err := OpenBolt(path, Options{})
	require.NoError(t, err)
	defer s.Close()
	a := Address{Space: "s", Pattern: "p", Name: "a"}
	require.NoError(t, s.Update(func(tx Tx) error { _, err := tx.Set(a, json.RawMessage(`1`)); return err }))
	before, err := os.ReadFile(path)
	require.NoError(t, err)

	require.NoError(t, s.Update(func(tx Tx) error {
		_, err := tx.Get(a)
		_, _ = tx.Meta("m").Get("k")
		return err
	}))
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, before, after, "nothing written, nothing committed")

	require.NoError(t, s.Update(func(tx Tx) error { return tx.Meta("m").Put("k", []byte("v")) }))
	require.NoError(t, s.View(func(tx Tx) error {
		v, ok := tx.Meta("m").Get("k")
		assert.True(t, ok)
		assert.Equal(t, "v", string(v))
		return nil
	}))
}

// Reopening a settled store and declaring its cells again, schemas
// included, writes nothing (a run with nothing to do pays no sync), while
// a changed schema is still stored.
func TestBoltReopenAndRedeclareWithoutWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cells.db")
	a := Address{Space: "s", Pattern: "p", Name: "a"}
	b := Address{Space: "s", Pattern: "p", Name: "b"}
	schema := json.RawMessage(`{"type":"number"}`)
	declare := func(s Store, sch json.RawMessage) {
		require.NoError(t, s.Update(func(tx Tx) error {
			if err := tx.Declare(a, Spec{Schema: sch}); err != nil {
				return err
			}
			return tx.Declare(b, Spec{})
		}))
	}
	s, err := OpenBolt(path, Options{})
	require.NoError(t, err)
	declare(s, schema)
	require.NoError(t, s.Close())
	before, err := os.ReadFile(path)
	require.NoError(t, err)

	s, err = OpenBolt(path, Options{})
	require.NoError(t, err)
	declare(s, schema)
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, before, after, "reopened and declared again: nothing written")

	declare(s, json.RawMessage(`{"type":"string"}`))
	require.NoError(t, s.Update(func(tx Tx) error {
		_, err := tx.Set(a, json.RawMessage(`1`))
		var se *SchemaError
		assert.ErrorAs(t, err, &se, "the changed schema holds")
		return nil
	}))
	require.NoError(t, s.Close())
}

// compactValue's integer shortcut accepts exactly the integers json.Valid
// does and leaves everything else (bad JSON too) to the full check.
func TestCompactValueShortcut(t *testing.T) {
	for _, in := range []string{"0", "-0", "7", "-12", "1234567890123", "01", "-", "--1", "1-", "+1", "1.5", "1e3", "-01", " 1", "1 ", "", "0x1"} {
		t.Run(in, func(t *testing.T) {
			got, err := compactValue(json.RawMessage(in))
			if !json.Valid([]byte(in)) {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			var buf bytes.Buffer
			require.NoError(t, json.Compact(&buf, []byte(in)))
			assert.Equal(t, buf.String(), string(got))
		})
	}
}
