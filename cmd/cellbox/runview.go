package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/patterns"
	"github.com/cellbox/cellbox/runtime"
	"github.com/cellbox/cellbox/server/runapi"
)

// view shows a running pattern: on a terminal a table redrawn in place
// (node, kind, state, time, short value; then the input cells), otherwise
// one timestamped line per change, with a progress line every
// progressEvery while nodes run.
type view struct {
	rt     *runtime.Runtime
	store  cells.Store
	p      *patterns.Pattern
	prefix string
	out    io.Writer
	tty    bool
	begun  time.Time

	mu      sync.Mutex
	nodes   map[string]*nodeView
	cells   map[string]cells.Cell // by name
	shown   map[string]string     // the last line shown per cell (plain)
	urls    map[string][]preview  // the preview URLs shown per node (plain)
	servers map[string]string     // the server state shown per node (plain)
	notes   []string              // warnings shown under the table (tty)
	drawn   int                   // lines of the last table (tty)
	dirty   bool
	ready   bool // the pattern is loaded: draw
	lastRun time.Time
}

// nodeView is what status events told about a node.
type nodeView struct {
	kind    string
	started time.Time     // of the current run
	last    time.Duration // of the last run
	note    string        // "cached", "aborted"
}

const (
	redrawEvery   = 100 * time.Millisecond
	progressEvery = 10 * time.Second
)

func newView(rt *runtime.Runtime, store cells.Store, p *patterns.Pattern, out io.Writer, tty bool) *view {
	v := &view{
		rt: rt, store: store, p: p, out: out, tty: tty, begun: time.Now(),
		prefix: runapi.DefaultSpace + "/" + p.Name + "/",
		nodes:  map[string]*nodeView{}, cells: map[string]cells.Cell{}, shown: map[string]string{},
		urls:    map[string][]preview{},
		servers: map[string]string{},
	}
	for _, n := range p.Nodes {
		v.nodes[n.Name] = &nodeView{kind: string(n.Kind)}
	}
	return v
}

// start follows status events and cell changes (from now on: it is called
// before the pattern loads). The returned finish shows every change
// committed so far, draws the last state and stops following.
func (v *view) start() (finish func()) {
	ctx, cancel := context.WithCancel(context.Background())
	statuses := v.rt.Subscribe(ctx, 4096)
	snap, err := runapi.Snapshot(v.store, v.prefix)
	var batches <-chan cells.Batch
	if err == nil {
		v.apply(snap, true)
		batches, err = v.store.Watch(ctx, v.prefix, snap.Version)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "cellbox run: cannot follow cells (the pattern runs on): %v\n", err)
	}
	stop := make(chan uint64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(redrawEvery)
		defer tick.Stop()
		seen, target := snap.Version, uint64(0)
		var quiet <-chan time.Time // while finishing: no change for a while
		for {
			select {
			case s, ok := <-statuses:
				if ok {
					v.status(s)
				} else {
					statuses = nil
				}
				continue
			case b, ok := <-batches:
				if !ok {
					batches = nil
					break
				}
				if b.Err != nil {
					fmt.Fprintf(os.Stderr, "cellbox run: stopped following cells (the pattern runs on): %v\n", b.Err)
					continue
				}
				v.apply(b, false)
				seen = b.Version
				if quiet != nil {
					quiet = time.After(finishQuiet)
				}
			case now := <-tick.C:
				v.tick(now)
			case target = <-stop:
				quiet = time.After(finishQuiet)
			case <-quiet:
				target = seen // nothing more came
			}
			if quiet != nil && seen >= target {
				for len(statuses) > 0 {
					v.status(<-statuses)
				}
				v.mu.Lock()
				v.dirty = true
				v.draw()
				v.mu.Unlock()
				return
			}
		}
	}()
	return func() {
		stop <- v.store.Version()
		<-done
		cancel()
	}
}

// finishQuiet is how long finishing waits for changes a watch filters out.
const finishQuiet = 200 * time.Millisecond

// loaded tells the view the pattern is loaded.
func (v *view) loaded() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.ready = true
	v.dirty = true
}

// reloaded shows the pattern p (its file was edited and loaded again,
// or failed to) from now on, with a note.
func (v *view) reloaded(p *patterns.Pattern, note string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if p != nil {
		v.p = p
		nodes := map[string]*nodeView{}
		for _, n := range p.Nodes {
			if nv, ok := v.nodes[n.Name]; ok && nv.kind == string(n.Kind) {
				nodes[n.Name] = nv
			} else {
				nodes[n.Name] = &nodeView{kind: string(n.Kind)}
			}
		}
		v.nodes = nodes
	}
	v.dirty = true
	if v.tty {
		v.notes = append(v.notes, note)
		return
	}
	v.line("%s", note)
}

func stamp(t time.Time) string { return t.Format("15:04:05.000") }

// warn prints a warning: a timestamped line (plain mode), or a line kept
// under the table (tty).
func (v *view) warn(format string, args ...any) {
	if v.tty {
		v.notes = append(v.notes, fmt.Sprintf(format, args...))
		return
	}
	v.line("warning: "+format, args...)
}

// declares reports whether the pattern declares a cell or node called name
// (streams are not shown as cells).
func (v *view) declares(name string) bool {
	if _, ok := v.p.Cell(name); ok {
		return true
	}
	_, ok := v.p.Node(name)
	return ok
}

// line prints a timestamped line (plain mode).
func (v *view) line(format string, args ...any) {
	if !v.tty {
		fmt.Fprintf(v.out, "%s %s\n", stamp(time.Now()), fmt.Sprintf(format, args...))
	}
}

func (v *view) status(s runtime.Status) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if s.Node.Prefix() != v.prefix {
		return
	}
	name := s.Node.Name
	if s.Kind == runtime.Reset { // a cell, as the pattern loaded
		v.dirty = true
		v.warn("cell %s reset: %s", name, oneLine(s.Err))
		return
	}
	n := v.nodes[name]
	if n == nil {
		n = &nodeView{}
		v.nodes[name] = n
	}
	v.dirty = true
	what := ""
	switch s.Kind {
	case runtime.Started:
		n.started, n.note = s.At, ""
		what = "started"
	case runtime.Finished:
		n.last, n.started = s.Duration, time.Time{}
		if s.Stream != "" {
			what = fmt.Sprintf("handled a %s event in %s", s.Stream, round(s.Duration))
		} else if n.kind != string(patterns.KindComputed) {
			n.note = ""
			what = "done in " + round(s.Duration)
		}
	case runtime.Failed:
		n.last, n.started, n.note = s.Duration, time.Time{}, ""
		what = "failed: " + oneLine(s.Err)
		if s.Stream != "" {
			what = fmt.Sprintf("failed on a %s event: %s", s.Stream, oneLine(s.Err))
		}
	case runtime.Aborted:
		n.started, n.note = time.Time{}, "aborted"
		what = fmt.Sprintf("aborted after %s (newer inputs, or stopping)", round(s.Duration))
	case runtime.Cached:
		n.note, n.last = "cached", 0
		what = "done (cached result, nothing run)"
	case runtime.BackedOff:
		what = "backing off: " + oneLine(s.Err)
	case runtime.Opened:
		what = "opened in " + round(s.Duration)
	case runtime.Closed:
		what = "closed"
	}
	if what != "" {
		v.line("node %s %s", name, what)
	}
}

func (v *view) apply(b cells.Batch, initial bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.dirty = true
	for _, c := range b.Changes {
		name := c.Cell.Addr.Name
		if c.Deleted {
			delete(v.cells, name)
			continue
		}
		if initial && !c.Cell.Stream && !v.declares(name) {
			continue // stored by an earlier version of the pattern: removed as it loads
		}
		if c.Cell.Stream {
			if c.Event != nil {
				v.line("event %d on %s: %s", c.Event.ID, name, short(c.Event.Payload, 80))
			}
			continue
		}
		v.cells[name] = c.Cell
		what := "cell"
		if _, ok := v.nodes[name]; ok {
			what = "node"
		}
		suffix := ""
		if initial {
			suffix = "  (stored)"
		}
		if what == "node" {
			v.previewLines(name, c.Cell.Value)
			v.serverLine(name, c.Cell.Value)
		}
		text := "= " + short(c.Cell.Value, 100)
		if c.Cell.Error != "" {
			text = "has an error: " + oneLine(c.Cell.Error)
		}
		if text == v.shown[name] || c.Cell.Error != "" && what == "node" && !initial {
			continue // nothing new to see; a node's failure has its status line
		}
		v.shown[name] = text
		v.line("%s %s %s%s", what, name, text, suffix)
	}
}

// previewLines prints a sandbox node's preview URLs when they change
// (plain mode).
func (v *view) previewLines(name string, raw json.RawMessage) {
	ps := previews(raw)
	if slices.Equal(ps, v.urls[name]) {
		return
	}
	v.urls[name] = ps
	for _, p := range ps {
		v.line("node %s preview of port %s: %s", name, p.port, p.url)
	}
}

// serverLine prints a sandbox node's server state when it changes (plain
// mode): starting, ready, exited 1, backoff 2s...
func (v *view) serverLine(name string, raw json.RawMessage) {
	var out struct {
		Server *struct {
			Command  string `json:"command"`
			State    string `json:"state"`
			ExitCode *int   `json:"exit_code"`
			RetryMs  int64  `json:"retry_ms"`
			Error    string `json:"error"`
		} `json:"server"`
	}
	if json.Unmarshal(raw, &out) != nil || out.Server == nil {
		return
	}
	st := out.Server
	state := st.State
	switch {
	case state == "exited" && st.ExitCode != nil:
		state = fmt.Sprintf("exited with code %d", *st.ExitCode)
	case state == "exited" && st.Error != "":
		state = "exited: " + oneLine(st.Error)
	case state == "backoff":
		state = fmt.Sprintf("restarting in %s", time.Duration(st.RetryMs)*time.Millisecond)
	}
	if v.servers[name] == state {
		return
	}
	v.servers[name] = state
	command := oneLine(st.Command)
	if len(command) > 60 {
		command = strings.ToValidUTF8(command[:60], "") + "…"
	}
	v.line("node %s server (%s): %s", name, command, state)
}

// preview is a preview URL of a port of a sandbox node's box.
type preview struct{ port, url string }

// previews returns the preview URLs in a sandbox node's output, by port.
func previews(raw json.RawMessage) []preview {
	var out struct {
		Previews map[string]struct {
			URL string `json:"url"`
		} `json:"previews"`
	}
	if json.Unmarshal(raw, &out) != nil {
		return nil
	}
	var ps []preview
	for port, p := range out.Previews {
		ps = append(ps, preview{port, p.URL})
	}
	slices.SortFunc(ps, func(a, b preview) int {
		if c := cmp.Compare(len(a.port), len(b.port)); c != 0 {
			return c // numerically: no leading zeros
		}
		return strings.Compare(a.port, b.port)
	})
	return ps
}

func (v *view) tick(now time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	running := v.running()
	if v.tty {
		if len(running) > 0 && now.Sub(v.lastRun) >= time.Second {
			v.lastRun, v.dirty = now, true // elapsed times move
		}
		v.draw()
		return
	}
	if len(running) == 0 {
		v.lastRun = time.Time{}
		return
	}
	if v.lastRun.IsZero() {
		v.lastRun = now
	}
	if now.Sub(v.lastRun) >= progressEvery {
		v.lastRun = now
		parts := make([]string, len(running))
		for i, name := range running {
			parts[i] = name + " " + round(now.Sub(v.nodes[name].started))
		}
		v.line("still running after %s: %s", round(now.Sub(v.begun)), strings.Join(parts, ", "))
	}
}

// running lists the nodes with a run in flight, in declaration order.
func (v *view) running() []string {
	var out []string
	for _, n := range v.p.Nodes {
		if nv := v.nodes[n.Name]; nv != nil && !nv.started.IsZero() {
			out = append(out, n.Name)
		}
	}
	return out
}

// state is a node's state as the view shows it.
func (v *view) state(info runtime.NodeInfo, ok bool, name string) string {
	nv := v.nodes[name]
	switch {
	case !ok:
		return "pending"
	case info.State == runtime.Running:
		return "running"
	case info.State == runtime.Error:
		return "failed"
	case info.State == runtime.Backoff:
		return "backoff"
	case info.State == runtime.Open:
		return "open"
	case nv != nil && nv.note == "aborted":
		return "aborted"
	}
	var env struct {
		Pending       bool
		Result, Error json.RawMessage
	}
	if json.Unmarshal(v.cells[name].Value, &env) == nil {
		switch {
		case env.Pending:
			return "pending"
		case info.Shape == "async" && isNull(env.Result) && isNull(env.Error):
			return "waiting" // never run: its inputs are not there yet (the page says so too)
		}
	}
	return "done"
}

// isNull reports whether raw is JSON null or missing.
func isNull(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }

// rowTime is a node's TIME in the table: how long the running one has
// run, how long the last run took, or "cached" for a result that came from
// the memo cache — nothing ran, so the time of the run that made it (which
// info.Last still holds) would mislead.
func rowTime(state string, nv *nodeView, info runtime.NodeInfo, now time.Time) string {
	switch {
	case nv == nil:
		if info.Last > 0 {
			return round(info.Last)
		}
		return ""
	case state == "running" && !nv.started.IsZero():
		return round(now.Sub(nv.started)) + "…"
	case state == "done" && nv.note == "cached":
		return "cached"
	case nv.last > 0:
		return round(nv.last)
	case info.Last > 0:
		return round(info.Last)
	}
	return ""
}

// draw redraws the table in place (tty only), if anything changed.
func (v *view) draw() {
	if !v.tty || !v.dirty || !v.ready {
		return
	}
	v.dirty = false
	infos := map[string]runtime.NodeInfo{}
	for _, n := range v.rt.Nodes() {
		if n.Addr.Prefix() == v.prefix {
			infos[n.Addr.Name] = n
		}
	}
	now := time.Now()
	counts := map[string]int{}
	var tb bytes.Buffer
	tw := tabwriter.NewWriter(&tb, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  NODE\tKIND\tSTATE\tTIME\tVALUE")
	for _, n := range v.p.Nodes {
		info, ok := infos[n.Name]
		st := v.state(info, ok, n.Name)
		counts[st]++
		t := rowTime(st, v.nodes[n.Name], info, now)
		val := ""
		if c, ok := v.cells[n.Name]; ok {
			val = short(c.Value, 60)
			if c.Error != "" {
				val = "error: " + oneLine(c.Error)
			}
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", n.Name, n.Kind, st, t, val)
	}
	tw.Flush()
	var urls []string
	for _, n := range v.p.Nodes {
		for _, p := range previews(v.cells[n.Name].Value) {
			urls = append(urls, fmt.Sprintf("  %s:%s\t%s", n.Name, p.port, p.url))
		}
	}
	if len(urls) > 0 {
		tw = tabwriter.NewWriter(&tb, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  PREVIEW\tURL")
		fmt.Fprintln(tw, strings.Join(urls, "\n"))
		tw.Flush()
	}
	if len(v.p.Cells) > 0 {
		tw = tabwriter.NewWriter(&tb, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  CELL\tVALUE")
		for _, c := range v.p.Cells {
			fmt.Fprintf(tw, "  %s\t%s\n", c.Name, short(v.cells[c.Name].Value, 60))
		}
		tw.Flush()
	}
	for _, n := range v.notes {
		fmt.Fprintf(&tb, "  ! %s\n", n)
	}
	var summary []string
	for _, st := range []string{"pending", "waiting", "running", "done", "failed", "aborted", "backoff", "open"} {
		if counts[st] > 0 {
			summary = append(summary, fmt.Sprintf("%d %s", counts[st], st))
		}
	}
	header := fmt.Sprintf("%s · %s · %s", v.prefix[:len(v.prefix)-1], round(now.Sub(v.begun)), strings.Join(summary, ", "))
	lines := append([]string{header}, strings.Split(strings.TrimRight(tb.String(), "\n"), "\n")...)
	width, height := termSize(v.out)
	if max := height - 2; len(lines) > max && max > 2 { // the table must fit to be redrawn in place
		more := len(lines) - max + 1
		lines = append(lines[:max-1], fmt.Sprintf("  … %d more lines (a taller terminal, or: cellbox cell ls)", more))
	}
	var out bytes.Buffer
	if v.drawn > 0 {
		fmt.Fprintf(&out, "\x1b[%dA\r\x1b[J", v.drawn) // back to the table's first line, clear below
	}
	for _, l := range lines {
		out.WriteString(clip(l, width-1))
		out.WriteString("\n")
	}
	v.drawn = len(lines)
	v.out.Write(out.Bytes())
}

// short renders a value in one short line: an async node's output
// ({pending, result, error}) as its error, "pending" or its result (an exec
// result as its exit code and first line of output); a sandbox node's
// output as its status and last command; anything else as compact JSON;
// clipped to n runes.
func short(raw json.RawMessage, n int) string {
	var out struct {
		Pending *bool           `json:"pending"`
		Result  json.RawMessage `json:"result"`
		Error   *string         `json:"error"`
		Status  string          `json:"status"`
		History []execResult    `json:"history"`
	}
	if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &out) != nil || out.Pending == nil {
		return clip(string(orNull(raw)), n)
	}
	switch {
	case *out.Pending && out.Status == "":
		// An async node running again: its cell still holds the last
		// run's result and error until the run ends.
		return "pending"
	case out.Error != nil && *out.Error != "":
		return clip("error: "+oneLine(*out.Error), n)
	case *out.Pending:
		return "pending"
	case out.Status != "": // a sandbox node
		s := out.Status
		if k := len(out.History); k > 0 {
			s += fmt.Sprintf(" · %d commands · last: %s", k, out.History[k-1].line())
		}
		return clip(s, n)
	}
	var res execResult
	if json.Unmarshal(out.Result, &res) == nil && res.ExitCode != nil {
		return clip(res.line(), n)
	}
	return clip(string(orNull(out.Result)), n)
}

// execResult is the part of an exec result or sandbox history entry the
// view shows.
type execResult struct {
	ExitCode *int   `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
}

// line is "exit N" and the first line of the output (of stderr on failure).
func (r execResult) line() string {
	out := strings.TrimSpace(r.Stdout)
	code := -1
	if r.ExitCode != nil {
		code = *r.ExitCode
	}
	if code != 0 && strings.TrimSpace(r.Stderr) != "" {
		out = strings.TrimSpace(r.Stderr)
	}
	first, _, _ := strings.Cut(out, "\n")
	return strings.TrimSpace(fmt.Sprintf("exit %d %s", code, first))
}

func orNull(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return json.RawMessage("null")
	}
	return raw
}

// clip cuts s to n runes, marking the cut with "…", its control
// characters shown (printable).
func clip(s string, n int) string {
	s = printable(s)
	if n <= 1 || utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// round shows a duration with two or three significant digits.
func round(d time.Duration) string {
	switch {
	case d >= time.Minute:
		return d.Round(time.Second).String()
	case d >= time.Second:
		return d.Round(100 * time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Microsecond).String()
}

// isTerminal reports whether f is a terminal.
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// termSize is the terminal's width and height (80×24 if unknown).
func termSize(w io.Writer) (width, height int) {
	if f, ok := w.(*os.File); ok {
		if ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ); err == nil && ws.Col > 0 && ws.Row > 0 {
			return int(ws.Col), int(ws.Row)
		}
	}
	return 80, 24
}
