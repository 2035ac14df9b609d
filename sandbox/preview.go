package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/previews"
)

// Previews (sandbox/previews): the browse tool makes a preview id for a
// box's port, stored with its box and dropped when the box goes;
// OpenPreview leases the box behind one for the HTTP proxy
// (sandbox/httpapi), which tunnels each connection through the box's agent.

// dropPreviewsLocked forgets b's preview ids; the caller holds Service.mu.
func (s *Service) dropPreviewsLocked(b *box) {
	for _, id := range b.previews {
		s.previews.Drop(id)
	}
	b.previews = nil
}

func browseTool(ctx context.Context, c *call, in api.BrowseInput) (api.BrowseOutput, error) {
	out := api.BrowseOutput{Port: in.Port}
	if in.Port < 1 || in.Port > 65535 {
		return out, api.WithCode(api.CodeInvalidInput, fmt.Errorf("port %d is out of range 1-65535", in.Port))
	}
	base := *c.s.baseURL.Load()
	if base == "" {
		return out, errors.New("this server has no base URL for previews (it is set by cellbox serve, or Service.SetBaseURL)")
	}
	l, err := c.box(ctx, in.Sandbox)
	if err != nil {
		return out, err
	}
	s := c.s
	s.mu.Lock()
	b := l.b
	id := b.previews[in.Port]
	var rec *boxRecord
	if id == "" {
		id = previews.NewID()
		if b.previews == nil {
			b.previews = map[int]string{}
		}
		b.previews[in.Port] = id
		s.previews.Add(id, previews.Target{Box: b.rec.ID, Port: in.Port})
		rec = b.record()
	}
	s.mu.Unlock()
	if rec != nil {
		if err := s.st.apply(change{box: rec}); err != nil {
			return out, err
		}
		if err := s.recordPreview(ctx, id, c.sess.ID); err != nil {
			return out, err
		}
	}
	out.URL, err = previews.URL(base, id, "/")
	if err != nil {
		return out, err
	}
	out.HostURL = out.URL
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	conn, err := l.client.DialPort(pctx, in.Port)
	cancel()
	if err == nil {
		conn.Close()
		out.Listening = true
	} else {
		c.Notice(fmt.Sprintf("nothing listens on port %d in this sandbox yet; the URL works once a server does (start it with shell and background: true, listening on 127.0.0.1 or 0.0.0.0)", in.Port))
	}
	return out, nil
}

// ErrNoPreview is returned (wrapped) by OpenPreview for an id no preview
// has: never made, or its box was destroyed or recreated since.
var ErrNoPreview = errors.New("no such preview")

// Preview is the box and port behind a preview id, leased for one proxied
// request: the box stays awake until Release.
type Preview struct {
	Box  string // the box's id
	Port int
	l    *lease
}

// Dial opens a connection to the preview's port inside its box, through
// the box's agent (the box needs no network).
func (p *Preview) Dial(ctx context.Context) (net.Conn, error) {
	return p.l.client.DialPort(ctx, p.Port)
}

// Release ends the lease.
func (p *Preview) Release() { p.l.release() }

// OpenPreview leases the box of preview id, waking it (or restarting it)
// if needed. Notices about the box are logged: the browser on the other
// end is no agent to tell.
func (s *Service) OpenPreview(ctx context.Context, id string) (*Preview, error) {
	t, ok := s.previews.Get(id)
	s.mu.Lock()
	b := s.boxes[t.Box]
	s.mu.Unlock()
	if !ok || b == nil {
		return nil, fmt.Errorf("preview %s: %w", id, ErrNoPreview)
	}
	l, err := s.use(ctx, nil, t.Box, b, func(n string) { s.log.Info("preview: "+n, "box", t.Box) })
	if err != nil {
		return nil, fmt.Errorf("preview of sandbox %s: %w", t.Box, err)
	}
	return &Preview{Box: t.Box, Port: t.Port, l: l}, nil
}
