package sandbox

// The warm pool: pre-started boxes of an image (Config.Pool), so that a
// session's first box with default settings takes one instead of waiting
// for a create. Filled in the background, drained at Close.

import (
	"context"
	"sync"

	"github.com/cellbox/cellbox/internal/safe"
	"github.com/cellbox/cellbox/sandbox/agent"
)

// warmPool keeps pre-started boxes of one image.
type warmPool struct {
	image   string
	size    int
	ready   []warmBox // guarded by Service.mu
	filling int       // guarded by Service.mu
}

type warmBox struct {
	id     string
	client *agent.Client
}

// takeWarm takes a pre-started box of image, if one is ready.
func (s *Service) takeWarm(image string) (string, *agent.Client, bool) {
	s.mu.Lock()
	p := s.pools[image]
	if p == nil || len(p.ready) == 0 {
		s.mu.Unlock()
		return "", nil, false
	}
	w := p.ready[len(p.ready)-1]
	p.ready = p.ready[:len(p.ready)-1]
	s.mu.Unlock()
	s.fillPools()
	return w.id, w.client, true
}

// fillPools starts the creation of the boxes the warm pools lack.
func (s *Service) fillPools() {
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
