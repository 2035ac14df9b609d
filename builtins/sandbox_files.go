package builtins

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/cellbox/cellbox/runtime"
	"github.com/cellbox/cellbox/sandbox/api"
)

// A sandbox node's file bindings: input cells written into the box, and
// output files watched in the box and read back into its output.

// setFileProblems records the outcome of output file reads (path -> why
// it failed, "" when it worked) and writes the output with fn applied.
func (s *Sandbox) setFileProblems(ctx context.Context, errs map[string]string, fn func(o *sandboxOutput)) {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	for p, e := range errs {
		if e != "" {
			s.fileErrs[p] = e
		} else {
			delete(s.fileErrs, p)
		}
	}
	s.reportLocked(ctx, fn)
}

// writeAndReport writes the changed input files and reports whether that
// worked. Callers hold s.mu.
func (s *Sandbox) writeAndReport(ctx context.Context) error {
	err := s.writeInputs(ctx)
	if err != nil {
		s.log.Warn("write input files", "box", s.box, "error", err)
	}
	s.setInputProblem(ctx, err)
	return err
}

// writeInputs writes the input files whose content changed since they
// were last written. Callers hold s.mu.
func (s *Sandbox) writeInputs(ctx context.Context) error {
	for _, p := range slices.Sorted(maps.Keys(s.spec.Files)) {
		f := s.spec.Files[p]
		if f.Input == nil {
			continue
		}
		content, err := evalText(f.Input, s.in, "file "+p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256([]byte(content))
		if prev, ok := s.written[p]; ok && prev == sum {
			continue
		}
		if err := upload(ctx, s.env.Client, s.box, p, content); err != nil {
			return err
		}
		s.written[p] = sum
	}
	return nil
}

// restoreOutputs writes the output files the node last read from its box,
// as its output cell keeps them, into a box made anew. Callers hold s.mu.
func (s *Sandbox) restoreOutputs(ctx context.Context) error {
	raw, err := s.h.Get()
	if err != nil {
		return err
	}
	var o sandboxOutput
	if err := json.Unmarshal(raw, &o); err != nil || len(o.Files) == 0 {
		return err
	}
	for _, p := range s.outputs() {
		v, ok := o.Files[p]
		if !ok || string(v) == "null" {
			continue
		}
		content := string(v) // a json output: its JSON
		if s.spec.Files[p].Output == OutputText {
			if err := json.Unmarshal(v, &content); err != nil {
				return fmt.Errorf("output %s: %w", p, err)
			}
		}
		if err := upload(ctx, s.env.Client, s.box, p, content); err != nil {
			return err
		}
	}
	return nil
}

// outputs returns the output paths, sorted.
func (s *Sandbox) outputs() []string {
	var out []string
	for _, p := range slices.Sorted(maps.Keys(s.spec.Files)) {
		if s.spec.Files[p].Input == nil {
			out = append(out, p)
		}
	}
	return out
}

// watchDirs groups output paths by the directories to watch: each output's
// parent, dropping directories inside another one (watches are recursive).
func watchDirs(outputs []string) map[string][]string {
	var dirs []string
	for _, p := range outputs {
		dirs = append(dirs, path.Dir(p))
	}
	slices.Sort(dirs)
	dirs = slices.Compact(dirs)
	var top []string
	for _, d := range dirs {
		if !slices.ContainsFunc(top, func(t string) bool { return within(d, t) }) {
			top = append(top, d)
		}
	}
	groups := map[string][]string{}
	for _, p := range outputs {
		for _, t := range top {
			if within(path.Dir(p), t) {
				groups[t] = append(groups[t], p)
				break
			}
		}
	}
	return groups
}

// within reports whether dir is root or inside it.
func within(dir, root string) bool {
	return dir == root || root == "/" || strings.HasPrefix(dir, root+"/")
}

// startWatches watches the output files' directories (made if missing)
// and reads the files once. Callers hold s.mu.
func (s *Sandbox) startWatches(ctx context.Context) error {
	groups := watchDirs(s.outputs())
	if len(groups) == 0 {
		return nil
	}
	// Every output's directory is made, so that commands can write there
	// and the watch has a tree to watch.
	var parents []string
	for _, p := range s.outputs() {
		parents = append(parents, path.Dir(p))
	}
	if r, err := s.env.Client.Exec(ctx, s.box, api.ExecRequest{Argv: append([]string{"mkdir", "-p", "--"}, parents...)}, nil); err != nil {
		return fmt.Errorf("make output directories: %w", err)
	} else if r.ExitCode != 0 {
		return fmt.Errorf("make output directories %s: %s", strings.Join(parents, " "), lastLine(r.Stderr))
	}
	dirs := slices.Sorted(maps.Keys(groups))
	wctx, cancel := context.WithCancel(context.Background())
	chans := map[string]<-chan []api.WatchEvent{}
	for _, d := range dirs {
		ch, err := s.env.Client.Watch(wctx, s.box, d)
		if err != nil {
			cancel()
			return fmt.Errorf("watch %s: %w", d, err)
		}
		chans[d] = ch
	}
	s.stopWatch = cancel
	for _, d := range dirs {
		s.watchers.Add(1)
		go s.follow(wctx, d, groups[d], chans[d])
	}
	return nil
}

// follow reads the outputs under dir now and whenever the watch reports a
// change to one of them (paced, see pacedReads), re-establishing the watch
// if it ends while the box lives.
func (s *Sandbox) follow(ctx context.Context, dir string, outs []string, ch <-chan []api.WatchEvent) {
	defer s.watchers.Done()
	for {
		s.readFiles(ctx, outs)
		pacedReads(ctx, ch, outs, readPace, s.readFiles)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(watchRetry):
			}
			s.log.Info("file watch ended; watching again", "dir", dir)
			var err error
			mkdir := []string{"mkdir", "-p", "--"}
			for _, p := range outs {
				mkdir = append(mkdir, path.Dir(p))
			}
			if _, err = s.env.Client.Exec(ctx, s.box, api.ExecRequest{Argv: mkdir}, nil); err == nil {
				ch, err = s.env.Client.Watch(ctx, s.box, dir)
			}
			if err == nil {
				break
			}
			if ctx.Err() == nil {
				s.log.Warn("watch output files", "dir", dir, "error", err)
			}
		}
	}
}

// readPace and readBurst bound the time the runner spends reading one
// watched directory's outputs: a read that took d costs (1+readPace)×d of
// a budget that wall time refills, and reads wait while more than
// readBurst is owed. So changes now and then are read at once, and a box
// rewriting its outputs without end gets at most 1/(1+readPace) of the
// runner's time.
const (
	readPace  = 4
	readBurst = 100 * time.Millisecond
)

// pacedReads calls read with the outputs (of outs) that the watch batches
// from ch report changed, until ch closes or ctx ends, at the pace above.
// Changes that arrive while reads wait are gathered and read together:
// the last change of a burst is always read. Before, every change was
// read: a box rewriting a 4 MiB bound file in a loop cost the runner 0.74
// of a core (a read, a JSON copy and a store commit of every version),
// outside the box's CPU limit.
func pacedReads(ctx context.Context, ch <-chan []api.WatchEvent, outs []string, pace float64, read func(context.Context, []string)) {
	var (
		pending []string
		owed    time.Duration // read time not yet paid back by wall time
		paid    time.Time     // owed is as of then
		wake    <-chan time.Time
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-wake:
			wake = nil
		case batch, ok := <-ch:
			if !ok {
				return // the caller reads every output when it watches again
			}
			for _, ev := range batch {
				// Exact paths only: the agent's temp files
				// (.NAME.cellbox-*) and other files are not outputs.
				if slices.Contains(outs, ev.Path) && !slices.Contains(pending, ev.Path) {
					pending = append(pending, ev.Path)
				}
			}
		}
		if len(pending) == 0 || wake != nil {
			continue
		}
		now := time.Now()
		owed, paid = max(0, owed-now.Sub(paid)), now
		if wait := owed - readBurst; wait > 0 {
			wake = time.After(wait)
			continue
		}
		read(ctx, pending)
		pending = nil
		owed += time.Duration((1 + pace) * float64(time.Since(now)))
	}
}

// readFiles reads output files and writes what changed into files.
func (s *Sandbox) readFiles(ctx context.Context, paths []string) {
	type read struct {
		raw json.RawMessage
		err string
	}
	reads := map[string]read{}
	errs := map[string]string{}
	for _, p := range paths {
		v, found, err := readOutput(ctx, s.env.Client, s.box, p, s.spec.Files[p].Output)
		if ctx.Err() != nil {
			return // stopped: the box may be gone
		}
		var r read
		switch {
		case err != nil:
			r.err = err.Error()
			s.log.Warn("read output file", "path", p, "error", err)
		case found:
			if r.raw, err = json.Marshal(v); err != nil {
				r.err = fmt.Sprintf("output file %s: %v", p, err)
			}
		default:
			r.raw = json.RawMessage("null")
		}
		reads[p], errs[p] = r, r.err
	}
	s.setFileProblems(ctx, errs, func(o *sandboxOutput) {
		for p, r := range reads {
			if r.err == "" {
				o.Files[p] = r.raw
			}
		}
	})
}

// Update rewrites the input files whose value changed.
func (s *Sandbox) Update(ctx context.Context, in runtime.Inputs) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.in = in
	if !s.alive {
		return nil // written when the box is made
	}
	if image, err := evalImage(s.spec.Image, in); err == nil && image != s.image {
		s.log.Info("sandbox image changed: it applies when the box is made again (destroy, then run)", "box", s.box, "image", imageName(image), "current", imageName(s.image))
	}
	err := s.writeAndReport(ctx)
	s.startServer(ctx) // a new command (or env) restarts the server
	return err
}

// stopWatches ends the file watches and waits for their readers. Callers
// hold s.mu.
func (s *Sandbox) stopWatches() {
	if s.stopWatch == nil {
		return
	}
	s.stopWatch()
	s.stopWatch = nil
	s.watchers.Wait()
}
