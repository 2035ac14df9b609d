package sandbox

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/backend"
)

// panicBackend is the fake backend with a bug on demand: Create and Remove
// panic while their flag is set.
type panicBackend struct {
	*fakeBackend
	create, remove atomic.Bool
}

func (p *panicBackend) Create(ctx context.Context, spec backend.Spec) (backend.Info, error) {
	if p.create.Load() {
		panic("injected: Create")
	}
	return p.fakeBackend.Create(ctx, spec)
}

func (p *panicBackend) Remove(ctx context.Context, id string) error {
	if p.remove.Load() {
		panic("injected: Remove")
	}
	return p.fakeBackend.Remove(ctx, id)
}

// syncBuffer is a log sink safe for the service's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestPanicsDoNotKillTheServer: panics in the warm pool's goroutine, in a
// tool handler and in the reaper are logged with their stack; the tool's
// caller gets an error result and the service keeps answering.
func TestPanicsDoNotKillTheServer(t *testing.T) {
	pb := &panicBackend{fakeBackend: newFakeBackend(t)}
	pb.create.Store(true)
	var logs syncBuffer
	s := newTestService(t, pb, "", func(c *Config) {
		c.Pool = map[string]int{backend.DefaultImage: 1}
		c.ReapInterval = 50 * time.Millisecond
		c.SessionTTL = time.Second
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	ctx := context.Background()
	require.Eventually(t, func() bool { return bytes.Contains([]byte(logs.String()), []byte("injected: Create")) },
		10*time.Second, 20*time.Millisecond, "the warm pool's panic is logged")
	assert.Contains(t, logs.String(), "panic_test.go", "with its stack")

	// A tool handler that panics (in the backend's Remove) is an error result.
	pb.create.Store(false)
	id, _, err := s.NewSession(ctx)
	require.NoError(t, err)
	m := callJSON(t, ctx, s, id, "shell", map[string]any{"sandbox": "a", "command": "true"})
	require.Equal(t, false, m["is_error"], "%v", m)
	pb.remove.Store(true)
	m = callJSON(t, ctx, s, id, "sandbox_destroy", map[string]any{"sandbox": "a"})
	require.Equal(t, true, m["is_error"], "%v", m)
	assert.Contains(t, m["error"], "internal error in tool sandbox_destroy: injected: Remove")
	m = callJSON(t, ctx, s, id, "shell", map[string]any{"sandbox": "b", "command": "echo still here"})
	require.Equal(t, false, m["is_error"], "%v", m)
	assert.Equal(t, "still here\n", m["stdout"])

	// The reaper's expiry of the idle session panics in Remove; the reaper
	// goes on, and expires it once Remove works again.
	require.Eventually(t, func() bool { return bytes.Contains([]byte(logs.String()), []byte("in=reaper")) },
		10*time.Second, 20*time.Millisecond, "the reaper's panic is logged")
	pb.remove.Store(false)
	other, _, err := s.NewSession(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return !s.hasSession(other) }, 10*time.Second, 20*time.Millisecond, "the reaper still expires sessions")
}
