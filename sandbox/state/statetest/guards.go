package statetest

import (
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/state"
)

// createIfAbsent: a put guarded by 0 creates a record only if there is
// none; otherwise ErrConflict, and the record keeps its value and
// revision.
func (s *suite) createIfAbsent(t *testing.T) {
	st := s.store(t)
	rev := commit(t, st, state.Put(state.Sessions, "s-1", []byte("first")).If(0))
	_, err := st.Commit(ctx, state.Put(state.Sessions, "s-1", []byte("second")).If(0))
	require.ErrorIs(t, err, state.ErrConflict)
	assert.Equal(t, state.Record{Key: "s-1", Value: []byte("first"), Revision: rev}, get(t, st, state.Sessions, "s-1"))

	commit(t, st, state.Delete(state.Sessions, "s-1"))
	commit(t, st, state.Put(state.Sessions, "s-1", []byte("again")).If(0))
	assert.Equal(t, "again", value(t, st, state.Sessions, "s-1"), "absent again after a delete")
}

// updateIfRevision: a put guarded by the revision read succeeds while the
// record has it; with a revision the record no longer has (or never had,
// or on a missing record) it fails with ErrConflict and changes nothing.
func (s *suite) updateIfRevision(t *testing.T) {
	st := s.store(t)
	r1 := put(t, st, state.Boxes, "b", "1")
	r2 := commit(t, st, state.Put(state.Boxes, "b", []byte("2")).If(r1))
	assert.Greater(t, r2, r1)
	assert.Equal(t, state.Record{Key: "b", Value: []byte("2"), Revision: r2}, get(t, st, state.Boxes, "b"))

	before := dump(t, st)
	for name, rev := range map[string]uint64{"stale": r1, "future": r2 + 100, "absent": 0} {
		_, err := st.Commit(ctx, state.Put(state.Boxes, "b", []byte("lost")).If(rev))
		assert.ErrorIs(t, err, state.ErrConflict, name)
	}
	_, err := st.Commit(ctx, state.Put(state.Boxes, "missing", []byte("x")).If(r2))
	assert.ErrorIs(t, err, state.ErrConflict, "a guard on a record that is not there")
	assert.Equal(t, before, dump(t, st), "failed guards write nothing")

	r3 := commit(t, st, state.Put(state.Boxes, "b", []byte("3")).If(r2))
	assert.Greater(t, r3, r2, "the current revision still works after conflicts")
}

// deleteIfRevision: a guarded delete removes the record only while it has
// the revision; a stale one fails and the record stays.
func (s *suite) deleteIfRevision(t *testing.T) {
	st := s.store(t)
	r1 := put(t, st, state.Snapshots, "x", "1")
	r2 := put(t, st, state.Snapshots, "x", "2")
	_, err := st.Commit(ctx, state.Delete(state.Snapshots, "x").If(r1))
	require.ErrorIs(t, err, state.ErrConflict)
	assert.Equal(t, "2", value(t, st, state.Snapshots, "x"))
	_, err = st.Commit(ctx, state.Delete(state.Snapshots, "x").If(0))
	require.ErrorIs(t, err, state.ErrConflict, "guard 0 on a record that exists")
	assert.Equal(t, "2", value(t, st, state.Snapshots, "x"))

	commit(t, st, state.Delete(state.Snapshots, "x").If(r2))
	assert.Equal(t, "(none)", value(t, st, state.Snapshots, "x"))
	_, err = st.Commit(ctx, state.Delete(state.Snapshots, "x").If(r2))
	require.ErrorIs(t, err, state.ErrConflict, "the record is gone")
	commit(t, st, state.Delete(state.Snapshots, "x").If(0))
}

// allOrNothing: a commit of many ops over several kinds either applies
// every op, all with one revision, or (one guard failing, wherever it is
// in the batch) none.
func (s *suite) allOrNothing(t *testing.T) {
	st := s.store(t)
	rs := put(t, st, state.Sessions, "s-1", "session v1")
	rb := put(t, st, state.Boxes, "b-old", "old box")
	rx := put(t, st, state.Previews, "p-1", "preview")
	batch := func(guard uint64, guardFirst bool) []state.Op {
		ops := []state.Op{
			state.Put(state.Boxes, "b-new", []byte("new box")).If(0),
			state.Put(state.Sessions, "s-1", []byte("session v2")).If(rs),
			state.Delete(state.Boxes, "b-old").If(rb),
			state.Put(state.Snapshots, "snap", []byte("snap")),
			state.Put(state.SnapshotManifests, "snap", []byte("manifest")),
		}
		g := state.Delete(state.Previews, "p-1").If(guard)
		if guardFirst {
			return append([]state.Op{g}, ops...)
		}
		return append(ops, g)
	}
	before := dump(t, st)
	for _, first := range []bool{false, true} {
		_, err := st.Commit(ctx, batch(rx+1000, first)...)
		require.ErrorIs(t, err, state.ErrConflict, "guard first: %v", first)
		assert.Equal(t, before, dump(t, st), "a failed commit writes nothing (guard first: %v)", first)
	}

	rev := commit(t, st, batch(rx, false)...)
	assert.Equal(t, "new box", value(t, st, state.Boxes, "b-new"))
	assert.Equal(t, "session v2", value(t, st, state.Sessions, "s-1"))
	assert.Equal(t, "(none)", value(t, st, state.Boxes, "b-old"))
	assert.Equal(t, "(none)", value(t, st, state.Previews, "p-1"))
	assert.Equal(t, "manifest", value(t, st, state.SnapshotManifests, "snap"))
	for _, kr := range []struct {
		k   state.Kind
		key string
	}{{state.Boxes, "b-new"}, {state.Sessions, "s-1"}, {state.Snapshots, "snap"}, {state.SnapshotManifests, "snap"}} {
		assert.Equal(t, rev, get(t, st, kr.k, kr.key).Revision, "%s %s has the commit's revision", kr.k, kr.key)
	}
}

// concurrentUpdates: goroutines that each add to one record many times,
// reading it, committing the sum guarded by the revision read and trying
// again on ErrConflict, lose no update; every successful commit has a
// revision of its own.
func (s *suite) concurrentUpdates(t *testing.T) {
	st := s.store(t)
	const workers, adds = 8, 25
	put(t, st, state.Boxes, "n", "0")
	var mu sync.Mutex
	revs := map[uint64]bool{}
	conflicts := 0
	within(t, "the updates", func() {
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for i := 0; i < adds; {
					r, err := st.Get(ctx, state.Boxes, "n")
					if !assert.NoError(t, err) {
						return
					}
					n, err := strconv.Atoi(string(r.Value))
					if !assert.NoError(t, err) {
						return
					}
					runtime.Gosched() // let another worker in between read and commit
					rev, err := st.Commit(ctx, state.Put(state.Boxes, "n", []byte(strconv.Itoa(n+1))).If(r.Revision))
					if errors.Is(err, state.ErrConflict) {
						mu.Lock()
						conflicts++
						mu.Unlock()
						continue
					}
					if !assert.NoError(t, err) {
						return
					}
					mu.Lock()
					assert.False(t, revs[rev], "revision %d given twice", rev)
					revs[rev] = true
					mu.Unlock()
					i++
				}
			})
		}
		wg.Wait()
	})
	assert.Equal(t, strconv.Itoa(workers*adds), value(t, st, state.Boxes, "n"), "no update lost")
	assert.Len(t, revs, workers*adds)
	t.Logf("%d conflicts retried", conflicts)
}

// concurrentCreates: of goroutines that all create one record (guard 0),
// exactly one succeeds, and the record is its.
func (s *suite) concurrentCreates(t *testing.T) {
	st := s.store(t)
	const workers = 16
	var mu sync.Mutex
	var won []string
	within(t, "the creates", func() {
		var wg sync.WaitGroup
		for i := range workers {
			wg.Go(func() {
				v := fmt.Sprintf("w%d", i)
				_, err := st.Commit(ctx, state.Put(state.Sessions, "s", []byte(v)).If(0), state.Put(state.Boxes, v, []byte(v)))
				if errors.Is(err, state.ErrConflict) {
					return
				}
				if assert.NoError(t, err) {
					mu.Lock()
					won = append(won, v)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	})
	require.Len(t, won, 1, "exactly one create wins")
	assert.Equal(t, won[0], value(t, st, state.Sessions, "s"))
	assert.Equal(t, won, keys(list(t, st, state.Boxes, "")), "the losers' other ops were not written")
}
