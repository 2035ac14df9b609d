package sandbox

// What the faces need from the service. The HTTP API, MCP over HTTP, the
// preview proxy and /metrics live in sandbox/httpapi, the MCP adapter in
// sandbox/mcpserver; besides the tool calls (CallTool, CallToolAs) and the
// session calls (NewSessionWith, Authenticate, DeleteSession) they reach
// sessions and boxes only through the methods below, so the pool's locks
// and box states stay in this package.

import (
	"context"
	"log/slog"
	"slices"
	"time"
)

// MaxFileBytes is the most a file tool reads or writes in one call (2 MiB).
const MaxFileBytes = fileToolMaxBytes

// Config returns the service's configuration, with the defaults New filled
// in.
func (s *Service) Config() Config { return s.cfg }

// Logger returns the service's logger (Config.Logger or slog.Default()).
func (s *Service) Logger() *slog.Logger { return s.log }

// SessionInfo describes a session (GET /v1/sessions).
type SessionInfo struct {
	ID      string    `json:"id"`
	Created time.Time `json:"created"`
	Boxes   int       `json:"boxes"`
	// Own: the server's own session (its runtime's); a
	// client may not delete it.
	Own bool `json:"own,omitempty"`
}

// Sessions lists the sessions, oldest first.
func (s *Service) Sessions() []SessionInfo {
	s.mu.Lock()
	out := make([]SessionInfo, 0, len(s.sessions))
	for _, sess := range s.sessions {
		if !sess.deleted {
			out = append(out, SessionInfo{ID: sess.ID, Created: sess.Created, Boxes: len(sess.boxes), Own: sess.own})
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b SessionInfo) int { return a.Created.Compare(b.Created) })
	return out
}

// Pin exempts session id from expiry (Config.SessionTTL): its owner, not
// an idle timer, decides when it goes (an MCP session over HTTP that has
// an idle timeout of its own, a client in this process). Pins are not
// stored: the owner pins again after a restart. An unknown id is an
// ErrNoSession.
func (s *Service) Pin(id string) error {
	if _, err := s.session(id); err != nil {
		return err
	}
	s.pin(id)
	return nil
}

// toolOutputKey carries the output callback of a tool call (WithToolOutput).
type toolOutputKey struct{}

// WithToolOutput returns ctx under which a tool that runs a command
// (shell) hands its output to fn as it comes: the MCP face turns it into
// progress and log notifications.
func WithToolOutput(ctx context.Context, fn func(stream string, data []byte)) context.Context {
	return context.WithValue(ctx, toolOutputKey{}, fn)
}

// toolOutput is the output callback of ctx, nil if none.
func toolOutput(ctx context.Context) func(stream string, data []byte) {
	fn, _ := ctx.Value(toolOutputKey{}).(func(stream string, data []byte))
	return fn
}
