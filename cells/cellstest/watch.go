package cellstest

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/cells"
)

// watch: a watch replays the committed batches after its version, one per
// commit, filtered by its prefix, then follows live; a client resumes from
// the last version it saw; deletes are changes too.
func (s *suite) watch(t *testing.T) {
	st := s.store(t)
	set(t, st, at("a"), `1`)
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		tx.Set(at("a"), json.RawMessage(`2`))
		tx.Set(at("b"), json.RawMessage(`3`))
		tx.Set(at("a"), json.RawMessage(`4`))
		_, err := tx.Set(cells.Address{Space: "s", Pattern: "other", Name: "z"}, json.RawMessage(`0`))
		return err
	}))

	// Replay from the start, filtered by prefix, then live.
	all := watch(t, st, "s/p/", 0)
	got := collect(t, all, 2)
	assert.Equal(t, uint64(1), got[0].Version)
	assert.False(t, got[0].Snapshot)
	require.Len(t, got[0].Changes, 1)
	assert.Equal(t, "1", string(got[0].Changes[0].Cell.Value), "the value of that commit, not the current one")
	assert.Equal(t, uint64(2), got[1].Version)
	require.Len(t, got[1].Changes, 2, "one change per cell, the last write")
	assert.Equal(t, "a", got[1].Changes[0].Cell.Addr.Name, "in first-write order")
	assert.Equal(t, "4", string(got[1].Changes[0].Cell.Value))
	assert.Equal(t, uint64(2), got[1].Changes[0].Cell.Version)
	assert.Equal(t, "b", got[1].Changes[1].Cell.Addr.Name)
	assert.Equal(t, "3", string(got[1].Changes[1].Cell.Value))
	for _, c := range append(got[0].Changes, got[1].Changes...) {
		assert.False(t, c.Deleted)
		assert.Nil(t, c.Event)
	}
	sameCell(t, get(t, st, at("b")), got[1].Changes[1].Cell, "a change holds the cell's state after the commit")

	// A reconnecting client resumes from the last version it saw.
	resumed := watch(t, st, "", 1)
	r := collect(t, resumed, 1)
	assert.Equal(t, uint64(2), r[0].Version)
	assert.Len(t, r[0].Changes, 3)

	set(t, st, at("c"), `"live"`)
	live := next(t, all)
	assert.Equal(t, uint64(3), live.Version)
	assert.False(t, live.Snapshot)
	assert.Equal(t, `"live"`, string(live.Changes[0].Cell.Value))
	assert.Equal(t, uint64(3), next(t, resumed).Version)

	// Changes outside the prefix are not sent, nor batches without any.
	set(t, st, at("c"), `"x"`)
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		_, err := tx.Set(cells.Address{Space: "s", Pattern: "other", Name: "z"}, json.RawMessage(`9`))
		return err
	}))
	set(t, st, at("c"), `"y"`)
	got = collect(t, all, 2)
	assert.Equal(t, []uint64{4, 6}, versions(got))

	// Deletes are changes too.
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error { return tx.Delete(at("c")) }))
	d := next(t, all)
	require.Len(t, d.Changes, 1)
	assert.True(t, d.Changes[0].Deleted)
	assert.Equal(t, at("c"), d.Changes[0].Cell.Addr)
	assert.Equal(t, uint64(7), d.Changes[0].Cell.Version)
	assert.Equal(t, "null", string(d.Changes[0].Cell.Value))

	// The same replay, from a watch started now.
	again := collect(t, watch(t, st, "s/p/", 0), 6)
	assert.Equal(t, []uint64{1, 2, 3, 4, 6, 7}, versions(again))
}

// watchFromNow: a watch from the store's version sends nothing until the
// next commit, and no snapshot; a watch from 0 replays from the first
// commit.
func (s *suite) watchFromNow(t *testing.T) {
	st := s.store(t)
	empty := watch(t, st, "", 0)
	set(t, st, at("a"), `1`)
	set(t, st, at("a"), `2`)
	now := watch(t, st, "", st.Version())
	set(t, st, at("a"), `3`)
	b := next(t, now)
	assert.Equal(t, uint64(3), b.Version, "the first batch is the next commit")
	assert.False(t, b.Snapshot)
	assert.Equal(t, []uint64{1, 2, 3}, versions(collect(t, empty, 3)), "a watch of an empty store from 0")
	assert.Equal(t, []uint64{1, 2, 3}, versions(collect(t, watch(t, st, "", 0), 3)))
}

// watchEndsWithContext: a watch's channel closes when its context ends,
// whether or not its reader keeps up.
func (s *suite) watchEndsWithContext(t *testing.T) {
	st := s.store(t)
	ctx, cancel := context.WithCancel(context.Background())
	idle, err := st.Watch(ctx, "", 0)
	require.NoError(t, err)
	set(t, st, at("a"), `1`)
	cancel()
	for _, b := range closes(t, idle) {
		assert.Equal(t, uint64(1), b.Version, "only what was committed before")
	}

	// A watch nobody reads, with batches waiting for it.
	ctx, cancel = context.WithCancel(context.Background())
	unread, err := st.Watch(ctx, "", 0)
	require.NoError(t, err)
	for i := range 40 {
		set(t, st, at("a"), strconv.Itoa(i+2))
	}
	cancel()
	closes(t, unread)

	// A watch started with a context that has ended.
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	ended, err := st.Watch(ctx, "", st.Version())
	require.NoError(t, err)
	closes(t, ended)

	// The store goes on.
	w := watch(t, st, "", st.Version())
	set(t, st, at("a"), `"after"`)
	assert.Equal(t, uint64(42), next(t, w).Version)
}

// watchSlowReader: a watcher that does not read never blocks writers and
// never loses a batch: it gets them all, in order, when it reads.
func (s *suite) watchSlowReader(t *testing.T) {
	st := s.store(t)
	const commits = 200
	w := watch(t, st, "", 0)
	within(t, "commits under a watch nobody reads", func() {
		for i := range commits {
			err := st.Update(t.Context(), func(tx cells.Tx) error {
				_, err := tx.Set(at("a"), json.RawMessage(strconv.Itoa(i)))
				return err
			})
			if !noErr(t, err) {
				return
			}
		}
	})
	got := collect(t, w, commits)
	for i, b := range got {
		assert.Equal(t, uint64(i+1), b.Version)
		assert.False(t, b.Snapshot)
		if assert.Len(t, b.Changes, 1) {
			assert.Equal(t, strconv.Itoa(i), string(b.Changes[0].Cell.Value))
		}
	}

	// A reader that falls behind the log's limits gets a Snapshot where
	// its next batch is gone, and goes on from there.
	st, _ = s.storeWith(t, cells.Options{LogLimit: 5})
	w = watch(t, st, "", 0)
	within(t, "commits under a watch nobody reads", func() {
		for i := range commits {
			err := st.Update(t.Context(), func(tx cells.Tx) error {
				_, err := tx.Set(at("a"), json.RawMessage(strconv.Itoa(i)))
				return err
			})
			if !noErr(t, err) {
				return
			}
		}
	})
	var last uint64
	var snapshots int
	a := "(none)"
	for last < commits {
		b := next(t, w)
		if b.Snapshot {
			snapshots++
			require.Greater(t, b.Version, last+1, "a snapshot only where a batch is gone")
		} else {
			require.Equal(t, last+1, b.Version, "no batch lost but by a snapshot")
		}
		for _, c := range b.Changes {
			a = string(c.Cell.Value)
		}
		last = b.Version
	}
	assert.Positive(t, snapshots, "the reader fell behind the log")
	assert.Equal(t, strconv.Itoa(commits-1), a, "what the batches say is the store's state")
}

// prefixWholeSegments: a prefix names whole segments of an address (space
// / pattern / name, and a node's streams after its name: "repl.run"), in
// List, a watch's replay and its snapshot alike: big/s is not big/small.
func (s *suite) prefixWholeSegments(t *testing.T) {
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
			st := s.store(t)
			require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
				for _, a := range addrs {
					a, err := cells.Parse(a)
					require.NoError(t, err)
					if _, err := tx.Set(a, json.RawMessage(`1`)); err != nil {
						return err
					}
				}
				return nil
			}))
			want := slices.Sorted(slices.Values(tc.want))
			assert.Equal(t, want, names(list(t, st, tc.prefix)), "List(%q), in address order", tc.prefix)
			for _, a := range addrs {
				assert.Equal(t, slices.Contains(want, a), cells.HasPrefix(a, tc.prefix), "HasPrefix(%q, %q)", a, tc.prefix)
			}

			// The snapshot of a watch from a version the store has not
			// reached: sent even when no cell is under the prefix.
			snap := next(t, watch(t, st, tc.prefix, 99))
			require.True(t, snap.Snapshot)
			assert.Equal(t, uint64(1), snap.Version)
			var got []string
			for _, c := range snap.Changes {
				got = append(got, c.Cell.Addr.String())
			}
			assert.Equal(t, want, got, "Watch(%q)'s snapshot, in address order", tc.prefix)
			if len(tc.want) == 0 {
				return // a replay with nothing to send sends nothing
			}
			batch := next(t, watch(t, st, tc.prefix, 0))
			got = nil
			for _, c := range batch.Changes {
				got = append(got, c.Cell.Addr.String())
			}
			assert.ElementsMatch(t, want, got, "Watch(%q) replaying the log", tc.prefix)
		})
	}
}

// watchCompacted: the change log keeps the last LogLimit commits; a watch
// from a version whose next commit is gone, or from one the store has not
// reached, starts with a Snapshot of the current state under its prefix
// (in address order, at the store's version), then follows live.
func (s *suite) watchCompacted(t *testing.T) {
	st, _ := s.storeWith(t, cells.Options{LogLimit: 3})
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error { return tx.Declare(at("ev"), cells.Spec{Stream: true}) }))
	for i := range 9 {
		set(t, st, at("a"), strconv.Itoa(i+1))
	}
	set(t, st, at("b"), `true`)
	require.NoError(t, st.Update(t.Context(), func(tx cells.Tx) error {
		_, err := tx.Set(cells.Address{Space: "s", Pattern: "other", Name: "z"}, json.RawMessage(`0`))
		return err
	}))
	// Version 12; the log keeps 10..12. From 9 replays; from 8 snapshots.
	got := collect(t, watch(t, st, "", 9), 3)
	assert.Equal(t, []uint64{10, 11, 12}, versions(got))
	for _, b := range got {
		assert.False(t, b.Snapshot)
	}

	for _, from := range []uint64{2, 0, 8} {
		w := watch(t, st, "s/p/", from)
		snap := next(t, w)
		assert.True(t, snap.Snapshot, "from %d", from)
		assert.Equal(t, uint64(12), snap.Version, "from %d", from)
		require.Len(t, snap.Changes, 3, "from %d", from)
		for i, want := range []struct {
			name, value string
			version     uint64
		}{{"a", "9", 10}, {"b", "true", 11}, {"ev", "null", 1}} {
			c := snap.Changes[i]
			assert.Equal(t, at(want.name), c.Cell.Addr)
			assert.Equal(t, want.value, string(c.Cell.Value))
			assert.Equal(t, want.version, c.Cell.Version)
			assert.False(t, c.Deleted)
			assert.Nil(t, c.Event)
		}
		assert.True(t, snap.Changes[2].Cell.Stream)
		if from == 8 {
			set(t, st, at("a"), `"after"`)
			live := next(t, w)
			assert.Equal(t, uint64(13), live.Version, "live after the snapshot")
			assert.False(t, live.Snapshot)
		}
	}

	// A version from the future (another store) also gets a snapshot.
	snap := next(t, watch(t, st, "", 99))
	assert.True(t, snap.Snapshot)
	assert.Equal(t, uint64(13), snap.Version)
	assert.Len(t, snap.Changes, 4)
}

// logBytes: the change log also keeps at most LogBytes of entries: past it
// the oldest go (a watch from before them gets a snapshot, as past
// LogLimit), but the newest stays whatever its size.
func (s *suite) logBytes(t *testing.T) {
	st, _ := s.storeWith(t, cells.Options{LogBytes: 1 << 20})
	big := func(c byte) string { return `"` + string(bytes.Repeat([]byte{c}, 300<<10)) + `"` }
	for i := range 10 {
		set(t, st, at("a"), big(byte('a'+i)))
	}
	// Two entries of 300 KiB fit in 1 MiB; four do not.
	got := collect(t, watch(t, st, "", 8), 2)
	assert.Equal(t, []uint64{9, 10}, versions(got))
	assert.False(t, got[0].Snapshot)
	assert.Equal(t, big('i'), string(got[0].Changes[0].Cell.Value))
	snap := next(t, watch(t, st, "", 6))
	assert.True(t, snap.Snapshot)
	assert.Equal(t, uint64(10), snap.Version)
	require.Len(t, snap.Changes, 1)
	assert.Equal(t, big('j'), string(snap.Changes[0].Cell.Value))

	// A value larger than the cap stays as the newest entry, alone.
	huge := `"` + string(bytes.Repeat([]byte{'z'}, 2<<20)) + `"`
	set(t, st, at("a"), huge)
	b := next(t, watch(t, st, "", 10))
	assert.False(t, b.Snapshot)
	assert.Equal(t, uint64(11), b.Version)
	assert.Equal(t, huge, string(b.Changes[0].Cell.Value))
	assert.True(t, next(t, watch(t, st, "", 9)).Snapshot)

	// And goes with the next commit.
	set(t, st, at("b"), `1`)
	assert.Equal(t, uint64(12), next(t, watch(t, st, "", 11)).Version)
	assert.True(t, next(t, watch(t, st, "", 10)).Snapshot)
}
