// Package cellstest is the conformance suite of cells.Store: every store
// (cells.NewMemory, cells.OpenBolt, cells.OpenBoltDB, cells.Open over a
// KV of its own, as over kvtest's remote one) runs it from its tests, and
// must pass all of it, so a client of the contract never needs to know
// which store it holds.
//
// Each subtest checks one point of the contract as cells.go's doc comments
// state it, on a store of its own, through the exported API only:
//
//	func TestMyStore(t *testing.T) {
//		cellstest.Run(t, func(t *testing.T, opts cells.Options) (cells.Store, func(*testing.T) cells.Store) {
//			open := func(t *testing.T) cells.Store {
//				s, err := cells.Open(t.Context(), mykv.Dial(endpoint(t)), opts)
//				require.NoError(t, err)
//				return s
//			}
//			return open(t), open
//		})
//	}
package cellstest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/cells"
)

// Open opens a new, empty store tuned by opts (the suite sets LogLimit and
// LogBytes where it tests them, nothing else) for the test t. The suite
// closes every store it gets, once the test is done with it (a store's
// second Close returns nil); open may register the removal of what a store
// leaves behind with t.Cleanup (t.TempDir does that for a file).
//
// reopen opens the same data again, as a new Store, after the suite has
// closed the first: it is nil for a store that keeps nothing past Close
// (cells.NewMemory), and the subtests of durability are then skipped.
type Open func(t *testing.T, opts cells.Options) (s cells.Store, reopen func(t *testing.T) cells.Store)

// wait bounds every wait of the suite for a batch or a closed channel (the
// machines that run it are busy).
const wait = 10 * time.Second

// Run runs the suite: each subtest on a store (or two) of its own, made by
// open.
func Run(t *testing.T, open Open) {
	s := &suite{open: open}
	for _, c := range []struct {
		name string
		fn   func(*testing.T)
	}{
		// Values and versions.
		{"SetGetVersions", s.setGetVersions},
		{"SetValues", s.setValues},
		{"SetError", s.setError},
		{"Declare", s.declare},
		{"Schema", s.schema},
		{"Delete", s.delete},
		{"SetRef", s.setRef},
		{"List", s.list},
		{"BadInput", s.badInput},
		{"ReadOnly", s.readOnly},
		{"Copies", s.copies},
		// Transactions.
		{"ReadOwnWrites", s.readOwnWrites},
		{"Rollback", s.rollback},
		{"SetDeleteSetInOneTransaction", s.setDeleteSet},
		{"UpdateWithoutChanges", s.updateWithoutChanges},
		{"ConcurrentUpdates", s.concurrentUpdates},
		{"InterleavedUpdates", s.interleavedUpdates},
		{"Meta", s.meta},
		// Watch.
		{"Watch", s.watch},
		{"WatchFromNow", s.watchFromNow},
		{"WatchEndsWithContext", s.watchEndsWithContext},
		{"WatchSlowReader", s.watchSlowReader},
		{"PrefixWholeSegments", s.prefixWholeSegments},
		{"WatchCompacted", s.watchCompacted},
		{"LogBytes", s.logBytes},
		// Streams.
		{"Streams", s.streams},
		{"EventsAndAcks", s.eventsAndAcks},
		// Lifecycle.
		{"EndedContext", s.endedContext},
		{"Close", s.close},
		{"Reopen", s.reopen},
	} {
		t.Run(c.name, c.fn)
	}
}

type suite struct{ open Open }

// store opens a store with default options, closed when t ends.
func (s *suite) store(t *testing.T) cells.Store {
	st, _ := s.storeWith(t, cells.Options{})
	return st
}

// storeWith opens a store with opts; reopen (nil when the store keeps
// nothing past Close) closes it and opens its data again.
func (s *suite) storeWith(t *testing.T, opts cells.Options) (cells.Store, func() cells.Store) {
	t.Helper()
	st, reopen := s.open(t, opts)
	require.NotNil(t, st, "open returned no store")
	t.Cleanup(func() { st.Close() })
	if reopen == nil {
		return st, nil
	}
	return st, func() cells.Store {
		t.Helper()
		require.NoError(t, st.Close())
		st = reopen(t)
		require.NotNil(t, st, "reopen returned no store")
		return st
	}
}

// at is the address of a cell of the suite's pattern instance s/p.
func at(name string) cells.Address { return cells.Address{Space: "s", Pattern: "p", Name: name} }

// set writes one cell's value in a transaction of its own.
func set(t *testing.T, s cells.Store, a cells.Address, value string) {
	t.Helper()
	require.NoError(t, s.Update(t.Context(), func(tx cells.Tx) error {
		_, err := tx.Set(a, json.RawMessage(value))
		return err
	}))
}

// get returns a cell that must exist.
func get(t *testing.T, s cells.Store, a cells.Address) cells.Cell {
	t.Helper()
	c, err := s.Get(t.Context(), a)
	require.NoError(t, err)
	return c
}

// value returns a cell's value, or "(none)" when there is no such cell.
func value(t *testing.T, s cells.Store, a cells.Address) string {
	t.Helper()
	c, err := s.Get(t.Context(), a)
	if err != nil {
		require.ErrorIs(t, err, cells.ErrNotFound)
		return "(none)"
	}
	return string(c.Value)
}

// list returns the cells under prefix, read in a View.
func list(t *testing.T, s cells.Store, prefix string) []cells.Cell {
	t.Helper()
	var out []cells.Cell
	require.NoError(t, s.View(t.Context(), func(tx cells.Tx) error {
		var err error
		out, err = tx.List(prefix)
		return err
	}))
	return out
}

// names returns the address strings of cells.
func names(cs []cells.Cell) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Addr.String())
	}
	return out
}

// watch starts a watch that ends with the test.
func watch(t *testing.T, s cells.Store, prefix string, from uint64) <-chan cells.Batch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ch, err := s.Watch(ctx, prefix, from)
	require.NoError(t, err)
	return ch
}

// collect receives n batches, none of them ending the watch.
func collect(t *testing.T, ch <-chan cells.Batch, n int) []cells.Batch {
	t.Helper()
	var out []cells.Batch
	timeout := time.After(wait)
	for len(out) < n {
		select {
		case b, ok := <-ch:
			require.True(t, ok, "watch closed after %d batches, want %d", len(out), n)
			require.NoError(t, b.Err, "watch ended after %d batches, want %d", len(out), n)
			out = append(out, b)
		case <-timeout:
			t.Fatalf("got %d batches, want %d", len(out), n)
		}
	}
	return out
}

// next receives one batch.
func next(t *testing.T, ch <-chan cells.Batch) cells.Batch {
	t.Helper()
	return collect(t, ch, 1)[0]
}

// closes waits until the watch's channel is closed and returns what came
// before.
func closes(t *testing.T, ch <-chan cells.Batch) []cells.Batch {
	t.Helper()
	var out []cells.Batch
	timeout := time.After(wait)
	for {
		select {
		case b, ok := <-ch:
			if !ok {
				return out
			}
			out = append(out, b)
		case <-timeout:
			t.Fatalf("the watch did not end (%d batches came)", len(out))
		}
	}
}

// versions returns the versions of batches.
func versions(bs []cells.Batch) []uint64 {
	var out []uint64
	for _, b := range bs {
		out = append(out, b.Version)
	}
	return out
}

// within fails the test if fn does not return within wait (a store left
// locked, a writer blocked by a watcher).
func within(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(wait):
		t.Fatalf("%s did not return within %v", what, wait)
	}
}

// noErr is an assert for a goroutine of a test (require must not be used
// off the test's goroutine).
func noErr(t *testing.T, err error) bool { return assert.NoError(t, err) }

// sameEvents checks events by ID, payload and time (an instant, whatever
// its Location).
func sameEvents(t *testing.T, want, got []cells.Event, msg ...any) {
	t.Helper()
	type ev struct {
		ID      uint64
		Payload string
		Sent    int64
	}
	plain := func(es []cells.Event) []ev {
		out := []ev{}
		for _, e := range es {
			out = append(out, ev{e.ID, string(e.Payload), e.Sent.UnixNano()})
		}
		return out
	}
	assert.Equal(t, plain(want), plain(got), msg...)
}

// sameCell checks two states of a cell, Changed as an instant.
func sameCell(t *testing.T, want, got cells.Cell, msg ...any) {
	t.Helper()
	assert.True(t, want.Changed.Equal(got.Changed), "Changed %v, want %v", got.Changed, want.Changed)
	want.Changed, got.Changed = time.Time{}, time.Time{}
	assert.Equal(t, want, got, msg...)
}
