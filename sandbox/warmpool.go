package sandbox

// The warm pool: pre-started boxes of an image (Config.Pool), so that a
// session's first box with default settings takes one instead of waiting
// for a create. Filled in the background, drained at Close.
//
// A pooled box is one that was made and started and never used: taking
// it hands over a box exactly as fresh as a new one (no files, processes
// or environment of another run), it only skips the wait.
//
// With Config.PoolFollowsUse (cellbox run) a pool starts empty and its
// size follows use: each take, hit or miss, grows it by one up to its
// Config.Pool size, and each PoolIdle without a take shrinks it by one
// (removing a ready box). Config.OneShot says which takes count (cellbox
// run: its exec stages' boxes, not a sandbox node's long-lived one).
// Fills wait until no box was taken for fillQuiet, and run one at a time
// in the whole service, so that refilling does not compete for the CPU
// with the stages that run.

import (
	"context"
	"sync"
	"time"

	"github.com/cellbox/cellbox/internal/safe"
	"github.com/cellbox/cellbox/sandbox/agent"
)

// warmPool keeps pre-started boxes of one image. All fields but image and
// max are guarded by Service.mu.
type warmPool struct {
	image   string
	max     int // Config.Pool's size
	size    int // boxes to keep: max, or following use (PoolFollowsUse)
	lastUse time.Time
	ready   []warmBox
	filling int
}

type warmBox struct {
	id     string
	client *agent.Client
}

// newWarmPool returns the pool of image with at most n boxes.
func (s *Service) newWarmPool(image string, n int) *warmPool {
	p := &warmPool{image: image, max: n, size: n, lastUse: time.Now()}
	if s.cfg.PoolFollowsUse {
		p.size = 0
	}
	return p
}

// takeWarm takes a pre-started box of image for the box name, if one is
// ready. Each call for a name that Config.OneShot accepts (or every
// call, without OneShot) counts as a use of the pool.
func (s *Service) takeWarm(image, name string) (string, *agent.Client, bool) {
	s.mu.Lock()
	p := s.pools[image]
	if p == nil {
		s.mu.Unlock()
		return "", nil, false
	}
	if s.cfg.OneShot == nil || s.cfg.OneShot(name) {
		p.lastUse = time.Now()
		if s.cfg.PoolFollowsUse && p.size < p.max {
			p.size++
		}
	}
	if len(p.ready) == 0 {
		s.mu.Unlock()
		s.fillPools()
		return "", nil, false
	}
	w := p.ready[len(p.ready)-1]
	p.ready = p.ready[:len(p.ready)-1]
	s.mu.Unlock()
	s.metrics.observeWarmTake()
	s.fillPools()
	return w.id, w.client, true
}

// shrinkPools shrinks by one box each use-following pool that was not used
// for PoolIdle (called by the reaper).
func (s *Service) shrinkPools(ctx context.Context) {
	if !s.cfg.PoolFollowsUse {
		return
	}
	var drop []warmBox
	s.mu.Lock()
	for _, p := range s.pools {
		if p.size == 0 || time.Since(p.lastUse) < s.cfg.PoolIdle {
			continue
		}
		p.size--
		p.lastUse = time.Now() // the next shrink is one more idle period away
		if len(p.ready) > p.size {
			drop = append(drop, p.ready[0])
			p.ready = p.ready[1:]
		}
	}
	s.mu.Unlock()
	for _, w := range drop {
		w.client.Close()
		s.removeBox(ctx, w.id)
	}
}

// fillPools starts the creation of the boxes the warm pools lack.
func (s *Service) fillPools() {
	if !s.holds(leaseWarmPool) {
		return // another server keeps the warm pool
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	for _, p := range s.pools {
		for len(p.ready)+p.filling < p.size {
			p.filling++
			s.wg.Add(1)
			go s.fillOne(p)
		}
	}
}

func (s *Service) fillOne(p *warmPool) {
	defer s.wg.Done()
	defer safe.Recover(s.log, "warm pool", nil)
	ok := false
	defer func() {
		if !ok {
			s.mu.Lock()
			p.filling--
			s.mu.Unlock()
		}
	}()
	// Not cancelled by Close, which waits for it: a box half made when
	// the service stops would be left behind.
	ctx, cancel := context.WithTimeout(context.Background(), 2*s.cfg.ReadyTimeout)
	defer cancel()
	// Not while boxes are being taken: a run's stages take one each, and
	// a box made meanwhile competes with their commands for the CPU.
	for {
		s.mu.Lock()
		wait := fillQuiet - time.Since(p.lastUse)
		s.mu.Unlock()
		if wait <= 0 {
			break
		}
		select {
		case <-time.After(wait):
		case <-s.ctx.Done():
			return
		}
	}
	// One fill at a time; one that waited past Close, or past the pool
	// shrinking, makes nothing.
	select {
	case s.filler <- struct{}{}:
	case <-s.ctx.Done():
		return
	}
	defer func() { <-s.filler }()
	s.mu.Lock()
	wanted := !s.closed && len(p.ready)+p.filling <= p.size
	s.mu.Unlock()
	if !wanted {
		return
	}
	release, err := s.acquireSlot(ctx, nil)
	if err != nil {
		return
	}
	defer release()
	rec := boxRecord{ID: "cb-" + randomID(8), Image: p.image}
	cl, err := s.makeBox(ctx, rec, "", "", false)
	if err != nil {
		s.log.Warn("warm pool: create box", "image", p.image, "err", err)
		return
	}
	s.mu.Lock()
	p.filling--
	ok = true
	if s.closed {
		s.mu.Unlock()
		cl.Close()
		s.removeBox(context.Background(), rec.ID)
		return
	}
	p.ready = append(p.ready, warmBox{id: rec.ID, client: cl})
	s.mu.Unlock()
}

// fillQuiet is how long after the last take a pool waits to refill: the
// stages of a run take their boxes within it (measured with `cellbox
// bench pipeline`: the csv rerun on bubblewrap 76-91 ms with refills at
// once, 64-69 ms with this wait).
const fillQuiet = 100 * time.Millisecond

// drainPools removes the pre-started boxes (at Close).
func (s *Service) drainPools(ctx context.Context) {
	s.mu.Lock()
	var ready []warmBox
	for _, p := range s.pools {
		ready = append(ready, p.ready...)
		p.ready = nil
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, w := range ready {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer safe.Recover(s.log, "drain warm pool", nil)
			w.client.Close()
			s.removeBox(ctx, w.id)
		}()
	}
	wg.Wait()
}
