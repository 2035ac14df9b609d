package snapshots

// Holds and collections across servers. Store.gc keeps a collection from
// taking blobs a capture of the same process is about to name; servers
// sharing a state store and a blob store (Open's shared) also keep it from
// taking those of another server's capture. Each side says what it does in
// the state store, and a guard orders the two:
//
//   - a hold is a record SnapshotHolds[SESSION/id] (until when it holds,
//     should its server die), put in a commit guarded on the session having
//     no SnapshotGC record: no hold begins while a collection runs;
//   - a collection puts SnapshotGC[SESSION] (guarded on its absence), then
//     lists the session's holds: with one that has not run out it collects
//     nothing (Sweep comes back to it later), else it collects and deletes
//     its record. A hold committed before its record is in that list; one
//     after it cannot be committed.
//
// A collection whose server dies leaves its record: a hold waits out its
// until (collectTTL) and then removes it. Both TTLs are far beyond the
// time a capture or a collection takes; they only bound what a dead
// server's records delay, and the clocks of the servers must agree to
// within them.

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cellbox/cellbox/sandbox/state"
)

const (
	// holdTTL is how long a hold of a server that died keeps its session's
	// blobs from being collected.
	holdTTL = time.Hour
	// collectTTL is the most a collection may take: it stops deleting
	// before then, and a hold may take its record over after it.
	collectTTL = 10 * time.Minute
	// holdPoll is how often a hold looks whether a collection is over.
	holdPoll = 50 * time.Millisecond
)

// gcRecord is the value of a SnapshotHolds or SnapshotGC record.
type gcRecord struct {
	Until time.Time `json:"until"`
}

func gcValue(until time.Time) []byte {
	b, _ := json.Marshal(gcRecord{Until: until.UTC()})
	return b
}

// runOut reports whether the record v ran out by now; one that does not
// decode has (no server wrote it so).
func runOut(v []byte, now time.Time) bool {
	var r gcRecord
	return json.Unmarshal(v, &r) != nil || !now.Before(r.Until)
}

// collection reads session's SnapshotGC record: its revision (0: none) and
// whether a collection runs (a record that ran out is its dead server's:
// the next commit guarded on rev takes it over).
func (s *Store) collection(ctx context.Context, session string) (rev uint64, runs bool, err error) {
	r, err := s.st.Get(ctx, state.SnapshotGC, session)
	if errors.Is(err, state.ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	return r.Revision, !runOut(r.Value, time.Now()), nil
}

// holdShared records a hold of session's blobs in the state store, once no
// collection of the session runs; it returns the hold's key.
func (s *Store) holdShared(ctx context.Context, session string) (string, error) {
	key := session + "/" + rand.Text()
	waited := false
	for {
		rev, runs, err := s.collection(ctx, session)
		if err != nil && waited && ctx.Err() != nil {
			err = errWaited(ctx) // it ended during the read, not the wait
		}
		if err != nil {
			return "", fmt.Errorf("snapshot store: %w", err)
		}
		if runs { // on another server
			waited = true
			select {
			case <-time.After(holdPoll):
				continue
			case <-ctx.Done():
				return "", fmt.Errorf("snapshot store: %w", errWaited(ctx))
			}
		}
		guard := state.Delete(state.SnapshotGC, session).If(rev) // none, or a dead server's
		_, err = s.st.Commit(ctx, state.Put(state.SnapshotHolds, key, gcValue(time.Now().Add(holdTTL))), guard)
		if errors.Is(err, state.ErrConflict) {
			continue // a collection began meanwhile
		}
		if err != nil {
			return "", fmt.Errorf("snapshot store: %w", err)
		}
		return key, nil
	}
}

// errWaited says that ctx ended while a hold waited for a collection.
func errWaited(ctx context.Context) error {
	return fmt.Errorf("waiting for a collection of this session's unused blobs on another server: %w", ctx.Err())
}

// releaseShared removes hold key; if it cannot, the hold runs out.
func (s *Store) releaseShared(key string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = s.st.Commit(ctx, state.Delete(state.SnapshotHolds, key))
}

// beginCollect records a collection of session's blobs and returns the
// context it collects under (it ends before the record runs out) and end,
// which deletes the record; ok is false, with nothing recorded, when the
// session has a hold or another collection runs (what it would collect
// is left to a later Sweep).
func (s *Store) beginCollect(ctx context.Context, session string) (_ context.Context, end func(), ok bool, err error) {
	until := time.Now().Add(collectTTL)
	var rev uint64
	for tries := 0; ; tries++ {
		cur, runs, err := s.collection(ctx, session)
		if err != nil || runs { // runs: on another server, now
			return nil, nil, false, err
		}
		rev, err = s.st.Commit(ctx, state.Put(state.SnapshotGC, session, gcValue(until)).If(cur))
		if errors.Is(err, state.ErrConflict) && tries < 10 {
			continue
		}
		if err != nil {
			return nil, nil, false, err
		}
		break
	}
	unrecord := func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_, _ = s.st.Commit(ctx, state.Delete(state.SnapshotGC, session).If(rev))
	}
	holds, err := s.st.List(ctx, state.SnapshotHolds, session+"/")
	if err != nil {
		unrecord()
		return nil, nil, false, err
	}
	now := time.Now()
	var stale []state.Op
	for _, h := range holds {
		if !runOut(h.Value, now) {
			unrecord()
			return nil, nil, false, nil
		}
		stale = append(stale, state.Delete(state.SnapshotHolds, h.Key).If(h.Revision))
	}
	if len(stale) > 0 { // holds of servers that died: gone with this collection
		_, _ = s.st.Commit(ctx, stale...)
	}
	cctx, cancel := context.WithDeadline(ctx, until.Add(-time.Minute))
	return cctx, func() { cancel(); unrecord() }, true, nil
}
