package sandbox

// What the faces need from the service. The HTTP API, MCP over HTTP, the
// preview proxy and /metrics live in sandbox/httpapi, the MCP adapter in
// sandbox/mcpserver; besides the tool calls (CallTool, CallToolAs) and the
// session calls (NewSessionWith, Authenticate, DeleteSession) they reach
// sessions and boxes only through the methods below, so the pool's locks
// and box states stay in this package.

import (
	"log/slog"
	"slices"
	"time"

	"github.com/cellbox/cellbox/sandbox/tools"
)

// MaxFileBytes is the most a file tool reads or writes in one call (2 MiB).
const MaxFileBytes = tools.MaxFileBytes

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
