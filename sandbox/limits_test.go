package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/backend"
)

// callJSON runs a tool for session id and decodes the result.
func callJSON(t *testing.T, ctx context.Context, s *Service, id, name string, input any) map[string]any {
	t.Helper()
	raw, err := json.Marshal(input)
	require.NoError(t, err)
	out, err := s.CallTool(ctx, id, name, raw)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(out, &m))
	return m
}

// TestBoxCaps: a box storm stops at the per-session cap, then at the global
// one, each refused with a message naming the limit and its flag.
func TestBoxCaps(t *testing.T) {
	be := newFakeBackend(t)
	s := newTestService(t, be, "", func(c *Config) {
		c.MaxBoxesPerSession = 3
		c.MaxBoxes = 5
		c.Pool = map[string]int{backend.DefaultImage: 2} // warm boxes count against nobody
	})
	ctx := context.Background()
	a, _, err := s.NewSession(ctx)
	require.NoError(t, err)
	b, _, err := s.NewSession(ctx)
	require.NoError(t, err)

	for i := range 3 {
		m := callJSON(t, ctx, s, a, "shell", map[string]any{"sandbox": fmt.Sprint("a", i), "command": "true"})
		require.Equal(t, false, m["is_error"], "%v", m)
	}
	m := callJSON(t, ctx, s, a, "shell", map[string]any{"sandbox": "a3", "command": "true"})
	require.Equal(t, true, m["is_error"], "%v", m)
	assert.Contains(t, m["error"], "--max-boxes-per-session")
	m = callJSON(t, ctx, s, a, "sandbox_create", map[string]any{"sandbox": "a3"})
	require.Equal(t, true, m["is_error"], "%v", m)
	assert.Contains(t, m["error"], "--max-boxes-per-session")

	// An existing box is still usable at the cap.
	m = callJSON(t, ctx, s, a, "shell", map[string]any{"sandbox": "a0", "command": "true"})
	require.Equal(t, false, m["is_error"], "%v", m)

	for i := range 2 {
		m := callJSON(t, ctx, s, b, "shell", map[string]any{"sandbox": fmt.Sprint("b", i), "command": "true"})
		require.Equal(t, false, m["is_error"], "%v", m)
	}
	m = callJSON(t, ctx, s, b, "shell", map[string]any{"sandbox": "b2", "command": "true"})
	require.Equal(t, true, m["is_error"], "%v", m)
	assert.Contains(t, m["error"], "--max-boxes)")

	// Destroying one makes room.
	m = callJSON(t, ctx, s, a, "sandbox_destroy", map[string]any{"sandbox": "a0"})
	require.Equal(t, false, m["is_error"], "%v", m)
	m = callJSON(t, ctx, s, b, "shell", map[string]any{"sandbox": "b2", "command": "true"})
	require.Equal(t, false, m["is_error"], "%v", m)
}

// TestSessionTTL: the reaper deletes a session idle for longer than
// SessionTTL with its boxes; a used one stays, and so does an idle one
// served in-process (the runtime's).
func TestSessionTTL(t *testing.T) {
	be := newFakeBackend(t)
	s := newTestService(t, be, "", func(c *Config) {
		c.SessionTTL = 2 * time.Second
		c.ReapInterval = 50 * time.Millisecond
	})
	ctx := context.Background()
	idle, _, err := s.NewSession(ctx)
	require.NoError(t, err)
	busy, _, err := s.NewSession(ctx)
	require.NoError(t, err)
	owned, _, err := s.NewSession(ctx)
	require.NoError(t, err)
	_ = s.Client(owned)
	for _, id := range []string{idle, busy} {
		m := callJSON(t, ctx, s, id, "shell", map[string]any{"command": "true"})
		require.Equal(t, false, m["is_error"], "%v", m)
	}
	require.Equal(t, 2, be.count())
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		m := callJSON(t, ctx, s, busy, "shell", map[string]any{"command": "true"})
		require.Equal(t, false, m["is_error"], "%v", m)
		time.Sleep(200 * time.Millisecond)
	}
	require.Eventually(t, func() bool { return !s.hasSession(idle) }, 10*time.Second, 50*time.Millisecond, "the idle session was not expired")
	_, err = s.CallTool(ctx, idle, "shell", json.RawMessage(`{"command":"true"}`))
	require.ErrorIs(t, err, ErrNoSession)
	assert.True(t, s.hasSession(busy))
	assert.True(t, s.hasSession(owned))
	assert.Equal(t, 1, be.count(), "the expired session's box is removed")
}

// TestSharedBoxDestroyedWhileAttaching: a session bound to a shared box
// that another session destroyed in the same instant (the race leaves the
// binding to a removed box) gets a clear error instead of a call that
// spins forever, and can make the box again.
func TestSharedBoxDestroyedWhileAttaching(t *testing.T) {
	be := newFakeBackend(t)
	s := newTestService(t, be, "", nil)
	ctx := context.Background()
	a, _, err := s.NewSession(ctx)
	require.NoError(t, err)
	b, _, err := s.NewSession(ctx)
	require.NoError(t, err)
	m := callJSON(t, ctx, s, a, "sandbox_create", map[string]any{"sandbox": "x", "box_id": "shared-1", "share_across_sessions": true})
	require.Equal(t, false, m["is_error"], "%v", m)

	// The outcome of the race: destroyBox of a saw no other user and
	// removed the box just as b bound its name to it.
	s.mu.Lock()
	box := s.sessions[a].boxes["x"]
	s.sessions[b].boxes["x"] = box
	s.mu.Unlock()
	require.NoError(t, s.sessions[a].destroyDirect(s, "x"))

	done := make(chan map[string]any, 1)
	go func() {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		done <- callResult(cctx, s, b, "shell", map[string]any{"sandbox": "x", "command": "true"})
	}()
	select {
	case m = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the call on a destroyed shared box did not return")
	}
	require.Equal(t, true, m["is_error"], "%v", m)
	assert.Contains(t, m["error"], "was destroyed by another session")

	m = callJSON(t, ctx, s, b, "sandbox_create", map[string]any{"sandbox": "x", "box_id": "shared-1", "share_across_sessions": true})
	require.Equal(t, false, m["is_error"], "%v", m)
	m = callJSON(t, ctx, s, b, "shell", map[string]any{"sandbox": "x", "command": "true"})
	require.Equal(t, false, m["is_error"], "%v", m)
}

// destroyDirect removes the box name of sess as destroyBox does when no
// other session uses it, ignoring the other bindings (the race's view).
func (sess *Session) destroyDirect(s *Service, name string) error {
	s.mu.Lock()
	b := sess.boxes[name]
	delete(sess.boxes, name)
	s.mu.Unlock()
	b.life.Lock()
	defer b.life.Unlock()
	s.closeClient(b)
	s.mu.Lock()
	b.state = stateRemoved
	delete(s.boxes, b.rec.ID)
	s.mu.Unlock()
	s.removeBox(context.Background(), b.rec.ID)
	return s.st.apply(change{delBox: b.rec.ID})
}

// hasSession tells whether the service has session id, without using it
// (which would keep it alive).
func (s *Service) hasSession(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.sessions[id]
	return sess != nil && !sess.deleted
}

// callResult runs a tool and returns its decoded result, or {"go error":
// …} when the call itself fails: for calls in goroutines, which must not
// stop the test.
func callResult(ctx context.Context, s *Service, session, name string, input any) map[string]any {
	raw, _ := json.Marshal(input)
	out, err := s.CallTool(ctx, session, name, raw)
	var m map[string]any
	if err == nil {
		err = json.Unmarshal(out, &m)
	}
	if err != nil {
		m = map[string]any{"go error": err.Error()}
	}
	return m
}

// TestSessionCap: sessions stop at MaxSessions, refused as limit with a
// message naming the flag; deleting one makes room. There was no cap, and
// each session may keep its own 16 GiB of snapshots.
func TestSessionCap(t *testing.T) {
	s := newTestService(t, newFakeBackend(t), "", func(c *Config) { c.MaxSessions = 2 })
	ctx := context.Background()
	a, _, err := s.NewSession(ctx)
	require.NoError(t, err)
	_, _, err = s.NewSession(ctx)
	require.NoError(t, err)
	_, _, err = s.NewSession(ctx)
	require.Error(t, err)
	assert.Equal(t, api.CodeLimit, ErrorCode(err))
	assert.Contains(t, err.Error(), "this server has 2 sessions, the most it keeps at once")
	assert.Contains(t, err.Error(), "cellbox serve --max-sessions")
	require.NoError(t, s.DeleteSession(ctx, a))
	_, _, err = s.NewSession(ctx)
	require.NoError(t, err)
}

// TestOwnSession: the server's own session (its runtime's, served by a
// LocalClient) does not count against MaxSessions and a client may not
// delete it (DELETE with the server key broke every pattern until a
// restart); the sessions clients made stay deletable.
func TestOwnSession(t *testing.T) {
	s := newTestService(t, newFakeBackend(t), "", func(c *Config) { c.MaxSessions = 1 })
	ctx := context.Background()
	own, _, err := s.NewSession(ctx)
	require.NoError(t, err)
	s.Client(own)
	client, _, err := s.NewSession(ctx)
	require.NoError(t, err, "the server's own session is not counted")
	err = s.DeleteSessionForClient(ctx, own)
	require.ErrorIs(t, err, ErrOwnSession)
	assert.Equal(t, api.CodeRefused, ErrorCode(err))
	assert.Contains(t, err.Error(), "its runtime's: deleting it would break every pattern's exec and sandbox nodes")
	var infos []SessionInfo
	for _, si := range s.Sessions() {
		infos = append(infos, SessionInfo{ID: si.ID, Own: si.Own})
	}
	assert.ElementsMatch(t, []SessionInfo{{ID: own, Own: true}, {ID: client}}, infos)
	require.NoError(t, s.DeleteSessionForClient(ctx, client))
}
