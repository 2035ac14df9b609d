// Package statetest is the conformance suite of state.Store: every store
// (state.NewMemory, state.OpenBolt, and any other implementation, such as
// one over etcd) runs it from its tests, and must pass all of it, so a
// caller of the contract never needs to know which store it holds.
//
// Each subtest checks one point of the contract as package state's doc
// comments state it, on a store of its own, through the exported API only:
//
//	func TestMyStore(t *testing.T) {
//		statetest.Run(t, func(t *testing.T) (state.Store, func(*testing.T) state.Store) {
//			s, err := mystore.Open(dsn(t))
//			require.NoError(t, err)
//			return s, func(t *testing.T) state.Store { s, err := mystore.Open(dsn(t)); require.NoError(t, err); return s }
//		})
//	}
package statetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/state"
)

// Open opens a new, empty store for the test t. The suite closes every
// store it gets once the test is done with it (a store's second Close
// returns nil); open may register the removal of what a store leaves
// behind with t.Cleanup (t.TempDir does that for a file).
//
// reopen opens the same data again, as a new Store, after the suite has
// closed the first: it is nil for a store that keeps nothing past Close
// (state.NewMemory), and the subtest of durability is then skipped.
type Open func(t *testing.T) (s state.Store, reopen func(t *testing.T) state.Store)

// wait bounds every wait of the suite for a goroutine (the machines that
// run it are busy).
const wait = 30 * time.Second

// Run runs the suite: each subtest on a store (or two) of its own, made by
// open.
func Run(t *testing.T, open Open) {
	s := &suite{open: open}
	for _, c := range []struct {
		name string
		fn   func(*testing.T)
	}{
		// Records.
		{"PutGet", s.putGet},
		{"List", s.list},
		{"Revisions", s.revisions},
		{"Delete", s.delete},
		{"Copies", s.copies},
		{"Invalid", s.invalid},
		{"EmptyCommit", s.emptyCommit},
		// Guards.
		{"CreateIfAbsent", s.createIfAbsent},
		{"UpdateIfRevision", s.updateIfRevision},
		{"DeleteIfRevision", s.deleteIfRevision},
		{"AllOrNothing", s.allOrNothing},
		{"ConcurrentUpdates", s.concurrentUpdates},
		{"ConcurrentCreates", s.concurrentCreates},
		// Reservations.
		{"Reserve", s.reserve},
		{"ReserveIdempotent", s.reserveIdempotent},
		{"Release", s.release},
		{"ConcurrentReserve", s.concurrentReserve},
		{"ConcurrentReserveOneHolder", s.concurrentReserveOneHolder},
		// The store.
		{"Instance", s.instance},
		{"Context", s.context},
		{"Close", s.close},
		{"Reopen", s.reopen},
	} {
		t.Run(c.name, c.fn)
	}
}

type suite struct{ open Open }

var ctx = context.Background()

// store opens a store, closed when t ends.
func (s *suite) store(t *testing.T) state.Store {
	st, _ := s.storeWith(t)
	return st
}

// storeWith opens a store; reopen (nil when the store keeps nothing past
// Close) closes it and opens its data again.
func (s *suite) storeWith(t *testing.T) (state.Store, func() state.Store) {
	t.Helper()
	st, reopen := s.open(t)
	require.NotNil(t, st, "open returned no store")
	t.Cleanup(func() { st.Close() })
	if reopen == nil {
		return st, nil
	}
	return st, func() state.Store {
		t.Helper()
		require.NoError(t, st.Close())
		st = reopen(t)
		require.NotNil(t, st, "reopen returned no store")
		return st
	}
}

// commit commits ops, which must succeed, and returns the revision.
func commit(t *testing.T, st state.Store, ops ...state.Op) uint64 {
	t.Helper()
	rev, err := st.Commit(ctx, ops...)
	require.NoError(t, err)
	return rev
}

// put commits one unguarded put and returns its revision.
func put(t *testing.T, st state.Store, kind state.Kind, key, value string) uint64 {
	t.Helper()
	return commit(t, st, state.Put(kind, key, []byte(value)))
}

// get returns a record that must exist.
func get(t *testing.T, st state.Store, kind state.Kind, key string) state.Record {
	t.Helper()
	r, err := st.Get(ctx, kind, key)
	require.NoError(t, err, "get %s %q", kind, key)
	return r
}

// value returns a record's value, or "(none)" when there is no record.
func value(t *testing.T, st state.Store, kind state.Kind, key string) string {
	t.Helper()
	r, err := st.Get(ctx, kind, key)
	if err != nil {
		require.ErrorIs(t, err, state.ErrNotFound, "get %s %q", kind, key)
		return "(none)"
	}
	return string(r.Value)
}

// list returns the records of kind under prefix.
func list(t *testing.T, st state.Store, kind state.Kind, prefix string) []state.Record {
	t.Helper()
	rs, err := st.List(ctx, kind, prefix)
	require.NoError(t, err)
	require.NotNil(t, rs, "List returns an empty slice, not nil")
	return rs
}

// keys returns the keys of records.
func keys(rs []state.Record) []string {
	out := []string{}
	for _, r := range rs {
		out = append(out, r.Key)
	}
	return out
}

// holders returns a counter's holders.
func holders(t *testing.T, st state.Store, counter string) []string {
	t.Helper()
	hs, err := st.Holders(ctx, counter)
	require.NoError(t, err)
	require.NotNil(t, hs, "Holders returns an empty slice, not nil")
	return hs
}

// dump is everything a store holds of the kinds and counters the suite
// uses: what "nothing was written" compares.
func dump(t *testing.T, st state.Store) map[string]state.Record {
	t.Helper()
	out := map[string]state.Record{}
	for _, k := range kinds {
		for _, r := range list(t, st, k, "") {
			out[string(k)+"/"+r.Key] = r
		}
	}
	for _, c := range counters {
		for _, h := range holders(t, st, c) {
			out["counter "+c+"/"+h] = state.Record{}
		}
	}
	return out
}

var (
	kinds    = []state.Kind{state.Sessions, state.Boxes, state.Snapshots, state.SnapshotManifests, state.Previews, state.MCPSessions}
	counters = []string{"boxes", "sessions", "boxes/s-1", "c"}
)

// within fails the test if fn does not return within wait.
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
