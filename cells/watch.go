package cells

import (
	"context"
	"fmt"
)

// watchChunk bounds how many log entries one read transaction collects.
const watchChunk = 64

type watcher struct {
	prefix string
	last   uint64
	out    chan Batch
}

func (s *db) Watch(ctx context.Context, prefix string, from uint64) (<-chan Batch, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	w := &watcher{prefix: prefix, last: from, out: make(chan Batch, 16)}
	go s.follow(ctx, w)
	return w.out, nil
}

// follow sends the watch's batches: it reads the change log up to the
// KV's revision, then waits (KV.Wait) for the next versioned commit.
func (s *db) follow(ctx context.Context, w *watcher) {
	defer close(w.out)
	for {
		for w.last != s.kv.Revision() {
			batches, err := s.catchUp(ctx, w)
			if err != nil {
				if ctx.Err() != nil {
					return // ended by its context: no reason to give
				}
				// The store closed under the watch, or its log is corrupt:
				// deliver what was read, then end the watch saying why (the
				// client may reconnect from w.last).
				batches = append(batches, Batch{Version: w.last, Err: fmt.Errorf("watch %q after version %d: %w", w.prefix, w.last, err)})
			}
			for _, b := range batches {
				select {
				case w.out <- b:
				case <-ctx.Done():
					return
				case <-s.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
		if _, err := s.kv.Wait(ctx, w.last); err != nil {
			return // its context ended, or the store closed
		}
	}
}

// catchUp reads the next batches after w.last (or a snapshot) and advances
// w.last past them.
func (s *db) catchUp(ctx context.Context, w *watcher) ([]Batch, error) {
	var out []Batch
	err := s.View(ctx, func(t Tx) error {
		tt := t.(*tx)
		b, err := tt.get(bucketInfo, keyLogStart)
		if err != nil {
			return err
		}
		current := tt.version
		start := readU64(b)
		if w.last+1 < start || w.last > current {
			cells, err := t.List(w.prefix)
			if err != nil {
				return err
			}
			changes := make([]Change, len(cells))
			for i, c := range cells {
				changes[i] = Change{Cell: c}
			}
			out = append(out, Batch{Version: current, Snapshot: true, Changes: changes})
			w.last = current
			return nil
		}
		serr := tt.scan(bucketLog, string(u64(w.last+1)), "", func(k string, v []byte) bool {
			ver := readU64([]byte(k))
			var changes []Change
			if changes, err = decodeLog(v, w.prefix); err != nil {
				err = fmt.Errorf("change log entry %d: %w", ver, err)
				return false
			}
			w.last = ver
			if len(changes) > 0 {
				for i := range changes {
					if changes[i].Deleted {
						changes[i].Cell.Version = ver
					}
				}
				out = append(out, Batch{Version: ver, Changes: changes})
			}
			return len(out) < watchChunk && ver < current
		})
		if serr != nil {
			return serr
		}
		if err == nil && w.last < current && len(out) < watchChunk {
			// The log ended before the current version: should not happen.
			err = fmt.Errorf("change log ends at %d, store at %d", w.last, current)
		}
		return err
	})
	return out, err
}
