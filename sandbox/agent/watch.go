package agent

import (
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
)

const (
	defaultDebounce = 10 * time.Millisecond
	maxBatch        = 1000 // events per frame
	// maxHold bounds, in debounces, how long events wait for a quiet
	// tree: a file written without pause still shows every so often.
	maxHold = 10
)

func (s *server) handleWatch(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	p := q.Get("path")
	if p == "" {
		p = s.workspace
	}
	display, real, err := s.resolve("watch", p, false)
	if err == nil {
		var fi os.FileInfo
		if fi, err = os.Stat(real); err == nil && !fi.IsDir() {
			err = &Error{Op: "watch", Path: display, Code: CodeNotDir, Message: fmt.Sprintf("watch %s: not a directory", display)}
		}
	}
	if err != nil {
		writeError(w, asError("watch", display, err))
		return
	}
	debounce := defaultDebounce
	if ms, err := strconv.Atoi(q.Get("debounce_ms")); err == nil && ms > 0 {
		debounce = time.Duration(ms) * time.Millisecond
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		writeError(w, asError("watch", display, err))
		return
	}
	defer fw.Close()
	wt := &watchTree{fw: fw, real: real, display: display, s: s}
	wt.addTree(real, nil)
	frames := newFrameWriter(w)
	if frames.send(watchFrame{Ready: true}) != nil {
		return
	}

	// A batch goes once the tree has been quiet for debounce (at most
	// maxHold debounces after its first event): a file written in several
	// pieces is reported once it is whole, not after its first piece —
	// a reader (a sandbox node's output) would read it half-written.
	pending := map[string]Event{}
	var order []string
	timer := time.NewTimer(debounce)
	timer.Stop()
	var (
		fire  <-chan time.Time // timer.C while a batch is pending
		first time.Time        // of the pending batch
	)
	add := func(e Event) {
		now := time.Now()
		if fire == nil {
			first = now
		}
		// Go 1.23 on: no stale value is received after Reset.
		timer.Reset(min(debounce, first.Add(maxHold*debounce).Sub(now)))
		fire = timer.C
		if old, ok := pending[e.Path]; ok {
			// Coalesce: a create followed by writes stays a create; a
			// remove or rename wins.
			if e.Op == "write" || old.Op == e.Op {
				return
			}
			pending[e.Path] = e
			return
		}
		pending[e.Path] = e
		order = append(order, e.Path)
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case <-s.ctx.Done():
			return
		case err, ok := <-fw.Errors:
			if !ok {
				return
			}
			s.log.Warn("agent: watch error", "path", display, "err", err)
		case ev, ok := <-fw.Events:
			if !ok {
				return
			}
			for _, e := range wt.translate(ev) {
				add(e)
			}
		case <-fire:
			fire = nil
			for len(order) > 0 {
				n := min(len(order), maxBatch)
				batch := make([]Event, n)
				for i, p := range order[:n] {
					batch[i] = pending[p]
					delete(pending, p)
				}
				order = order[n:]
				if frames.send(watchFrame{Events: batch}) != nil {
					return
				}
			}
			order = order[:0]
		}
	}
}

type watchTree struct {
	fw            *fsnotify.Watcher
	real, display string
	s             *server
}

// addTree watches dir and every directory under it (but .git); with found
// non-nil it reports what it finds as created (a directory made and filled
// before its watch was in place).
func (wt *watchTree) addTree(dir string, found *[]Event) {
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() {
			if d.Name() == ".git" && p != wt.real {
				return filepath.SkipDir
			}
			if err := wt.fw.Add(p); err != nil {
				wt.s.log.Warn("agent: watch add", "dir", p, "err", err)
			}
		}
		if found != nil && p != dir {
			*found = append(*found, Event{Path: wt.shown(p), Op: "create", Time: time.Now()})
		}
		return nil
	})
}

func (wt *watchTree) shown(p string) string {
	rel, err := filepath.Rel(wt.real, p)
	if err != nil || strings.HasPrefix(rel, "..") {
		return p
	}
	return filepath.Join(wt.display, rel)
}

func (wt *watchTree) translate(ev fsnotify.Event) []Event {
	now := time.Now()
	var op string
	switch {
	case ev.Has(fsnotify.Create):
		op = "create"
	case ev.Has(fsnotify.Write):
		op = "write"
	case ev.Has(fsnotify.Remove):
		op = "remove"
	case ev.Has(fsnotify.Rename):
		op = "rename"
	default:
		return nil // chmod
	}
	if rel, err := filepath.Rel(wt.real, ev.Name); err == nil && slices.Contains(strings.Split(rel, "/"), ".git") {
		return nil // git's own churn
	}
	if isWriteTemp(filepath.Base(ev.Name)) {
		return nil // our own atomic write; its rename shows up as the target's create
	}
	out := []Event{{Path: wt.shown(ev.Name), Op: op, Time: now}}
	if op == "create" {
		if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
			wt.addTree(ev.Name, &out)
		}
	}
	return out
}

// isWriteTemp reports whether name is a temporary file of an atomic write
// (".NAME.cellbox-123", see writeAtomic); watchers never see those.
func isWriteTemp(name string) bool {
	i := strings.LastIndex(name, ".cellbox-")
	if !strings.HasPrefix(name, ".") || i <= 0 {
		return false
	}
	digits := name[i+len(".cellbox-"):]
	return digits != "" && strings.Trim(digits, "0123456789") == ""
}
