package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/cellbox/cellbox/sandbox/api"
)

// Preview URLs. A preview id is an unguessable random id that maps to a box
// and a port; the proxy tunnels each connection through the box's agent
// (agent.Client.DialPort), so it works although the box has no network.
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

var previewIDRE = regexp.MustCompile(`^p[0-9a-f]{32}$`)

// dropPreviewsLocked forgets b's preview ids; the caller holds Service.mu.
func (s *Service) dropPreviewsLocked(b *box) {
	for _, id := range b.previews {
		delete(s.previews, id)
	}
	b.previews = nil
}

func browseTool(ctx context.Context, c *call, in api.BrowseInput) (api.BrowseOutput, error) {
	out := api.BrowseOutput{Port: in.Port}
	if in.Port < 1 || in.Port > 65535 {
		return out, fmt.Errorf("port %d is out of range 1-65535", in.Port)
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
	out.URL, err = previewURL(base, id, "/")
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
		c.notices = append(c.notices, fmt.Sprintf("nothing listens on port %d in this sandbox yet; the URL works once a server does (start it with shell and background: true, listening on 127.0.0.1 or 0.0.0.0)", in.Port))
	}
	return out, nil
}

// previewURL is the address of path in preview id of the server at base:
// http://ID.localhost:PORT/PATH, whatever host base names (a remote user
// reaches it through a tunnel of PORT, as *.localhost resolves locally).
func previewURL(base, id, path string) (string, error) {
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
	if !ok || rest != "localhost" || !previewIDRE.MatchString(id) {
		return "", false
	}
	return id, true
}

// servePreview proxies r to the preview id's box and port.
func (s *Service) servePreview(w http.ResponseWriter, r *http.Request, id string) {
	s.mu.Lock()
	t, ok := s.previews[id]
	b := s.boxes[t.box]
	s.mu.Unlock()
	if !ok || b == nil {
		writeError(w, http.StatusNotFound, "no such preview (the sandbox may have been destroyed or recreated; call browse again)")
		return
	}
	l, err := s.use(r.Context(), nil, t.box, b, func(n string) { s.log.Info("preview: "+n, "box", t.box) })
	if err != nil {
		writeError(w, http.StatusBadGateway, fmt.Sprintf("preview of sandbox %s: %v", t.box, err))
		return
	}
	defer l.release()
	cl := l.client
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = fmt.Sprintf("localhost:%d", t.port)
			pr.Out.Host = pr.Out.URL.Host
			pr.SetXForwarded()
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return cl.DialPort(ctx, t.port)
			},
			DisableKeepAlives: true,
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writeError(w, http.StatusBadGateway, fmt.Sprintf("nothing answered on port %d in sandbox %s: %v (is the server running? see process list)", t.port, t.box, err))
		},
	}
	proxy.ServeHTTP(w, r)
}

// handlePreview answers the old path form /preview/{pid}/{rest...} with a
// redirect to the preview's own origin: it is never served on the API's.
func (s *Service) handlePreview(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("pid")
	if !previewIDRE.MatchString(id) {
		writeError(w, http.StatusNotFound, "no such preview (call browse for a preview URL)")
		return
	}
	_, port, err := net.SplitHostPort(r.Host)
	if err != nil {
		port = "80"
	}
	target, _ := previewURL("http://localhost:"+port, id, "/"+r.PathValue("rest"))
	if r.URL.RawQuery != "" {
		target += "?" + r.URL.RawQuery
	}
	http.Redirect(w, r, target, http.StatusPermanentRedirect)
}
