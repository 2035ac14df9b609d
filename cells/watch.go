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
	wake   chan struct{}
	out    chan Batch
}

func (s *db) notify() {
	s.watchMu.Lock()
	for w := range s.watchers {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	s.watchMu.Unlock()
}

func (s *db) Watch(ctx context.Context, prefix string, from uint64) (<-chan Batch, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	w := &watcher{prefix: prefix, last: from, wake: make(chan struct{}, 1), out: make(chan Batch, 16)}
	s.watchMu.Lock()
	s.watchers[w] = struct{}{}
	s.watchMu.Unlock()
	go s.follow(ctx, w)
	return w.out, nil
}

func (s *db) follow(ctx context.Context, w *watcher) {
	defer func() {
		s.watchMu.Lock()
		delete(s.watchers, w)
		s.watchMu.Unlock()
		close(w.out)
	}()
	for {
		for w.last < s.version.Load() || w.last > s.version.Load() {
			batches, err := s.catchUp(w)
			if err != nil {
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
		select {
		case <-w.wake:
		case <-ctx.Done():
			return
		case <-s.done:
			return
		}
	}
}

// catchUp reads the next batches after w.last (or a snapshot) and advances
// w.last past them.
func (s *db) catchUp(w *watcher) ([]Batch, error) {
	var out []Batch
	err := s.View(func(t Tx) error {
		tt := t.(*tx)
		info, err := tt.bucket(bucketInfo)
		if err != nil {
			return err
		}
		current := tt.version
		start := readU64(info.get(keyLogStart))
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
		lg, err := tt.bucket(bucketLog)
		if err != nil {
			return err
		}
		lg.scan(u64(w.last+1), func(k, v []byte) bool {
			ver := readU64(k)
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
		if err == nil && w.last < current && len(out) < watchChunk {
			// The log ended before the current version: should not happen.
			err = fmt.Errorf("change log ends at %d, store at %d", w.last, current)
		}
		return err
	})
	return out, err
}
