package builtins

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/internal/textcut"
	"github.com/cellbox/cellbox/sandbox/api"
)

// A sandbox node's streams: run (a command in the box, recorded in the
// history) and destroy.

// HistoryEntry is one command of a sandbox's history.
type HistoryEntry struct {
	Command    string    `json:"command"`
	Stdout     string    `json:"stdout"`
	Stderr     string    `json:"stderr"`
	ExitCode   int       `json:"exit_code"`
	Started    time.Time `json:"started"`
	DurationMs int64     `json:"duration_ms"`
	TimedOut   bool      `json:"timed_out,omitempty"`
	Truncated  bool      `json:"truncated,omitempty"`
	// Error says why the command could not run (no box, ...); ExitCode is
	// -1 then.
	Error string `json:"error,omitempty"`
	// Notices say what the box's agent saw around the command: it was
	// killed for memory, processes it left were ended, ...
	Notices []string `json:"notices,omitempty"`
	// Tool names the registry tool an llm node called in the box (Command
	// is then the tool and its input, Stdout its result).
	Tool string `json:"tool,omitempty"`
	// By is the node that ran it, when not the sandbox node itself.
	By string `json:"by,omitempty"`
	// Snapshot is the id of the snapshot a snapshot event took.
	Snapshot string `json:"snapshot,omitempty"`
}

// Record appends entry to the node's history: how an llm node given this
// box's tools shows what the model did there. It fails while the node is
// not open (its pattern not loaded).
func (s *Sandbox) Record(ctx context.Context, entry HistoryEntry) error {
	s.mu.Lock()
	open := s.h != nil
	s.mu.Unlock()
	if !open {
		return fmt.Errorf("sandbox node %s is not open: its history cannot be written", s.spec.Node.Name)
	}
	if len(entry.Command) > HistoryOutputLimit {
		// A tool's input (write_file's content) can be megabytes: keep
		// its start, which names the call.
		entry.Command = strings.ToValidUTF8(entry.Command[:HistoryOutputLimit], "") + "…"
		entry.Truncated = true
	}
	return s.appendHistory(ctx, entry, nil)
}

// appendHistory caps entry's output and appends it to the history (with
// also applied to the output in the same write), past ctx's cancellation:
// what ran must be recorded.
func (s *Sandbox) appendHistory(ctx context.Context, entry HistoryEntry, also func(o *sandboxOutput)) error {
	entry.Stdout, entry.Truncated = capText(entry.Stdout, entry.Truncated)
	entry.Stderr, entry.Truncated = capText(entry.Stderr, entry.Truncated)
	raw, err := json.Marshal(entry)
	if err != nil {
		return err
	}
	return s.modify(context.WithoutCancel(ctx), func(o *sandboxOutput) {
		o.History = compact(append(o.History, raw))
		if also != nil {
			also(o)
		}
	})
}

// runEvent is the payload of the run stream.
type runEvent struct {
	Command   string         `json:"command"`
	Files     map[string]any `json:"files,omitempty"`
	TimeoutMs int            `json:"timeout_ms,omitempty"`
}

func decodeRun(payload json.RawMessage) (runEvent, error) {
	var ev runEvent
	shown := string(payload)
	if len(shown) > 100 { // an event may be megabytes (files)
		shown = textcut.Prefix(shown, 100) + "…"
	}
	if t := bytes.TrimSpace(payload); len(t) > 0 && t[0] != '{' {
		// A bare command ("ls"): json would name the Go type it wanted.
		hint := `{"command": "ls -la"}`
		var cmd string
		if json.Unmarshal(t, &cmd) == nil && cmd != "" {
			hint = fmt.Sprintf(`{"command": %q}`, cmd)
		}
		return ev, fmt.Errorf("run event %s is not a JSON object: want %s (with files and timeout_ms if needed)", shown, hint)
	}
	d := json.NewDecoder(bytes.NewReader(payload))
	d.DisallowUnknownFields()
	d.UseNumber()
	if err := d.Decode(&ev); err != nil {
		return ev, fmt.Errorf(`run event %s: %w (want {"command": "...", "files": {"/workspace/x": "..."}, "timeout_ms": 1000})`, shown, err)
	}
	if strings.TrimSpace(ev.Command) == "" {
		return ev, fmt.Errorf(`run event %s: no command (want {"command": "ls -la"})`, shown)
	}
	if ev.TimeoutMs < 0 {
		return ev, fmt.Errorf("run event: negative timeout_ms %d", ev.TimeoutMs)
	}
	for p := range ev.Files {
		if err := CheckBoxPath(p); err != nil {
			return ev, fmt.Errorf("run event: file %w", err)
		}
	}
	return ev, nil
}

// Accept marks the node pending in the transaction that takes an event,
// refusing a malformed one (CheckEvent).
func (s *Sandbox) Accept(stream string, ev cells.Event, cur json.RawMessage) (any, error) {
	if err := s.CheckEvent(stream, ev.Payload); err != nil {
		return nil, err
	}
	return s.edit(cur, func(o *sandboxOutput) { o.Pending = true }), nil
}

// CheckEvent refuses a malformed event when it is sent, so the sender
// hears of it (runtime.EventChecker).
func (s *Sandbox) CheckEvent(stream string, payload json.RawMessage) error {
	switch stream {
	case "run":
		_, err := decodeRun(payload)
		return err
	case "snapshot":
		_, err := decodeSnapshot(payload)
		return err
	case "destroy":
		return nil
	}
	return fmt.Errorf("sandbox node has no stream %q (streams: run, snapshot, destroy)", stream)
}

// Event handles a run or destroy event.
func (s *Sandbox) Event(ctx context.Context, stream string, ev cells.Event) error {
	switch stream {
	case "run":
		return s.run(ctx, ev)
	case "snapshot":
		return s.snapshot(ctx, ev)
	case "destroy":
		s.mu.Lock()
		defer s.mu.Unlock()
		err := errors.Join(s.down(ctx), s.destroyMade(ctx))
		if serr := s.h.SaveState(sandboxState{Destroyed: true}); serr != nil {
			err = errors.Join(err, fmt.Errorf("save sandbox state: %w", serr))
		}
		s.modify(ctx, func(o *sandboxOutput) {
			o.Status, o.Pending, o.Error, o.Previews = StatusDestroyed, false, "", nil
			if err != nil {
				o.Error = err.Error()
			}
		})
		return err
	}
	return fmt.Errorf("sandbox node has no stream %q (streams: run, snapshot, destroy)", stream)
}

// snapshotEvent is the payload of the snapshot stream.
type snapshotEvent struct {
	Label string `json:"label,omitempty"`
}

func decodeSnapshot(payload json.RawMessage) (snapshotEvent, error) {
	var ev snapshotEvent
	if len(bytes.TrimSpace(payload)) == 0 || string(bytes.TrimSpace(payload)) == "null" {
		return ev, nil
	}
	d := json.NewDecoder(bytes.NewReader(payload))
	d.DisallowUnknownFields()
	if err := d.Decode(&ev); err != nil {
		return ev, fmt.Errorf(`snapshot event %s: %w (want {"label": "tests pass"} or {})`, payload, err)
	}
	return ev, nil
}

// snapshot takes a snapshot of the box's workspace and records it in the
// history. The box must live (a snapshot of a destroyed box is an error
// entry, not a new box).
func (s *Sandbox) snapshot(ctx context.Context, ev cells.Event) error {
	p, err := decodeSnapshot(ev.Payload)
	started := time.Now()
	entry := HistoryEntry{Command: strings.TrimSpace("snapshot " + p.Label), Tool: "snapshot", Started: started.UTC(), ExitCode: -1}
	s.mu.Lock()
	alive := s.alive
	s.mu.Unlock()
	if err == nil && !alive {
		err = errors.New("the box is destroyed; send a run event to make a new one first")
	}
	if err == nil {
		var raw json.RawMessage
		raw, err = s.env.Client.Tool(ctx, "snapshot", api.SnapshotInput{Sandbox: s.box, Label: p.Label})
		var info api.SnapshotInfo
		if err == nil {
			err = json.Unmarshal(raw, &info)
		}
		if err == nil {
			entry.Snapshot, entry.ExitCode = info.ID, 0
			entry.Stdout = fmt.Sprintf("snapshot %s: %d files, %d bytes (%d new in the store)", info.ID, info.Files, info.Size, info.AddedBytes)
		}
	}
	entry.DurationMs = time.Since(started).Milliseconds()
	if err != nil {
		err = fmt.Errorf("snapshot of box %q: %w", s.box, err)
		entry.Error = err.Error()
	}
	werr := s.appendHistory(ctx, entry, func(o *sandboxOutput) { o.Pending = false })
	if werr != nil {
		err = errors.Join(err, fmt.Errorf("record the snapshot in the history: %w", werr))
	}
	return err
}

// restore fills a newly made box with the spec's snapshot. Callers hold
// s.mu.
func (s *Sandbox) restore(ctx context.Context) error {
	id, err := evalText(s.spec.Snapshot, s.in, "snapshot")
	if err != nil || id == "" {
		return err
	}
	if _, err := s.env.Client.Tool(ctx, "restore", api.RestoreInput{Sandbox: s.box, Snapshot: id}); err != nil {
		return fmt.Errorf("start from snapshot %s: %w", id, err)
	}
	return nil
}

func (s *Sandbox) run(ctx context.Context, ev cells.Event) error {
	p, err := decodeRun(ev.Payload)
	started := time.Now()
	var env map[string]string
	if err == nil {
		env, err = s.prepare(ctx, p)
	}
	entry := HistoryEntry{Command: p.Command, Started: started.UTC(), ExitCode: -1}
	if err == nil {
		timeout := DefaultRunTimeout
		if p.TimeoutMs > 0 {
			timeout = time.Duration(p.TimeoutMs) * time.Millisecond
		}
		var r api.ExecResult
		r, err = s.env.Client.Exec(ctx, s.box, api.ExecRequest{
			Command: p.Command, Env: env,
			TimeoutMs: int(timeout / time.Millisecond), MaxOutput: HistoryOutputLimit,
		}, nil)
		if err == nil {
			entry.Stdout, entry.Stderr, entry.ExitCode = r.Stdout, r.Stderr, r.ExitCode
			entry.TimedOut, entry.Truncated, entry.Notices = r.TimedOut, r.Truncated, runNotices(r.Notices)
		}
	}
	entry.DurationMs = time.Since(started).Milliseconds()
	if err != nil {
		err = fmt.Errorf("run %q in box %q: %w", p.Command, s.box, err)
		entry.Error = err.Error()
	}
	// The event is acked already: a history entry the store refuses
	// fails the event (a failed status naming the command) after the
	// retries, rather than vanishing into the log.
	werr := s.appendHistory(ctx, entry, func(o *sandboxOutput) { o.Pending = false })
	if werr != nil {
		err = errors.Join(err, fmt.Errorf("record the result of %q in the history: %w", p.Command, werr))
	}
	return err
}

// prepare makes sure the box lives (a run after destroy makes a fresh one)
// and writes the event's files; it returns the env of the command.
func (s *Sandbox) prepare(ctx context.Context, p runEvent) (map[string]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.alive {
		if err := s.up(ctx); err != nil {
			return nil, err
		}
	}
	for _, fp := range slices.Sorted(maps.Keys(p.Files)) {
		content, err := Text(p.Files[fp])
		if err != nil {
			return nil, fmt.Errorf("file %s: %w", fp, err)
		}
		if err := upload(ctx, s.env.Client, s.box, fp, content); err != nil {
			return nil, err
		}
		delete(s.written, fp) // a bound input file overwritten: rewrite it on its next change
	}
	return evalEnv(s.spec.Env, s.in)
}

// capText cuts s to HistoryOutputLimit bytes, keeping the end.
func capText(s string, truncated bool) (string, bool) {
	if len(s) <= HistoryOutputLimit {
		return s, truncated
	}
	s = s[len(s)-HistoryOutputLimit:]
	for i := 0; i < 4 && i < len(s) && s[i]&0xC0 == 0x80; i++ {
		s = s[1:] // do not start inside a UTF-8 sequence
	}
	return s, true
}

// compact keeps the last HistoryLimit entries, counting older ones in a
// leading {"dropped": N}.
func compact(h []json.RawMessage) []json.RawMessage {
	dropped := 0
	if len(h) > 0 {
		var m struct {
			Dropped *int `json:"dropped"`
		}
		if json.Unmarshal(h[0], &m) == nil && m.Dropped != nil {
			dropped, h = *m.Dropped, h[1:]
		}
	}
	if over := len(h) - HistoryLimit; over > 0 {
		dropped += over
		h = h[over:]
	}
	if dropped == 0 {
		return h
	}
	marker, _ := json.Marshal(map[string]int{"dropped": dropped})
	return append([]json.RawMessage{marker}, h...)
}

// shellHint ends the agent's notice about processes a command left
// running: advice for the shell tool, which a run event cannot follow
// (it has no background field).
const shellHint = "run servers and long jobs with background: true"

// runNotices are the agent's notices about a run event's command, with
// advice a sandbox node can follow.
func runNotices(notices []string) []string {
	for i, n := range notices {
		if strings.HasSuffix(n, shellHint) {
			notices[i] = strings.TrimSuffix(n, shellHint) + "keep a server running with the node's start: field (docs/patterns.md, Supervised server)"
		}
	}
	return notices
}
