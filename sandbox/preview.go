package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/cellbox/cellbox/sandbox/api"
)

// Preview URLs. A preview id is an unguessable random id that maps to a box
// and a port; the proxy (sandbox/httpapi) tunnels each connection through
// the box's agent (OpenPreview, Preview.Dial), so it works although the box
// has no network. This file keeps the ids (made by the browse tool, stored
// with their box, dropped when the box goes).
//
// A preview is served on an origin of its own, http://ID.localhost:PORT/
// (browsers and curl resolve *.localhost to the loopback address), never on
// the API's: a page a box serves must not be able to call the APIs with the
// browser's blessing (same origin). The old path form BASE/preview/ID/...
// only redirects there. The whole path goes to the app.

// previewTarget is where a preview id leads.
type previewTarget struct {
	box  string
	port int
}

// previewIDRE leaves the length (33) to IsPreviewID: a counted repetition
// compiles to a larger program at every start.
var previewIDRE = regexp.MustCompile(`^p[0-9a-f]+$`)

// dropPreviewsLocked forgets b's preview ids; the caller holds Service.mu.
func (s *Service) dropPreviewsLocked(b *box) {
	for _, id := range b.previews {
		delete(s.previews, id)
	}
	b.previews = nil
}

// waitPortTool waits for a port in the box to accept connections. The
// probes are connections through the agent (a refused one costs a unix
// socket round trip, no process in the box), at growing intervals.
func waitPortTool(ctx context.Context, c *call, in api.WaitPortInput) (api.WaitPortOutput, error) {
	out := api.WaitPortOutput{Port: in.Port}
	if in.Port < 1 || in.Port > 65535 {
		return out, api.WithCode(api.CodeInvalidInput, fmt.Errorf("port %d is out of range 1-65535", in.Port))
	}
	timeout := time.Duration(cmp.Or(in.TimeoutMs, 30000)) * time.Millisecond
	if in.TimeoutMs < 0 || timeout > maxWaitPort {
		return out, api.WithCode(api.CodeInvalidInput, fmt.Errorf("timeout_ms %d: want 1 to %d", in.TimeoutMs, maxWaitPort.Milliseconds()))
	}
	l, err := c.box(ctx, in.Sandbox)
	if err != nil {
		return out, err
	}
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pause := 5 * time.Millisecond
	for wctx.Err() == nil {
		dctx, dcancel := context.WithTimeout(wctx, 2*time.Second)
		conn, err := l.client.DialPort(dctx, in.Port)
		dcancel()
		if err == nil {
			conn.Close()
			out.Listening = true
			break
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-wctx.Done():
			t.Stop()
		}
		pause = min(pause*2, 250*time.Millisecond)
	}
	out.WaitedMs = time.Since(start).Milliseconds()
	if !out.Listening {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		c.notice(fmt.Sprintf("nothing listened on port %d in this sandbox within %s; is the server started (and listening on 127.0.0.1 or 0.0.0.0)?", in.Port, timeout))
	}
	return out, nil
}

// maxWaitPort bounds wait_port's timeout_ms.
const maxWaitPort = 10 * time.Minute

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
		id = "p" + randomID(16)
		if b.previews == nil {
			b.previews = map[int]string{}
		}
		b.previews[in.Port] = id
		s.previews[id] = previewTarget{box: b.rec.ID, port: in.Port}
		rec = b.record()
	}
	s.mu.Unlock()
	if rec != nil {
		if err := s.st.apply(change{box: rec}); err != nil {
			return out, err
		}
	}
	out.URL, err = PreviewURL(base, id, "/")
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
		c.notice(fmt.Sprintf("nothing listens on port %d in this sandbox yet; the URL works once a server does (start it with shell and background: true, listening on 127.0.0.1 or 0.0.0.0)", in.Port))
	}
	return out, nil
}

// PreviewURL is the address of path in preview id of the server at base:
// http://ID.localhost:PORT/PATH, whatever host base names (a remote user
// reaches it through a tunnel of PORT, as *.localhost resolves locally).
func PreviewURL(base, id, path string) (string, error) {
	u, err := url.Parse(base)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("base URL %q of this server is not a URL: previews need one (see Service.SetBaseURL)", base)
	}
	port := u.Port()
	if port == "" {
		port = "80"
	}
	return fmt.Sprintf("http://%s.localhost:%s%s", id, port, path), nil
}

// PreviewID returns the preview id of a Host header ID.localhost[:port]:
// the origin of a preview, which must never reach the APIs.
func PreviewID(host string) (string, bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	id, rest, ok := strings.Cut(strings.ToLower(host), ".")
	if !ok || rest != "localhost" || !IsPreviewID(id) {
		return "", false
	}
	return id, true
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
	s.mu.Lock()
	t, ok := s.previews[id]
	b := s.boxes[t.box]
	s.mu.Unlock()
	if !ok || b == nil {
		return nil, fmt.Errorf("preview %s: %w", id, ErrNoPreview)
	}
	l, err := s.use(ctx, nil, t.box, b, func(n string) { s.log.Info("preview: "+n, "box", t.box) })
	if err != nil {
		return nil, fmt.Errorf("preview of sandbox %s: %w", t.box, err)
	}
	return &Preview{Box: t.box, Port: t.port, l: l}, nil
}

// IsPreviewID reports whether id has the form of a preview id.
func IsPreviewID(id string) bool { return len(id) == 33 && previewIDRE.MatchString(id) }
