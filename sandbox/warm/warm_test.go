package warm_test

import (
	"context"
	"fmt"
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
}

func (b *boxes) make(ctx context.Context, image string) (string, error) {
	if b.gate != nil {
		b.entered <- struct{}{}
		<-b.gate
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
	t.Cleanup(func() { p.Close(context.Background()) })
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
		id, ok := p.Take("img", true)
		require.True(t, ok)
		assert.False(t, seen[id], "box %s handed over twice", id)
		seen[id] = true
		require.Eventually(t, ready(p), 10*time.Second, time.Millisecond)
	}
	made, _ := b.counts()
	assert.Equal(t, 7, made, "two at first, one per take")
	_, ok := p.Take("none", true)
	assert.False(t, ok)
	_, ok = p.Take("other", true)
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
	_, ok := p.Take("img", false)
	assert.False(t, ok)
	p.Fill()
	p.Shrink(context.Background())
	made, _ := b.counts()
	assert.Equal(t, 0, made, "no use, no box")

	_, ok = p.Take("img", true) // a miss: size 1
	assert.False(t, ok)
	require.Eventually(t, func() bool { return p.Ready()["img"] == 1 }, 10*time.Second, time.Millisecond)
	_, ok = p.Take("img", true) // a hit: size 2
	assert.True(t, ok)
	require.Eventually(t, ready(p), 10*time.Second, time.Millisecond)
	_, ok = p.Take("img", true) // a hit: size stays 2
	assert.True(t, ok)
	require.Eventually(t, ready(p), 10*time.Second, time.Millisecond)
	made, _ = b.counts()
	assert.Equal(t, 4, made)

	p.Shrink(context.Background())
	_, discarded := b.counts()
	assert.Equal(t, 0, discarded, "not idle for Idle yet")

	q := newPools(t, &boxes{}, func(c *warm.Config[string]) { c.FollowsUse = true; c.Idle = time.Nanosecond })
	q.Take("img", true)
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
	p.Take("img", true)
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
	p.Take("img", true)
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
		<-b.entered
		b.gate <- struct{}{}
	}
	require.Eventually(t, func() bool { return p.Ready()["img"] == 3 }, 10*time.Second, time.Millisecond)
	p.Take("img", true)
	<-b.entered // the refill is inside Make, held by the gate
	closed := make(chan struct{})
	go func() { p.Close(context.Background()); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while a fill was making a box")
	case <-time.After(50 * time.Millisecond):
	}
	b.gate <- struct{}{}
	<-closed
	made, discarded := b.counts()
	assert.Equal(t, 4, made)
	assert.Equal(t, 3, discarded, "the ready boxes and the one made during Close")
	assert.Equal(t, 0, p.Ready()["img"])
	p.Fill()
	_, ok := p.Take("img", true)
	assert.False(t, ok)
	made, _ = b.counts()
	assert.Equal(t, 4, made, "nothing fills after Close")
}
