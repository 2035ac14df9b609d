package runapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/cellbox/cellbox/cells"
)

// pingEvery is how often an idle event stream gets a comment, so proxies
// and clients keep it open.
const pingEvery = 15 * time.Second

func (s *Server) handleWatch(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	cut, err := cutterOf(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	prefix, err := ResolvePrefix(s.store, s.loaded(), q.Get("prefix"))
	if err != nil {
		writeErr(w, err)
		return
	}
	from, hasFrom, err := watchFrom(q.Get("from"), r.Header.Get("Last-Event-ID"))
	if err != nil {
		writeErr(w, err)
		return
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		writeErr(w, errorf(500, "this connection cannot stream events"))
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	var first *cells.Batch
	if !hasFrom {
		snap, err := Snapshot(s.store, prefix)
		if err != nil {
			writeErr(w, err)
			return
		}
		first, from = &snap, snap.Version
	}
	ch, err := s.store.Watch(ctx, prefix, from)
	if err != nil {
		writeErr(w, fmt.Errorf("watch %q: %w", prefix, err))
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if first != nil {
		if writeEvent(w, *first, cut) != nil {
			return
		}
	}
	flusher.Flush()
	ping := time.NewTicker(pingEvery)
	defer ping.Stop()
	for {
		select {
		case b, ok := <-ch:
			if !ok {
				return
			}
			if writeEvent(w, b, cut) != nil || b.Err != nil {
				if b.Err != nil {
					flusher.Flush()
					s.log.Error("watch ended", "prefix", prefix, "error", b.Err)
				}
				return
			}
		case <-ping.C:
			if _, err := w.Write([]byte(": ping\n\n")); err != nil {
				return
			}
		case <-ctx.Done():
			return
		case <-s.shutdown:
			return
		}
		flusher.Flush()
	}
}

// watchFrom reads the version to watch from: the from parameter, else the
// Last-Event-ID an EventSource sends when it reconnects.
func watchFrom(param, lastID string) (uint64, bool, error) {
	v := param
	if v == "" {
		v = lastID
	}
	if v == "" {
		return 0, false, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, false, errorf(400, "from=%q: want a version (a non-negative integer, the id of the last event seen)", v)
	}
	return n, true, nil
}

// Snapshot returns the current state of every cell under prefix as a
// snapshot batch, at the store's current version.
func Snapshot(store cells.Store, prefix string) (cells.Batch, error) {
	b := cells.Batch{Snapshot: true}
	err := store.View(context.Background(), func(tx cells.Tx) error {
		cs, err := tx.List(prefix)
		b.Version = tx.Version()
		for _, c := range cs {
			b.Changes = append(b.Changes, cells.Change{Cell: c})
		}
		return err
	})
	if err != nil {
		return b, fmt.Errorf("read cells %q: %w", prefix, err)
	}
	return b, nil
}

// writeEvent writes one batch as a server-sent event whose id is its
// version, its values cut as the request asked.
func writeEvent(w http.ResponseWriter, b cells.Batch, cut cutter) error {
	out := BatchOf(b)
	cut.batch(&out)
	data, err := json.Marshal(out)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "id: %d\ndata: %s\n\n", b.Version, data)
	_, err = w.Write(buf.Bytes())
	return err
}
