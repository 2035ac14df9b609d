package builtins

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/cellbox/cellbox/sandboxclient"
)

// Env is what the box-driving node kinds (exec, sandbox) need from their
// host: a client of the sandbox service (one session: box names are per
// session) and a logger.
type Env struct {
	// Client drives the boxes. Required by exec and sandbox nodes.
	Client sandboxclient.Client
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// LLM is where llm nodes find their providers.
	LLM LLMEnv
	// Teardowns, if set, takes an exec run's box teardown off the run's
	// critical path: the result is published while the box is destroyed
	// in the background; the host waits for them (Teardowns.Wait) before
	// it lets the session's boxes go. nil: a run destroys its box before
	// it returns.
	Teardowns *Teardowns
}

// Teardowns tracks box teardowns running in the background.
type Teardowns struct {
	mu     sync.Mutex
	wg     sync.WaitGroup
	closed bool
}

// do runs fn in the background, or at once once Wait has been called (a
// host shutting down waits for nothing started after it).
func (t *Teardowns) do(fn func()) {
	if t == nil {
		fn()
		return
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		fn()
		return
	}
	t.wg.Add(1)
	t.mu.Unlock()
	go func() {
		defer t.wg.Done()
		fn()
	}()
}

// Wait waits for the teardowns in flight (or for ctx to end); teardowns
// asked for later run before their run returns.
func (t *Teardowns) Wait(ctx context.Context) error {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	done := make(chan struct{})
	go func() {
		t.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (e Env) logger() *slog.Logger {
	if e.Logger == nil {
		return slog.Default()
	}
	return e.Logger
}

func (e Env) check() error {
	if e.Client == nil {
		return errors.New("no sandbox client: exec and sandbox nodes need builtins.Env.Client")
	}
	return nil
}

// cleanupTimeout bounds destroying a box after its run (also on abort).
const cleanupTimeout = 30 * time.Second
