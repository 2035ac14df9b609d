// Package warm keeps warm pools: boxes of an image made and started ahead,
// so that a box with default settings is taken ready instead of waited
// for. Filled in the background, drained at Close.
//
// A pooled box is one that was made and started and never used: taking it
// hands over a box exactly as fresh as a new one (no files, processes or
// environment of another run), it only skips the wait. The pools know a
// box only as the B their Config.Make returns; making, starting and
// removing one is the caller's (the sandbox service's).
//
// With Config.FollowsUse (cellbox run) a pool starts empty and its size
// follows use: each take that counts, hit or miss, grows it by one up to
// its size, and each Config.Idle without one shrinks it by one (Shrink
// removes a ready box). Fills wait until no box was taken for
// Config.Quiet, and run one at a time over all pools, so that refilling
// does not compete for the CPU with the work that takes the boxes.
//
// Expect says a burst of takes is coming (a run whose stages will each
// take a box): the next counted take sizes the pool for the rest of the
// burst and fills it at once, in parallel, without the quiet wait. A take
// that finds the pool empty while a box is being made for it waits for
// that box rather than make its own. Begin starts an expected burst
// before its first take, that take's box included. With
// Config.BurstsOnly, bursts are all that size a pool.
package warm

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/cellbox/cellbox/internal/safe"
)

// ErrStopping, wrapped in an error of Config.Make, says that the maker is
// shutting down: the fill is dropped without a warning.
var ErrStopping = errors.New("the box maker is shutting down")

// Config says which pools to keep and how their boxes are made.
type Config[B any] struct {
	// Sizes is the number of boxes kept per image; an image absent or
	// with 0 has no pool.
	Sizes map[string]int
	// FollowsUse starts each pool empty and lets its size follow use (see
	// the package comment).
	// BurstsOnly (with FollowsUse) sizes a pool by Expect's bursts alone:
	// it does not grow with use, and shrinks to the rest of the burst as
	// its boxes are taken, so that a process that exits when its run is
	// done (`cellbox run --once`) makes no box it will not use.
	FollowsUse, BurstsOnly bool
	// Idle is how long a use-following pool stays unused before Shrink
	// takes a box from it.
	Idle time.Duration
	// Quiet is how long after the last take a pool waits to refill.
	Quiet time.Duration
	// Make makes and starts a box of image. A fill is not cancelled by
	// Close, which waits for it (a box half made when the pools stop
	// would be left behind): Make bounds its own time.
	Make func(ctx context.Context, image string) (B, error)
	// Discard closes and removes a box that was made and is no longer
	// wanted (Shrink, Close, a fill that ended after Close).
	Discard func(ctx context.Context, b B)
	// MayFill reports whether this server may fill the pools now (it
	// holds their lease); nil means always.
	MayFill func() bool
	// Log receives fill failures; nil is slog.Default().
	Log *slog.Logger
}

// Pools are the warm pools of a service, one per image of Config.Sizes.
type Pools[B any] struct {
	cfg    Config[B]
	log    *slog.Logger
	done   chan struct{} // closed by Close: fills still waiting give up
	filler chan struct{} // the one fill in flight
	wg     sync.WaitGroup

	mu     sync.Mutex
	pools  map[string]*pool[B]
	closed bool
}

// pool keeps the boxes of one image; its fields are guarded by Pools.mu.
type pool[B any] struct {
	image   string
	max     int // its Config.Sizes entry
	size    int // boxes to keep: max, or following use (FollowsUse)
	lastUse time.Time
	ready   []B
	filling int // fills started, waiting or making
	making  int // fills making a box now, or rushing to
	waiting int // takes waiting for one of them
	// changed is closed (and replaced) when a box is ready or a fill ends.
	changed chan struct{}
	// expect is Expect's burst, for the next counted take; burst is the
	// number of its takes still to come. While the burst needs more boxes
	// than the pool has or is making, fills start without the quiet wait
	// or the filler (rush).
	expect, burst int
	// lead is 1 from Begin to the burst's first take: that take's box,
	// made by the pool (without Begin the take makes it itself), on top
	// of the pool's size.
	lead int
}

// signal wakes the takes waiting on wp (Pools.mu held).
func (wp *pool[B]) signal() {
	close(wp.changed)
	wp.changed = make(chan struct{})
}

// New makes the pools of cfg, empty: Fill starts filling them.
func New[B any](cfg Config[B]) *Pools[B] {
	p := &Pools[B]{cfg: cfg, log: cfg.Log, done: make(chan struct{}), filler: make(chan struct{}, 1), pools: map[string]*pool[B]{}}
	if p.log == nil {
		p.log = slog.Default()
	}
	for image, n := range cfg.Sizes {
		if n <= 0 {
			continue
		}
		wp := &pool[B]{image: image, max: n, size: n, lastUse: time.Now(), changed: make(chan struct{})}
		if cfg.FollowsUse {
			wp.size = 0
		}
		p.pools[image] = wp
	}
	return p
}

// Expect says that n boxes of image will be taken soon, one after another
// (the stages of a run). The next take that counts as a use sizes the
// pool to the rest of them (up to its Config.Sizes entry) and starts their
// fills at once, side by side, without waiting for Config.Quiet: each
// later take finds its box made, or being made. Nothing is made before
// that take (a run with nothing to do makes no box).
func (p *Pools[B]) Expect(image string, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if wp := p.pools[image]; wp != nil {
		wp.expect = n
	}
}

// Begin starts the burst Expect announced for image now, before its
// first take: its boxes are made at once (up to the pool's Config.Sizes
// entry and the first take's own, the rest as they are taken), and its
// first take waits for one of them instead of making its own. For a
// caller that knows the burst will come (the first run over a fresh data
// dir runs every stage); a burst that never comes leaves its boxes in
// the pool.
func (p *Pools[B]) Begin(image string) {
	p.mu.Lock()
	wp := p.pools[image]
	if wp == nil || wp.expect == 0 {
		p.mu.Unlock()
		return
	}
	wp.burst, wp.expect, wp.lead = wp.expect, 0, 1
	p.resize(wp, 0)
	p.mu.Unlock()
	p.Fill()
}

// resize sets wp's size after a counted take (grow 1) or the start of a
// burst (grow 0), Pools.mu held. A pool of a fixed size keeps it (max);
// one following use grows by one per take, at once to the rest of a
// burst; one sized by bursts alone holds their rest and nothing more. A
// begun burst's first box comes on top (lead).
func (p *Pools[B]) resize(wp *pool[B], grow int) {
	switch {
	case p.cfg.BurstsOnly:
		wp.size = min(wp.burst, wp.max+wp.lead)
	case p.cfg.FollowsUse:
		wp.size = min(max(wp.size+grow, wp.burst), wp.max+wp.lead)
	}
}

// Take takes a ready box of image, if the pool has one, or one being made
// that no other take waits for (until ctx ends). use says whether the
// take counts as a use of the pool (its last use, with FollowsUse its
// growth, and Expect's burst), hit or miss. Either way a fill starts if
// the pool lacks boxes.
func (p *Pools[B]) Take(ctx context.Context, image string, use bool) (B, bool) {
	var zero B
	p.mu.Lock()
	wp := p.pools[image]
	if wp == nil {
		p.mu.Unlock()
		return zero, false
	}
	if use {
		wp.lastUse = time.Now()
		switch {
		case wp.expect > 0: // the burst's first take: the pool holds the rest
			wp.burst, wp.expect = wp.expect-1, 0
		case wp.burst > 0:
			wp.burst--
		}
		wp.lead = 0
		p.resize(wp, 1)
	}
	for len(wp.ready) == 0 {
		if wp.making <= wp.waiting || p.closed {
			p.mu.Unlock()
			p.Fill()
			return zero, false
		}
		wp.waiting++
		ch := wp.changed
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
		case <-p.done:
		}
		p.mu.Lock()
		wp.waiting--
		if ctx.Err() != nil {
			p.mu.Unlock()
			p.Fill()
			return zero, false
		}
	}
	b := wp.ready[len(wp.ready)-1]
	wp.ready = wp.ready[:len(wp.ready)-1]
	p.mu.Unlock()
	p.Fill()
	return b, true
}

// Fill starts making the boxes the pools lack (unless MayFill says
// another server keeps them, or the pools are closed).
func (p *Pools[B]) Fill() {
	if p.cfg.MayFill != nil && !p.cfg.MayFill() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	for _, wp := range p.pools {
		for len(wp.ready)+wp.filling < wp.size {
			rush := wp.burst > len(wp.ready)+wp.filling
			wp.filling++
			if rush {
				wp.making++ // from now: a take waits for it
			}
			p.wg.Add(1)
			go p.fillOne(wp, rush)
		}
	}
}

// fillOne makes a box for wp. A rush fill (Expect's burst) starts at
// once, beside the others; any other waits for Config.Quiet and makes one
// box at a time over all pools.
func (p *Pools[B]) fillOne(wp *pool[B], rush bool) {
	defer p.wg.Done()
	defer safe.Recover(p.log, "warm pool", nil)
	made := false
	defer func() {
		if !made {
			p.mu.Lock()
			wp.filling--
			wp.signal()
			p.mu.Unlock()
		}
	}()
	if !rush {
		// Not while boxes are being taken: a run's stages take one each,
		// and a box made meanwhile competes with their commands for the
		// CPU.
		for {
			p.mu.Lock()
			wait := p.cfg.Quiet - time.Since(wp.lastUse)
			p.mu.Unlock()
			if wait <= 0 {
				break
			}
			select {
			case <-time.After(wait):
			case <-p.done:
				return
			}
		}
		// One fill at a time; one that waited past Close, or past the
		// pool shrinking, makes nothing.
		select {
		case p.filler <- struct{}{}:
		case <-p.done:
			return
		}
		defer func() { <-p.filler }()
	}
	p.mu.Lock()
	// Wanted unless the pool shrank meanwhile; a take waiting for a box
	// wants it whatever the size (the last of a burst shrinks the pool
	// to nothing, its own box included).
	wanted := !p.closed && len(wp.ready)+wp.filling <= wp.size+wp.waiting
	switch {
	case wanted && !rush:
		wp.making++
	case !wanted && rush:
		wp.making--
	}
	p.mu.Unlock()
	if !wanted {
		return
	}
	b, err := func() (B, error) {
		defer func() { // also if Make panics: no take waits for it then
			p.mu.Lock()
			wp.making--
			p.mu.Unlock()
		}()
		return p.cfg.Make(context.Background(), wp.image)
	}()
	if err != nil {
		if errors.Is(err, ErrStopping) { // a shutdown, not a failure
			p.log.Debug("warm pool: create box", "image", wp.image, "err", err)
		} else {
			p.log.Warn("warm pool: create box", "image", wp.image, "err", err)
		}
		return
	}
	p.mu.Lock()
	wp.filling--
	made = true
	if p.closed {
		wp.signal()
		p.mu.Unlock()
		p.cfg.Discard(context.Background(), b)
		return
	}
	wp.ready = append(wp.ready, b)
	wp.signal()
	p.mu.Unlock()
}

// Shrink takes a box from each use-following pool that was not used for
// Config.Idle (the service's reaper calls it on each tick).
func (p *Pools[B]) Shrink(ctx context.Context) {
	if !p.cfg.FollowsUse {
		return
	}
	var drop []B
	p.mu.Lock()
	for _, wp := range p.pools {
		if wp.size == 0 || time.Since(wp.lastUse) < p.cfg.Idle {
			continue
		}
		wp.size--
		wp.lastUse = time.Now() // the next shrink is one more idle period away
		if len(wp.ready) > wp.size {
			drop = append(drop, wp.ready[0])
			wp.ready = wp.ready[1:]
		}
	}
	p.mu.Unlock()
	for _, b := range drop {
		p.cfg.Discard(ctx, b)
	}
}

// Ready returns the number of ready boxes by image.
func (p *Pools[B]) Ready() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.pools))
	for image, wp := range p.pools {
		out[image] = len(wp.ready)
	}
	return out
}

// Close stops the fills (one making a box finishes, and its box is
// discarded), waits for them, and discards the ready boxes, all at once.
// The pools are empty and fill no more after it.
func (p *Pools[B]) Close(ctx context.Context) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.done)
	p.mu.Unlock()
	p.wg.Wait()
	p.mu.Lock()
	var ready []B
	for _, wp := range p.pools {
		ready = append(ready, wp.ready...)
		wp.ready = nil
	}
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, b := range ready {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer safe.Recover(p.log, "drain warm pool", nil)
			p.cfg.Discard(ctx, b)
		}()
	}
	wg.Wait()
}
