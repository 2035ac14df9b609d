package warm_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/warm"
)

// boxes is a maker of numbered boxes that records what was made and
// discarded; with gate set, each Make says it began on entered and waits
// for a value on gate.
type boxes struct {
	mu        sync.Mutex
	made      []string
	madeAt    []time.Time
	discarded []string
	entered   chan struct{}
	gate      chan struct{}
	quit      chan struct{} // closed when the test ends: a gated Make gives up
}

// within bounds the waits of a test, so that a broken pool fails it
// rather than hang it.
const within = 10 * time.Second

// inMake waits until a Make has entered the gate.
func (b *boxes) inMake(t *testing.T) {
	t.Helper()
	select {
	case <-b.entered:
	case <-time.After(within):
		t.Fatal("no box is being made")
	}
}

// open lets one gated Make finish.
func (b *boxes) open(t *testing.T) {
	t.Helper()
	select {
	case b.gate <- struct{}{}:
	case <-time.After(within):
		t.Fatal("no box is being made to let through")
	}
}

func (b *boxes) make(ctx context.Context, image string) (string, error) {
	if b.gate != nil {
		b.entered <- struct{}{}
		select {
		case <-b.gate:
		case <-b.quit:
			return "", errors.New("the test ended")
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	id := fmt.Sprintf("%s-%d", image, len(b.made))
	b.made = append(b.made, id)
	b.madeAt = append(b.madeAt, time.Now())
	return id, nil
}

func (b *boxes) discard(_ context.Context, id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.discarded = append(b.discarded, id)
}

func (b *boxes) counts() (made, discarded int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.made), len(b.discarded)
}

func newPools(t *testing.T, b *boxes, edit func(*warm.Config[string])) *warm.Pools[string] {
	cfg := warm.Config[string]{Sizes: map[string]int{"img": 2, "none": 0}, Make: b.make, Discard: b.discard}
	if edit != nil {
		edit(&cfg)
	}
	p := warm.New(cfg)
	b.quit = make(chan struct{})
	t.Cleanup(func() {
		close(b.quit)
		p.Close(context.Background())
	})
	return p
}

func ready(p *warm.Pools[string]) func() bool {
	return func() bool { return p.Ready()["img"] == 2 }
}

// TestFillAndTake: a pool fills to its size, a take hands over a box it
// made (never one twice) and the pool refills; an image without a pool
// takes nothing.
func TestFillAndTake(t *testing.T) {
	b := &boxes{}
	p := newPools(t, b, nil)
	p.Fill()
	require.Eventually(t, ready(p), 10*time.Second, time.Millisecond)
	seen := map[string]bool{}
	for range 5 {
		id, ok := p.Take(context.Background(), "img", true)
		require.True(t, ok)
		assert.False(t, seen[id], "box %s handed over twice", id)
		seen[id] = true
		require.Eventually(t, ready(p), 10*time.Second, time.Millisecond)
	}
	made, _ := b.counts()
	assert.Equal(t, 7, made, "two at first, one per take")
	_, ok := p.Take(context.Background(), "none", true)
	assert.False(t, ok)
	_, ok = p.Take(context.Background(), "other", true)
	assert.False(t, ok)
	assert.Equal(t, map[string]int{"img": 2}, p.Ready(), "no pool for a size of 0")
}

// TestFollowsUse: a use-following pool makes nothing before a use, grows
// by one per counted take up to its size, ignores takes that do not count,
// and shrinks by one box per idle period.
func TestFollowsUse(t *testing.T) {
	b := &boxes{}
	p := newPools(t, b, func(c *warm.Config[string]) { c.FollowsUse = true; c.Idle = time.Hour })
	p.Fill()
	_, ok := p.Take(context.Background(), "img", false)
	assert.False(t, ok)
	p.Fill()
	p.Shrink(context.Background())
	made, _ := b.counts()
	assert.Equal(t, 0, made, "no use, no box")

	_, ok = p.Take(context.Background(), "img", true) // a miss: size 1
	assert.False(t, ok)
	require.Eventually(t, func() bool { return p.Ready()["img"] == 1 }, 10*time.Second, time.Millisecond)
	_, ok = p.Take(context.Background(), "img", true) // a hit: size 2
	assert.True(t, ok)
	require.Eventually(t, ready(p), 10*time.Second, time.Millisecond)
	_, ok = p.Take(context.Background(), "img", true) // a hit: size stays 2
	assert.True(t, ok)
	require.Eventually(t, ready(p), 10*time.Second, time.Millisecond)
	made, _ = b.counts()
	assert.Equal(t, 4, made)

	p.Shrink(context.Background())
	_, discarded := b.counts()
	assert.Equal(t, 0, discarded, "not idle for Idle yet")

	q := newPools(t, &boxes{}, func(c *warm.Config[string]) { c.FollowsUse = true; c.Idle = time.Nanosecond })
	q.Take(context.Background(), "img", true)
	require.Eventually(t, func() bool { return q.Ready()["img"] == 1 }, 10*time.Second, time.Millisecond)
	q.Shrink(context.Background())
	assert.Equal(t, 0, q.Ready()["img"], "an idle pool gives its box back")
	q.Fill()
	assert.Equal(t, 0, q.Ready()["img"], "and stays at its new size")
}

// TestMayFill: a server that does not hold the pool's lease makes no box.
func TestMayFill(t *testing.T) {
	b := &boxes{}
	var mu sync.Mutex
	may := false
	p := newPools(t, b, func(c *warm.Config[string]) {
		c.MayFill = func() bool { mu.Lock(); defer mu.Unlock(); return may }
	})
	p.Fill()
	p.Take(context.Background(), "img", true)
	made, _ := b.counts()
	assert.Equal(t, 0, made)
	mu.Lock()
	may = true
	mu.Unlock()
	p.Fill()
	require.Eventually(t, ready(p), 10*time.Second, time.Millisecond)
}

// TestQuiet: a refill waits until no box was taken for Quiet.
func TestQuiet(t *testing.T) {
	b := &boxes{}
	quiet := 200 * time.Millisecond
	p := newPools(t, b, func(c *warm.Config[string]) { c.Quiet = quiet })
	p.Fill()
	require.Eventually(t, ready(p), 10*time.Second, time.Millisecond)
	taken := time.Now()
	p.Take(context.Background(), "img", true)
	require.Eventually(t, ready(p), 10*time.Second, time.Millisecond)
	b.mu.Lock()
	defer b.mu.Unlock()
	assert.GreaterOrEqual(t, b.madeAt[2].Sub(taken), quiet, "the refill began before the pool was quiet")
}

// TestClose: Close waits for a fill making a box and discards it with the
// ready ones; nothing is left and nothing fills after it.
func TestClose(t *testing.T) {
	b := &boxes{entered: make(chan struct{}), gate: make(chan struct{})}
	p := newPools(t, b, func(c *warm.Config[string]) { c.Sizes = map[string]int{"img": 3} })
	p.Fill()
	for range 3 {
		b.inMake(t)
		b.open(t)
	}
	require.Eventually(t, func() bool { return p.Ready()["img"] == 3 }, 10*time.Second, time.Millisecond)
	p.Take(context.Background(), "img", true)
	b.inMake(t) // the refill is inside Make, held by the gate
	closed := make(chan struct{})
	go func() { p.Close(context.Background()); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while a fill was making a box")
	case <-time.After(50 * time.Millisecond):
	}
	b.open(t)
	<-closed
	made, discarded := b.counts()
	assert.Equal(t, 4, made)
	assert.Equal(t, 3, discarded, "the ready boxes and the one made during Close")
	assert.Equal(t, 0, p.Ready()["img"])
	p.Fill()
	_, ok := p.Take(context.Background(), "img", true)
	assert.False(t, ok)
	made, _ = b.counts()
	assert.Equal(t, 4, made, "nothing fills after Close")
}

// TestExpectFillsTheBurstAtOnce: after Expect, the burst's first take
// sizes a use-following pool for the rest of the burst and fills it at
// once, side by side, although Quiet would hold a refill for an hour;
// nothing is made before that take.
func TestExpectFillsTheBurstAtOnce(t *testing.T) {
	b := &boxes{entered: make(chan struct{}, 4), gate: make(chan struct{})}
	p := newPools(t, b, func(c *warm.Config[string]) {
		c.Sizes = map[string]int{"img": 3}
		c.FollowsUse, c.Idle, c.Quiet = true, time.Hour, time.Hour
	})
	p.Expect("img", 3)
	p.Fill()
	select {
	case <-b.entered:
		t.Fatal("a box was made before the burst's first take")
	case <-time.After(20 * time.Millisecond):
	}
	_, ok := p.Take(context.Background(), "img", true)
	assert.False(t, ok, "nothing was made yet: the first stage makes its own")
	b.inMake(t)
	b.inMake(t) // both fills are making their box at once, not one after the other
	b.open(t)
	b.open(t)
	require.Eventually(t, func() bool { return p.Ready()["img"] == 2 }, 10*time.Second, time.Millisecond)
	for range 2 {
		_, ok := p.Take(context.Background(), "img", true)
		assert.True(t, ok)
	}
	made, _ := b.counts()
	assert.Equal(t, 2, made, "the refill after the burst waits for Quiet again")
}

// TestTakeWaitsForABoxBeingMade: a take that finds the pool empty while a
// box is being made waits for that box (a later stage, whose box began
// while the earlier one ran); one whose context ends stops waiting.
func TestTakeWaitsForABoxBeingMade(t *testing.T) {
	b := &boxes{entered: make(chan struct{}, 4), gate: make(chan struct{})}
	p := newPools(t, b, func(c *warm.Config[string]) {
		c.Sizes = map[string]int{"img": 2}
		c.FollowsUse, c.Idle, c.Quiet = true, time.Hour, time.Hour
	})
	p.Expect("img", 2)
	_, ok := p.Take(context.Background(), "img", true)
	require.False(t, ok)
	b.inMake(t) // the burst's one fill is inside Make

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	_, ok = p.Take(ctx, "img", false)
	assert.False(t, ok, "a take whose context ended waits no more")

	takeWaitsForTheBoxBeingMade(t, p, b)
	made, _ := b.counts()
	assert.Equal(t, 1, made, "no second box for the waiting take")
}

// takeWaitsForTheBoxBeingMade checks that a counted take of "img", with
// the pool's boxes all being made (gated), waits until one is let
// through, then gets that one.
func takeWaitsForTheBoxBeingMade(t *testing.T, p *warm.Pools[string], b *boxes) {
	t.Helper()
	got := make(chan bool, 1)
	go func() {
		_, ok := p.Take(context.Background(), "img", true)
		got <- ok
	}()
	select {
	case <-got:
		t.Fatal("the take did not wait for the box being made")
	case <-time.After(30 * time.Millisecond):
	}
	b.open(t)
	select {
	case ok := <-got:
		assert.True(t, ok, "the take got the box it waited for")
	case <-time.After(within):
		t.Fatal("the waiting take never got its box")
	}
}

// TestBurstsOnly: a pool sized by bursts alone makes the boxes of the
// burst (each later take finds one) and none after it — `cellbox run
// --once` exits when its stages are done, and a refill would be made
// only to be thrown away on the way out.
func TestBurstsOnly(t *testing.T) {
	b := &boxes{}
	p := newPools(t, b, func(c *warm.Config[string]) {
		c.Sizes = map[string]int{"img": 2}
		c.FollowsUse, c.BurstsOnly, c.Idle, c.Quiet = true, true, time.Hour, 0
	})
	p.Expect("img", 4)
	_, ok := p.Take(context.Background(), "img", true)
	require.False(t, ok, "the burst's first take makes its own box")
	for range 3 {
		_, ok := p.Take(context.Background(), "img", true)
		assert.True(t, ok, "a later take of the burst finds its box made, or being made")
	}
	time.Sleep(50 * time.Millisecond) // time for a refill that should not be
	_, ok = p.Take(context.Background(), "img", true)
	assert.False(t, ok, "after the burst the pool keeps nothing")
	time.Sleep(50 * time.Millisecond)
	made, _ := b.counts()
	assert.Equal(t, 3, made, "the burst's later takes, and not one box more")
	assert.Equal(t, 0, p.Ready()["img"])
}

// TestBeginMakesTheBurstBeforeItsFirstTake: Begin starts the expected
// burst at once, its boxes side by side up to the pool's size and the
// first take's own on top (without Begin that take makes its box
// itself); the first take waits for one of them rather than make its
// own, and the rest of the burst is made as boxes are taken. Without
// Expect, Begin makes nothing.
func TestBeginMakesTheBurstBeforeItsFirstTake(t *testing.T) {
	b := &boxes{entered: make(chan struct{}, 8), gate: make(chan struct{})}
	p := newPools(t, b, func(c *warm.Config[string]) {
		c.Sizes = map[string]int{"img": 2, "other": 2}
		c.FollowsUse, c.BurstsOnly, c.Idle, c.Quiet = true, true, time.Hour, time.Hour
	})
	p.Begin("other") // no burst expected there
	p.Expect("img", 4)
	p.Begin("img")
	for range 3 { // three at once, before any take
		b.inMake(t)
	}
	select {
	case <-b.entered:
		t.Fatal("more boxes begun than the pool's size and the first take's")
	case <-time.After(30 * time.Millisecond):
	}

	takeWaitsForTheBoxBeingMade(t, p, b)
	b.open(t)
	b.open(t)
	_, ok := p.Take(context.Background(), "img", true)
	assert.True(t, ok, "the second take finds its box")
	b.inMake(t) // the burst's fourth box, begun once the pool had room for it
	b.open(t)
	for range 2 {
		_, ok := p.Take(context.Background(), "img", true)
		assert.True(t, ok, "a later take of the burst finds its box")
	}
	made, _ := b.counts()
	assert.Equal(t, 4, made, "the burst's boxes and none for the pool without a burst")
	assert.Equal(t, 0, p.Ready()["img"]+p.Ready()["other"])
}

// TestAStoppingMakerIsNotAWarning: a fill whose Make fails is a warning in
// the log, unless Make says its maker is shutting down (ErrStopping: a
// server stopping while its pool fills).
func TestAStoppingMakerIsNotAWarning(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		warn bool
	}{
		{"failure", errors.New("no space left on device"), true},
		{"stopping", fmt.Errorf("%w: box cb-1 was not started", warm.ErrStopping), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var logged warnings
			tried := make(chan struct{}, 8)
			p := newPools(t, &boxes{}, func(cfg *warm.Config[string]) {
				cfg.Sizes = map[string]int{"img": 1}
				cfg.Make = func(context.Context, string) (string, error) {
					tried <- struct{}{}
					return "", c.err
				}
				cfg.Log = slog.New(&logged)
			})
			p.Fill()
			select {
			case <-tried:
			case <-time.After(within):
				t.Fatal("the pool made no box")
			}
			require.Eventually(t, func() bool { return logged.count() > 0 }, within, time.Millisecond)
			assert.Equal(t, c.warn, logged.warned(), "a warning in the log")
		})
	}
}

// warnings is a slog.Handler that keeps the levels of what it is given.
type warnings struct {
	mu     sync.Mutex
	levels []slog.Level
}

func (w *warnings) Enabled(context.Context, slog.Level) bool { return true }

func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.levels = append(w.levels, r.Level)
	return nil
}

func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

func (w *warnings) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.levels)
}

func (w *warnings) warned() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.ContainsFunc(w.levels, func(l slog.Level) bool { return l >= slog.LevelWarn })
}
