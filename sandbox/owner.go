package sandbox

// Ownership: the reaper (idle sessions and boxes, health checks, the sweep
// of snapshot blobs no snapshot names) and the warm pools act only while
// this server holds their lease (Config.Leaser), so that of several
// servers sharing state one at a time does (issue: several servers, one
// state). Saving the last-used times of the boxes this server served is
// its own business and needs none. On one machine the leaser is
// lease.Local and this server always holds them.

import (
	"context"
	"errors"
	"time"

	leases "github.com/cellbox/cellbox/sandbox/lease"
)

// The leases the service's background work holds.
const (
	leaseReaper   = "sandbox/reaper"
	leaseWarmPool = "sandbox/warm-pool"
	// leaseTTL is how long a lease outlives a server that stopped renewing
	// it: another server takes over its work after at most this.
	leaseTTL = 10 * time.Second
)

// holds reports whether this server holds the lease on name now, taking it
// when it is free; a lease lost since is given up (the work it covers
// stops until it is held again).
func (s *Service) holds(name string) bool {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	if h := s.held[name]; h != nil {
		select {
		case <-h.Lost():
			delete(s.held, name)
			s.log.Warn("lost a lease: this server stops that work", "lease", name)
		default:
			return true
		}
	}
	h, err := leases.Keep(s.ctx, s.cfg.Leaser, name, s.cfg.Holder, leaseTTL)
	if err != nil {
		if !errors.Is(err, leases.ErrHeld) {
			s.log.Warn("take a lease", "lease", name, "err", err)
		}
		return false
	}
	s.held[name] = h
	return true
}

// releaseLeases gives up every lease the service holds (at Close), so that
// another server takes the work over at once rather than after leaseTTL.
func (s *Service) releaseLeases() {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for name, h := range s.held {
		if err := h.Release(ctx); err != nil {
			s.log.Warn("release a lease", "lease", name, "err", err)
		}
		delete(s.held, name)
	}
}
