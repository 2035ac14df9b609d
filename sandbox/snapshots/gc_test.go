package snapshots

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/blobs"
	"github.com/cellbox/cellbox/sandbox/state"
)

// twoServers opens two Stores over one state store and one blob store, as
// two servers sharing them have (shared says whether they know it).
func twoServers(t *testing.T, shared bool) (a, b *Store, st state.Store) {
	t.Helper()
	st = state.NewMemory()
	bs, err := blobs.OpenDir(t.TempDir())
	require.NoError(t, err)
	a, err = Open(st, bs, t.TempDir(), shared)
	require.NoError(t, err)
	b, err = Open(st, bs, t.TempDir(), shared)
	require.NoError(t, err)
	return a, b, st
}

// TestSharedHoldKeepsOtherServersOff: while one server holds a session
// (its capture stored, its manifest not yet), another server's Sweep and
// Delete free none of the session's blobs; once the manifest is in, the
// snapshot reads back whole. Without shared (each server's lock its own)
// the other server takes the capture's blobs.
func TestSharedHoldKeepsOtherServersOff(t *testing.T) {
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	for _, shared := range []bool{true, false} {
		t.Run(fmt.Sprint("shared=", shared), func(t *testing.T) {
			a, b, _ := twoServers(t, shared)
			release, err := a.Hold(ctx, "s-a")
			require.NoError(t, err)
			entries, _ := captureHeld(t, a, "s-a", map[string]string{"f.txt": "the only copy"})
			b.Sweep(ctx, quiet)
			freed, err := b.Delete(ctx, "s-a")
			require.NoError(t, err)
			require.NoError(t, a.Put(ctx, Record{ID: "snap-1", Session: "s-a", Spec: json.RawMessage(`{}`)}, entries))
			release()
			if !shared {
				assert.EqualValues(t, 0, a.Bytes("s-a"), "without shared the other server took the blobs: the guard this test checks")
				return
			}
			assert.EqualValues(t, 0, freed)
			b.Sweep(ctx, quiet)
			_, got, err := b.Get(ctx, "s-a", "snap-1")
			require.NoError(t, err)
			var buf bytes.Buffer
			require.NoError(t, b.WriteTar(ctx, &buf, "s-a", got), "the snapshot reads back on the other server")
			assert.EqualValues(t, len("the only copy"), b.Bytes("s-a"))

			// Once nothing holds it, the other server collects what no
			// snapshot names, and leaves no record of its collection.
			captureHeld(t, a, "s-a", map[string]string{"orphan": "a capture whose server died"})
			b.Sweep(ctx, quiet)
			assert.EqualValues(t, len("the only copy"), b.Bytes("s-a"))
		})
	}
}

// TestSharedHoldWaitsForACollection: a hold waits while another server
// collects the session, and goes on when the collection's record is gone;
// a collection record that ran out (its server died) is taken over at
// once; a hold of a server that died (run out) keeps nothing.
func TestSharedHoldWaitsForACollection(t *testing.T) {
	ctx := context.Background()
	a, b, st := twoServers(t, true)
	rev, err := st.Commit(ctx, state.Put(state.SnapshotGC, "s-a", gcValue(time.Now().Add(time.Minute))))
	require.NoError(t, err)

	held := make(chan func(), 1)
	go func() {
		release, err := a.Hold(ctx, "s-a")
		assert.NoError(t, err)
		held <- release
	}()
	select {
	case <-held:
		t.Fatal("a hold began while another server collected the session")
	case <-time.After(5 * holdPoll):
	}
	short, cancel := context.WithTimeout(ctx, 20*holdPoll) // long enough to see the collection on a loaded machine
	_, err = b.Hold(short, "s-a")
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "collection")
	_, err = st.Commit(ctx, state.Delete(state.SnapshotGC, "s-a").If(rev))
	require.NoError(t, err)
	var release func()
	select {
	case release = <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the hold did not begin once the collection was over")
	}
	release()
	holds, err := st.List(ctx, state.SnapshotHolds, "")
	require.NoError(t, err)
	assert.Empty(t, holds, "a released hold leaves no record")

	// A collection whose server died: its record ran out.
	_, err = st.Commit(ctx, state.Put(state.SnapshotGC, "s-a", gcValue(time.Now().Add(-time.Second))))
	require.NoError(t, err)
	release, err = a.Hold(ctx, "s-a")
	require.NoError(t, err)
	_, err = st.Get(ctx, state.SnapshotGC, "s-a")
	require.ErrorIs(t, err, state.ErrNotFound, "the hold took the dead collection's record away")
	release()

	// A hold whose server died: run out, it keeps nothing, and the next
	// collection removes it.
	_, err = st.Commit(ctx, state.Put(state.SnapshotHolds, "s-a/dead", gcValue(time.Now().Add(-time.Second))))
	require.NoError(t, err)
	captureHeld(t, a, "s-a", map[string]string{"orphan": "left behind"})
	b.Sweep(ctx, slog.New(slog.DiscardHandler))
	assert.EqualValues(t, 0, b.Bytes("s-a"))
	holds, err = st.List(ctx, state.SnapshotHolds, "")
	require.NoError(t, err)
	assert.Empty(t, holds)
	gcs, err := st.List(ctx, state.SnapshotGC, "")
	require.NoError(t, err)
	assert.Empty(t, gcs, "a collection leaves no record")
}

// TestSharedSnapshotsSurviveCollections: two servers take snapshots of
// one session (the same content again and again, so that a Put finds its
// blob already there) while both delete snapshots and sweep; every
// snapshot still stored at the end reads back whole.
func TestSharedSnapshotsSurviveCollections(t *testing.T) {
	ctx := context.Background()
	a, b, _ := twoServers(t, true)
	quiet := slog.New(slog.DiscardHandler)
	var wg sync.WaitGroup
	for i, ss := range []*Store{a, b} {
		wg.Add(2)
		go func() { // snapshots, each deleting the one before
			defer wg.Done()
			prev := ""
			for n := range 40 {
				release, err := ss.Hold(ctx, "s-a")
				if !assert.NoError(t, err) {
					return
				}
				entries, _ := captureHeld(t, ss, "s-a", map[string]string{"same.txt": "shared content", "own.txt": fmt.Sprint(i, n%3)})
				id := fmt.Sprintf("snap-%d-%d", i, n)
				assert.NoError(t, ss.Put(ctx, Record{ID: id, Session: "s-a", Spec: json.RawMessage(`{}`)}, entries))
				release()
				if prev != "" {
					_, err := ss.Delete(ctx, "s-a", prev)
					assert.NoError(t, err)
				}
				prev = id
			}
		}()
		go func() {
			defer wg.Done()
			for range 40 {
				ss.Sweep(ctx, quiet)
			}
		}()
	}
	wg.Wait()
	recs, err := a.List(ctx, "s-a")
	require.NoError(t, err)
	require.Len(t, recs, 2, "each writer's last snapshot")
	for _, rec := range recs {
		_, entries, err := a.Get(ctx, "s-a", rec.ID)
		require.NoError(t, err)
		require.NoError(t, a.WriteTar(ctx, io.Discard, "s-a", entries), "snapshot %s lost a blob", rec.ID)
	}
}
