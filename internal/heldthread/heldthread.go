// Package heldthread starts child processes from one OS thread that a
// goroutine of its own holds until Stop. A child started with Pdeathsig
// (SysProcAttr) gets its signal when the thread that started it ends, not
// when the process does, and a Go process may end threads: a goroutine
// that returns locked to its thread takes the thread with it
// (sandbox/local's staging does). A child started from an arbitrary
// goroutine can so be killed in the middle of a test or a benchmark;
// started here it lives until Stop, or until the process dies, as meant.
// Hand-written because os/exec has no way to say which thread forks.
package heldthread

import (
	"errors"
	"os/exec"
	"runtime"
	"sync"
)

// ErrStopped: the Starter was stopped.
var ErrStopped = errors.New("the starter is stopped")

// Starter starts processes on its held thread. Its methods may be called
// from many goroutines.
type Starter struct {
	mu   sync.Mutex
	reqs chan func() // nil once stopped
}

// New returns a Starter, its thread held.
func New() *Starter {
	s := &Starter{reqs: make(chan func())}
	reqs := s.reqs
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for f := range reqs {
			f()
		}
	}()
	return s
}

// Start runs cmd.Start on the held thread (ErrStopped after Stop).
func (s *Starter) Start(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	s.mu.Lock()
	if s.reqs == nil {
		s.mu.Unlock()
		return ErrStopped
	}
	s.reqs <- func() { errc <- cmd.Start() }
	s.mu.Unlock()
	return <-errc
}

// Stop lets the thread go. Call it once the children it started are gone:
// their Pdeathsig may fire then. A second Stop does nothing.
func (s *Starter) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reqs != nil {
		close(s.reqs)
		s.reqs = nil
	}
}
