package httpapi

// The preview proxy. A preview (made by the browse tool) is served on an
// origin of its own, http://ID.localhost:PORT/, never on the API's, so a
// page a box serves cannot call the APIs with the browser's blessing; the
// old path form /preview/ID/... only redirects there. Each request leases
// the preview's box (sandbox.Service.OpenPreview, which wakes it) and
// reaches the port inside through the box's agent, so it works although
// the box has no network.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"

	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/previews"
)

// servePreview proxies r to the preview id's box and port.
func (s *server) servePreview(w http.ResponseWriter, r *http.Request, id string) {
	p, err := s.svc.OpenPreview(r.Context(), id)
	switch {
	case errors.Is(err, sandbox.ErrNoPreview):
		writeError(w, http.StatusNotFound, "no such preview (the sandbox may have been destroyed or recreated; call browse again)")
		return
	case err != nil:
		writeError(w, http.StatusBadGateway, err.Error())
		return
	}
	defer p.Release()
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = fmt.Sprintf("localhost:%d", p.Port)
			pr.Out.Host = pr.Out.URL.Host
			pr.SetXForwarded()
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return p.Dial(ctx)
			},
			DisableKeepAlives: true,
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writeError(w, http.StatusBadGateway, fmt.Sprintf("nothing answered on port %d in sandbox %s: %v (is the server running? see process list)", p.Port, p.Box, err))
		},
	}
	proxy.ServeHTTP(w, r)
}

// handlePreview answers the old path form /preview/{pid}/{rest...} with a
// redirect to the preview's own origin: it is never served on the API's.
func (s *server) handlePreview(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("pid")
	if !previews.IsID(id) {
		writeError(w, http.StatusNotFound, "no such preview (call browse for a preview URL)")
		return
	}
	_, port, err := net.SplitHostPort(r.Host)
	if err != nil {
		port = "80"
	}
	target, _ := previews.URL("http://localhost:"+port, id, "/"+r.PathValue("rest"))
	if r.URL.RawQuery != "" {
		target += "?" + r.URL.RawQuery
	}
	http.Redirect(w, r, target, http.StatusPermanentRedirect)
}
