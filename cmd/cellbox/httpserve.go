package main

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/cellbox/cellbox/internal/runapi"
	"github.com/cellbox/cellbox/internal/webui"
	"github.com/cellbox/cellbox/sandbox"
)

// serveHTTP serves the sandbox service's handler (the tool API, preview
// URLs), the runtime API and the web page together over HTTP on addr (`cellbox serve`,
// `cellbox run`), and sets the service's base URL to the address it
// listens on, so that browse hands out URLs that reach this server. It
// returns that URL and a channel that reports the server stopping on its
// own; h.close stops it.
func (h *runtimeHost) serveHTTP(addr string, svc *sandbox.Service) (base string, stopped <-chan error, err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1" // listening on all addresses: this machine's browser uses loopback
	}
	base = "http://" + net.JoinHostPort(host, port)
	svc.SetBaseURL(base)
	return base, h.start(ln, withRuntimeAPI(svc.Handler(), h.api, webui.Handler())), nil
}

// withRuntimeAPI routes the runtime API's paths to api, the web page's
// (GET / and /ui) to page, and everything else (the tool API, previews:
// preview hosts are *.localhost) to h.
func withRuntimeAPI(h, api, page http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.Host)
		if err != nil {
			host = r.Host
		}
		switch {
		case strings.HasSuffix(host, ".localhost"):
			h.ServeHTTP(w, r)
		case runapi.Owns(r.URL.Path):
			api.ServeHTTP(w, r)
		case webui.Owns(r.URL.Path) && (r.Method == http.MethodGet || r.Method == http.MethodHead):
			page.ServeHTTP(w, r)
		default:
			h.ServeHTTP(w, r)
		}
	})
}

// start serves handler on ln until h.close; the channel reports the
// server stopping on its own.
func (h *runtimeHost) start(ln net.Listener, handler http.Handler) <-chan error {
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	srv.RegisterOnShutdown(h.api.Shutdown) // end watches
	h.servers = append(h.servers, srv)
	stopped := make(chan error, 1)
	go func() { stopped <- srv.Serve(ln) }()
	return stopped
}
