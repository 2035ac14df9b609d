package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/runtime"
)

// box is a service test kind. Its output is {"inputs": ..., "accepted":
// [ids], "done": [ids]}: Accept records an event in the acking transaction,
// Event (the side effect) records it when it finishes.
type box struct {
	mu      sync.Mutex
	h       runtime.Handle
	opened  chan runtime.Inputs
	updates chan runtime.Inputs
	closed  chan runtime.CloseReason
	block   chan struct{} // Event waits for it (or cancellation)
	events  atomic.Int32
}

func newBox() *box {
	return &box{opened: make(chan runtime.Inputs, 4), updates: make(chan runtime.Inputs, 64), closed: make(chan runtime.CloseReason, 4)}
}

type boxOut struct {
	Inputs   runtime.Inputs `json:"inputs"`
	Accepted []uint64       `json:"accepted"`
	Done     []uint64       `json:"done"`
}

func modify(cur json.RawMessage, fn func(o *boxOut)) (any, error) {
	var o boxOut
	_ = json.Unmarshal(cur, &o)
	fn(&o)
	return o, nil
}

func (b *box) Open(ctx context.Context, h runtime.Handle, in runtime.Inputs) error {
	b.mu.Lock()
	b.h = h
	b.mu.Unlock()
	b.opened <- in
	return h.Modify(ctx, func(cur json.RawMessage) (any, error) {
		return modify(cur, func(o *boxOut) { o.Inputs = in })
	})
}

func (b *box) Update(ctx context.Context, in runtime.Inputs) error {
	b.updates <- in
	return b.h.Modify(ctx, func(cur json.RawMessage) (any, error) {
		return modify(cur, func(o *boxOut) { o.Inputs = in })
	})
}

func (b *box) Accept(stream string, ev cells.Event, cur json.RawMessage) (any, error) {
	var p struct{ Bad bool }
	_ = json.Unmarshal(ev.Payload, &p)
	if p.Bad {
		return nil, fmt.Errorf("bad command")
	}
	return modify(cur, func(o *boxOut) { o.Accepted = append(o.Accepted, ev.ID) })
}

func (b *box) Event(ctx context.Context, stream string, ev cells.Event) error {
	b.events.Add(1)
	if b.block != nil {
		select {
		case <-b.block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return b.h.Modify(ctx, func(cur json.RawMessage) (any, error) {
		return modify(cur, func(o *boxOut) { o.Done = append(o.Done, ev.ID) })
	})
}

func (b *box) Close(ctx context.Context, reason runtime.CloseReason) error {
	b.closed <- reason
	return nil
}

func boxPattern(b *box) runtime.Pattern {
	return runtime.Pattern{
		Space: space, Name: pat,
		Cells: []runtime.Cell{{Name: "cfg", Initial: json.RawMessage(`1`)}},
		Nodes: []runtime.Node{
			{Name: "box", Inputs: []string{"cfg"}, Kind: b, Streams: []string{"run"}, Builtin: "box"},
			{Name: "seen", Inputs: []string{"box"}, Kind: mustComputed("len(box.done ?? [])")},
		},
	}
}

func out(t *testing.T, s cells.Store) boxOut {
	t.Helper()
	var o boxOut
	require.NoError(t, json.Unmarshal(get(t, s, "box").Value, &o))
	return o
}

func send(t *testing.T, rt *runtime.Runtime, stream, payload string) cells.Event {
	t.Helper()
	ev, err := rt.Send(context.Background(), at(stream), json.RawMessage(payload))
	require.NoError(t, err)
	return ev
}

func TestService(t *testing.T) {
	stores(t, func(t *testing.T, s cells.Store) {
		b := newBox()
		rt := start(t, s, boxPattern(b), runtime.Options{})
		st := watchStatus(t, rt)
		assert.Equal(t, runtime.Inputs{"cfg": 1}, <-b.opened)
		assert.Equal(t, map[string]any{"cfg": 1.0}, map[string]any(out(t, s).Inputs))

		// Input changes reach the service, coalesced to the latest.
		for _, v := range []string{`2`, `3`, `4`} {
			set(t, rt, "cfg", v)
		}
		settle(t, rt)
		var last runtime.Inputs
		for len(b.updates) > 0 {
			last = <-b.updates
		}
		assert.Equal(t, runtime.Inputs{"cfg": 4}, last)
		assert.Equal(t, 4.0, out(t, s).Inputs["cfg"])

		// Events: accepted with the ack, then handled; downstream follows.
		e1 := send(t, rt, "box.run", `{"command":"ls"}`)
		e2 := send(t, rt, "box.run", `{"command":"pwd"}`)
		bad := send(t, rt, "box.run", `{"bad":true}`)
		settle(t, rt)
		o := out(t, s)
		assert.Equal(t, []uint64{e1.ID, e2.ID}, o.Accepted)
		assert.Equal(t, []uint64{e1.ID, e2.ID}, o.Done)
		assert.Equal(t, "2", string(get(t, s, "seen").Value))
		assert.EqualValues(t, 2, b.events.Load(), "a refused event is not handled")
		assert.Eventually(t, func() bool { return st.count("box", runtime.Failed) == 1 }, 5*time.Second, 10*time.Millisecond)
		require.NoError(t, s.View(context.Background(), func(tx cells.Tx) error {
			evs, err := tx.Events(at("box.run"))
			assert.Empty(t, evs, "the refused event %d is acked too", bad.ID)
			return err
		}))

		_, err := rt.Send(context.Background(), at("box.nope"), json.RawMessage(`1`))
		assert.ErrorContains(t, err, "no such stream")

		// Stop closes the service for good.
		require.NoError(t, rt.Stop(context.Background(), space, pat))
		assert.Equal(t, runtime.Stopped, <-b.closed)
		assert.ErrorContains(t, b.h.Set(context.Background(), 1), "the service is closed")
		assert.Empty(t, rt.Nodes())
	})
}

// TestEventAtMostOnce crashes the runtime while a service handles an event:
// the event was acked (with the service's Accept writes) before handling, so
// the restarted runtime does not deliver it again.
func TestEventAtMostOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cells.db")
	s, err := cells.OpenBolt(path, cells.Options{})
	require.NoError(t, err)
	b := newBox()
	b.block = make(chan struct{})
	rt := runtime.New(s, runtime.Options{})
	require.NoError(t, rt.Load(context.Background(), boxPattern(b)))
	<-b.opened
	ev := send(t, rt, "box.run", `{"command":"sleep 1000"}`)
	require.Eventually(t, func() bool { return b.events.Load() == 1 }, 5*time.Second, 5*time.Millisecond)
	// Crash mid-handling: the handler's own write never commits.
	require.NoError(t, rt.Close(context.Background()))
	assert.Equal(t, runtime.Shutdown, <-b.closed)
	require.NoError(t, s.Close())

	s, err = cells.OpenBolt(path, cells.Options{})
	require.NoError(t, err)
	defer s.Close()
	o := out(t, s)
	assert.Equal(t, []uint64{ev.ID}, o.Accepted, "the receipt and the Accept writes committed together")
	assert.Empty(t, o.Done)

	b2 := newBox()
	rt = start(t, s, boxPattern(b2), runtime.Options{})
	<-b2.opened
	assert.EqualValues(t, 0, b2.events.Load(), "the event is not delivered again")
	ev2 := send(t, rt, "box.run", `{"command":"true"}`)
	settle(t, rt)
	assert.EqualValues(t, 1, b2.events.Load())
	assert.Equal(t, []uint64{ev2.ID}, out(t, s).Done)
}

// flapper is a service that rewrites its output in a loop.
type flapper struct {
	writes atomic.Int32
	stop   chan struct{}
	done   chan struct{}
}

func (f *flapper) Open(ctx context.Context, h runtime.Handle, in runtime.Inputs) error {
	go func() {
		defer close(f.done)
		for i := 0; ; i++ {
			select {
			case <-f.stop:
				h.Set(ctx, "final")
				return
			case <-ctx.Done():
				return
			default:
			}
			if err := h.Set(ctx, i%2); err != nil {
				return
			}
			f.writes.Add(1)
			time.Sleep(time.Millisecond)
		}
	}()
	return nil
}
func (f *flapper) Update(context.Context, runtime.Inputs) error                { return nil }
func (f *flapper) Event(context.Context, string, cells.Event) error            { return nil }
func (f *flapper) Close(ctx context.Context, reason runtime.CloseReason) error { return nil }

func TestBackoff(t *testing.T) {
	s := cells.NewMemory(cells.Options{})
	defer s.Close()
	f := &flapper{stop: make(chan struct{}), done: make(chan struct{})}
	downstream := &counted{kind: mustComputed("flap")}
	p := runtime.Pattern{
		Space: space, Name: pat,
		Cells: []runtime.Cell{{Name: "other", Initial: json.RawMessage(`0`)}},
		Nodes: []runtime.Node{
			{Name: "flap", Kind: f},
			{Name: "copy", Inputs: []string{"flap"}, Kind: downstream},
			{Name: "echo", Inputs: []string{"other"}, Kind: mustComputed("other")},
		},
	}
	opts := runtime.Options{MaxChanges: 20, ChangeWindow: time.Second, MinBackoff: 300 * time.Millisecond, MaxBackoff: time.Second}
	rt := runtime.New(s, opts)
	defer rt.Close(context.Background())
	st := watchStatus(t, rt)
	require.NoError(t, rt.Load(context.Background(), p))

	require.Eventually(t, func() bool { return st.count("flap", runtime.BackedOff) >= 1 }, 5*time.Second, 5*time.Millisecond)
	c := get(t, s, "flap")
	assert.Contains(t, c.Error, "node flap changed its output 21 times within 1s: holding its writes back for 300ms")
	assert.Contains(t, get(t, s, "copy").Error, "upstream flap failed")
	// The rest of the graph stays responsive.
	set(t, rt, "other", `7`)
	assert.Equal(t, "7", string(get(t, s, "echo").Value))

	require.Eventually(t, func() bool { return st.count("flap", runtime.BackedOff) >= 2 }, 10*time.Second, 10*time.Millisecond, "it keeps backing off")
	assert.Contains(t, get(t, s, "flap").Error, "holding its writes back for 600ms", "for longer each time")
	assert.Less(t, downstream.runs(), int(f.writes.Load())/2, "held-back writes do not propagate")

	close(f.stop)
	<-f.done
	require.Eventually(t, func() bool {
		c := get(t, s, "flap")
		return c.Error == "" && string(c.Value) == `"final"`
	}, 5*time.Second, 10*time.Millisecond, "the held value lands when the backoff ends")
}

// A service's output outlives a restart even when no node reads it: what
// the reopened service modifies is the stored value (a sandbox's history).
func TestServiceOutputSurvivesRestartUnread(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cells.db")
	alone := func(b *box) runtime.Pattern {
		p := boxPattern(b)
		p.Nodes = p.Nodes[:1] // no reader of box
		return p
	}
	s, err := cells.OpenBolt(path, cells.Options{NoSync: true})
	require.NoError(t, err)
	b := newBox()
	rt := runtime.New(s, runtime.Options{})
	require.NoError(t, rt.Load(context.Background(), alone(b)))
	<-b.opened
	ev := send(t, rt, "box.run", `{}`)
	settle(t, rt)
	require.Equal(t, []uint64{ev.ID}, out(t, s).Done)
	require.NoError(t, rt.Close(context.Background()))
	require.NoError(t, s.Close())

	s, err = cells.OpenBolt(path, cells.Options{NoSync: true})
	require.NoError(t, err)
	defer s.Close()
	b = newBox()
	rt = runtime.New(s, runtime.Options{})
	defer rt.Close(context.Background())
	require.NoError(t, rt.Load(context.Background(), alone(b)))
	<-b.opened
	settle(t, rt)
	assert.Equal(t, []uint64{ev.ID}, out(t, s).Done, "the reopened service kept what it had done")
}

// checked is a box that refuses malformed events when they are sent.
type checked struct{ *box }

func (checked) CheckEvent(stream string, payload json.RawMessage) error {
	var p struct{ Bad bool }
	if json.Unmarshal(payload, &p) != nil || p.Bad {
		return fmt.Errorf("want {\"bad\": false}")
	}
	return nil
}

func TestSendRefusesMalformedEvents(t *testing.T) {
	stores(t, func(t *testing.T, s cells.Store) {
		b := newBox()
		p := boxPattern(b)
		p.Nodes[0].Kind = checked{b}
		rt := start(t, s, p, runtime.Options{})
		<-b.opened
		_, err := rt.Send(context.Background(), at("box.run"), json.RawMessage(`{"bad": true}`))
		require.ErrorIs(t, err, runtime.ErrEventRefused)
		assert.Contains(t, err.Error(), `want {"bad": false}`)
		ev := send(t, rt, "box.run", `{}`)
		settle(t, rt)
		assert.Equal(t, []uint64{ev.ID}, out(t, s).Done, "only the good event was queued and handled")
	})
}

// late is a service whose Open waits for release before it writes its
// output, the way a sandbox node's box takes a while to be asked for.
type late struct{ release chan struct{} }

func (l *late) Open(ctx context.Context, h runtime.Handle, in runtime.Inputs) error {
	select {
	case <-l.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return h.Modify(ctx, func(json.RawMessage) (any, error) {
		return map[string]any{"files": map[string]any{"/a": "hello"}}, nil
	})
}
func (*late) Update(context.Context, runtime.Inputs) error     { return nil }
func (*late) Event(context.Context, string, cells.Event) error { return nil }
func (*late) Close(context.Context, runtime.CloseReason) error { return nil }

// Readers of a service that has no output yet wait for it: a computed
// reading workspace.files does not fail on the null output ("cannot fetch
// files from <nil>"), and an async node does not run, until the service
// writes its output.
func TestWaitsForServiceOutput(t *testing.T) {
	stores(t, func(t *testing.T, s cells.Store) {
		l, f := &late{release: make(chan struct{})}, &follow{}
		rt := runtime.New(s, runtime.Options{})
		defer rt.Close(context.Background())
		st := watchStatus(t, rt)
		require.NoError(t, rt.Load(context.Background(), runtime.Pattern{Space: space, Name: pat,
			Nodes: []runtime.Node{
				{Name: "workspace", Kind: l, Builtin: "sandbox"},
				{Name: "code", Inputs: []string{"workspace"}, Kind: mustComputed(`workspace.files["/a"]`)},
				{Name: "job", Inputs: []string{"code"}, Kind: mustComputed(`{pending: false, result: {out: code}}`)},
				{Name: "next", Inputs: []string{"job"}, Kind: f, Builtin: "follow"},
			}}))
		for _, n := range []string{"code", "job", "next"} {
			if c, err := s.Get(context.Background(), at(n)); err == nil {
				assert.Empty(t, c.Error, "%s waits for the service's output", n)
			}
		}
		assert.Zero(t, f.runs.Load(), "no async run on a service with no output yet")
		close(l.release)
		settle(t, rt)
		assert.Equal(t, `"hello"`, string(get(t, s, "code").Value))
		assert.JSONEq(t, `{"pending":false,"result":"ok","error":null}`, string(get(t, s, "next").Value))
		for _, n := range []string{"code", "job", "next"} {
			assert.Zero(t, st.count(n, runtime.Failed), "%s never failed on the way", n)
		}
	})
}

// TestUnloadThenLoadEdited: Unload closes a pattern's services as a
// shutdown does (they keep what they hold) and leaves its cells; a Load of
// an edited version then opens the service again on the new inputs, with
// the stored values of the cells it still declares. What `cellbox run`
// does when its pattern file is edited.
func TestUnloadThenLoadEdited(t *testing.T) {
	stores(t, func(t *testing.T, s cells.Store) {
		b := newBox()
		rt := start(t, s, boxPattern(b), runtime.Options{})
		assert.Equal(t, runtime.Inputs{"cfg": 1}, <-b.opened)
		set(t, rt, "cfg", `5`)
		settle(t, rt)

		require.NoError(t, rt.Unload(context.Background(), space, pat))
		assert.Equal(t, runtime.Shutdown, <-b.closed, "unloaded, not stopped: the service keeps what it holds")
		assert.Empty(t, rt.Nodes())

		edited := boxPattern(b)
		edited.Cells = append(edited.Cells, runtime.Cell{Name: "extra", Initial: json.RawMessage(`7`)})
		edited.Nodes[0].Inputs = []string{"cfg", "extra"}
		require.NoError(t, rt.Load(context.Background(), edited))
		assert.Equal(t, runtime.Inputs{"cfg": 5, "extra": 7}, <-b.opened, "the stored cfg, the new cell's initial value")
		settle(t, rt)
		assert.Equal(t, 7.0, out(t, s).Inputs["extra"])

		assert.ErrorContains(t, rt.Unload(context.Background(), space, "nope"), "not loaded")
	})
}
