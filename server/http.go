package server

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/httpapi"
	"github.com/cellbox/cellbox/sandbox/previews"
	"github.com/cellbox/cellbox/server/runapi"
	"github.com/cellbox/cellbox/server/webui"
)

// HTTPOptions are the options of a Host's servers (the flags of `cellbox
// serve` and `cellbox run`: AddHTTPFlags). Start from
// DefaultHTTPOptions: a zero field means what the flag's 0 means.
type HTTPOptions struct {
	KeyFile      string        // default DATA/server.key
	AllowedHosts []string      // names besides loopback the server answers to
	BodyTimeout  time.Duration // how long a client may take to send a request body (0: no limit on bodies)
	BodyGrace    time.Duration // how long its first bytes may take
	BodyMinRate  int64         // bytes per second a body must keep up after the grace (0: no minimum)
	IdleTimeout  time.Duration // how long a kept-alive connection may sit idle (0: the default)
	// ShutdownGrace is how long a stop lets requests in flight finish
	// before it ends them (their commands killed) and answers them that
	// the server is shutting down (0: the default).
	ShutdownGrace time.Duration
	// MCPIdleTTL is how long an MCP session of /v1/mcp may go without a
	// request before it is closed and its boxes deleted (0: never).
	MCPIdleTTL time.Duration
}

// DefaultHTTPOptions are the options of the flags' defaults.
func DefaultHTTPOptions() HTTPOptions {
	return HTTPOptions{
		BodyTimeout:   defaultBodyTimeout,
		BodyGrace:     defaultBodyGrace,
		BodyMinRate:   defaultBodyMinRate,
		IdleTimeout:   defaultIdleTimeout,
		ShutdownGrace: defaultShutdownGrace,
		MCPIdleTTL:    httpapi.DefaultMCPIdleTTL,
	}
}

// Defaults of the HTTP limits. A body may be a large upload, so its time is
// generous; what it cuts is a client dribbling a body for ever.
const (
	defaultBodyTimeout = 5 * time.Minute
	// A body must keep up defaultBodyMinRate after its first
	// defaultBodyGrace (as Apache's mod_reqtimeout body=20,MinRate=500):
	// a client dribbling a byte at a time is cut in seconds, an upload at
	// any real rate runs on up to defaultBodyTimeout.
	defaultBodyGrace   = 10 * time.Second
	defaultBodyMinRate = 1024
	defaultIdleTimeout = 2 * time.Minute
	// defaultShutdownGrace is how long a stop lets requests in flight
	// finish.
	defaultShutdownGrace = 10 * time.Second
	headerTimeout        = 10 * time.Second
	maxHeaderBytes       = 64 << 10
)

// hostList is a repeatable flag.
type hostList []string

func (l *hostList) String() string { return strings.Join(*l, ",") }
func (l *hostList) Set(v string) error {
	for _, h := range strings.Split(v, ",") {
		if h = strings.TrimSpace(h); h != "" {
			*l = append(*l, h)
		}
	}
	return nil
}

// AddHTTPFlags adds the flags of HTTPOptions to fs, with the defaults of
// DefaultHTTPOptions.
func AddHTTPFlags(fs *flag.FlagSet) *HTTPOptions {
	o := &HTTPOptions{}
	fs.StringVar(&o.KeyFile, "key-file", "", "file of the server key (default DATA/server.key, made on first start; env "+KeyEnv+" overrides)")
	fs.Var((*hostList)(&o.AllowedHosts), "allowed-host", "a host name (besides localhost and loopback addresses) the server answers to, e.g. a name that reaches it through a proxy; repeatable")
	fs.DurationVar(&o.BodyTimeout, "body-timeout", defaultBodyTimeout, "time a client may take to send a request body, however fast it sends")
	fs.DurationVar(&o.BodyGrace, "body-grace", defaultBodyGrace, "time a request body may take before it must keep up --body-min-rate")
	fs.Int64Var(&o.BodyMinRate, "body-min-rate", defaultBodyMinRate, "bytes per second a request body must arrive at after --body-grace; a slower one is cut (408) (0: no minimum)")
	fs.DurationVar(&o.IdleTimeout, "idle-timeout", defaultIdleTimeout, "time an idle kept-alive connection stays open")
	fs.DurationVar(&o.ShutdownGrace, "shutdown-grace", defaultShutdownGrace, "time a stop lets calls in flight finish; then their commands are ended and they are answered that the server is shutting down")
	fs.DurationVar(&o.MCPIdleTTL, "mcp-idle-ttl", httpapi.DefaultMCPIdleTTL, "close an MCP session of /v1/mcp that had no request this long, and delete its boxes (0: never; --session-ttl, if shorter, applies)")
	return o
}

// Endpoint is a Host's HTTP server on TCP (Host.ServeTCP), listening.
type Endpoint struct {
	// URL is its base URL, http://HOST:PORT (loopback when it listens on
	// every address): the base of previews, and the page's address.
	URL string
	// Key is the server key; KeyCreated says it was just made (the
	// command prints it then).
	Key        string
	KeyCreated bool
	// Stopped reports the server stopping on its own; Host.Close stops
	// it.
	Stopped <-chan error
}

// ServeTCP serves the sandbox service's handler (the tool API, previews),
// the runtime API and the web page together over HTTP on addr (`cellbox
// serve`, `cellbox run`), all behind one guard (see Guard), and sets the
// service's base URL to the address it listens on, so that browse hands
// out URLs that reach this server. It notes that URL in DATA/server.url
// while it serves; h.Close stops it.
func (h *Host) ServeTCP(addr string) (*Endpoint, error) {
	key, created, err := ServerKey(h.KeyPath())
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	hosts := append([]string{host}, h.opts.AllowedHosts...)
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1" // listening on all addresses: this machine's browser uses loopback
	}
	base := "http://" + net.JoinHostPort(host, port)
	h.boxes.SetBaseURL(base)
	// Not a secret (the key is): 0644, and a failure only costs the hint.
	h.urlPath = filepath.Join(h.dataDir, URLFile)
	if err := os.WriteFile(h.urlPath, []byte(base+"\n"), 0o644); err != nil {
		slog.Warn("could not note the server's URL in the data dir", "err", err)
	}
	// One handler of the tool API (its MCP sessions live in it), built on
	// the first request as the page's is: a run with nothing to do exits
	// before it would pay for them (or open the sandbox service).
	boxes := h.boxes.Handler(func(svc *sandbox.Service) http.Handler {
		return httpapi.HandlerWith(svc, httpapi.Options{MCPIdleTTL: TTL(h.opts.MCPIdleTTL)})
	})
	if sh := h.shared; sh != nil {
		var err error
		boxes, err = sh.Serve(h.reqs, key, base, func(ctx context.Context) (*sandbox.Service, error) {
			svc, _, err := h.boxes.Get(ctx)
			return svc, err
		}, boxes)
		if err != nil {
			ln.Close()
			return nil, err
		}
	}
	g := NewGuard(key, hosts, boxes, withRuntimeAPI(boxes, h.api, lazyHandler(webui.Handler)))
	stopped := h.Serve(ln, WithBodyPace(h.opts.Pace(), g))
	return &Endpoint{URL: base, Key: key, KeyCreated: created, Stopped: stopped}, nil
}

// TTL turns a time to live given as a flag (0: never) into one of
// sandbox.Config.SessionTTL or httpapi.Options.MCPIdleTTL (0: the
// default, negative: never).
func TTL(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}

// lazyHandler is the handler build returns, built on its first request.
func lazyHandler(build func() http.Handler) http.Handler {
	get := sync.OnceValue(build)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { get().ServeHTTP(w, r) })
}

// withRuntimeAPI routes the runtime API's paths to api, the web page's
// (GET / and /ui) to page, and everything else (the tool API) to h.
func withRuntimeAPI(h, api, page http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case runapi.Owns(r.URL.Path):
			api.ServeHTTP(w, r)
		case webui.Owns(r.URL.Path) && (r.Method == http.MethodGet || r.Method == http.MethodHead):
			page.ServeHTTP(w, r)
		default:
			h.ServeHTTP(w, r)
		}
	})
}

// Guard is the one gate of everything a Host serves over TCP. In order:
//
//  1. Host must be localhost, a loopback address, the address listened on,
//     a name given with --allowed-host, or a preview host (ID.localhost):
//     a page of a rebinding DNS name (evil.example.com resolving to
//     127.0.0.1) is answered 421.
//  2. A browser's Origin (and Sec-Fetch-Site) must be this very origin: a
//     page of another site, or of a preview, cannot call the APIs (403).
//  3. Preview hosts go to the preview proxy and nothing else, so a page a
//     box serves never shares an origin with the APIs or the web page.
//  4. Everything else needs the server key (Authorization: Bearer KEY),
//     MCP's /v1/mcp included (a session of boxes per MCP session), except
//     /healthz, GET /v1/tools, the page itself (it holds no data), and
//     the session routes /v1/sessions/{id}/... (MCP's too), which check
//     their session's token (DELETE /v1/sessions/{id} takes the key too).
//     Missing: 401; wrong: 403. The page takes the key from its address's
//     fragment (#token=KEY; GET /?token=KEY redirects there) into its
//     origin's localStorage and sends it as Authorization. No cookie
//     carries it: a cookie goes to every port of the host.
//
// A server role that serves a handler of its own over TCP puts it behind
// a Guard (and WithBodyPace) as ServeTCP does.
type Guard struct {
	key     string
	hosts   map[string]bool // allowed host names besides loopback, lowercase
	preview http.Handler
	api     http.Handler
}

// NewGuard guards api and preview with the server key: the preview hosts
// (ID.localhost) go to preview, everything else that passes to api.
// hosts are the names it answers to besides localhost and loopback
// addresses: the address listened on and HTTPOptions.AllowedHosts.
func NewGuard(key string, hosts []string, preview, api http.Handler) *Guard {
	g := &Guard{key: key, hosts: map[string]bool{}, preview: preview, api: api}
	for _, h := range hosts {
		g.hosts[strings.ToLower(strings.Trim(h, "[]"))] = true
	}
	return g
}

func (g *Guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	name, _ := splitHost(r.Host)
	_, isPreview := previews.IDFromHost(r.Host)
	if !isPreview && !g.allowedHost(name) {
		writeGuardError(w, http.StatusMisdirectedRequest, fmt.Sprintf(
			"host %q is not one this server answers to (localhost, loopback addresses, preview hosts ID.localhost); if you reach it by that name on purpose, start it with --allowed-host %s", r.Host, name))
		return
	}
	if origin := r.Header.Get("Origin"); origin != "" && !sameOrigin(origin, r.Host) {
		msg := fmt.Sprintf("origin %s may not call http://%s: browser pages of other origins are refused (open the page of this server, or call it from a client that sends no Origin)", origin, r.Host)
		if _, fromPreview := previews.IDFromHost(hostOf(origin)); fromPreview {
			msg = fmt.Sprintf("origin %s is a preview of a box: pages served from boxes may not call cellbox's APIs", origin)
		}
		writeGuardError(w, http.StatusForbidden, msg)
		return
	}
	if isPreview {
		g.preview.ServeHTTP(w, r)
		return
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site == "cross-site" || site == "same-site" {
		writeGuardError(w, http.StatusForbidden, fmt.Sprintf("a %s request from a browser is refused: only this server's own page may call it", site))
		return
	}
	if open(r) {
		// A session route checks its session's token; the server key, when
		// sent instead, is checked here and passed on, so that the operator
		// may delete any session (httpapi.WithServerKey).
		if key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && g.match(key) {
			r = httpapi.WithServerKey(r)
		}
		g.api.ServeHTTP(w, r)
		return
	}
	if webui.Owns(r.URL.Path) && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		// The page holds no data and needs no key; its script sends the
		// key (from the address's #token=, kept in this origin's
		// localStorage) as Authorization on each API request. A cookie
		// would not do: browsers send cookies to every port of a host, so
		// any other server on localhost would receive the key.
		if t := r.URL.Query().Get("token"); t != "" {
			if !g.match(t) {
				writeGuardError(w, http.StatusForbidden, "wrong token in the page address: open the address `cellbox serve` (or run) printed, page: .../#token=KEY")
				return
			}
			// The key moves to the fragment, which the browser never sends.
			http.Redirect(w, r, r.URL.Path+"#token="+url.PathEscape(t), http.StatusSeeOther)
			return
		}
		g.api.ServeHTTP(w, r)
		return
	}
	key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	switch {
	case !ok || key == "":
		w.Header().Set("WWW-Authenticate", `Bearer realm="cellbox"`)
		writeGuardError(w, http.StatusUnauthorized, fmt.Sprintf(
			"%s %s needs the server key: send Authorization: Bearer KEY (KEY is in DATA/%s of the server, or %s); the web page: open the address the server printed (page: .../#token=KEY)", r.Method, r.URL.Path, KeyFile, KeyEnv))
	case !g.match(key):
		writeGuardError(w, http.StatusForbidden, fmt.Sprintf("%s %s: wrong server key (it is in DATA/%s of the server, or %s)", r.Method, r.URL.Path, KeyFile, KeyEnv))
	default:
		g.api.ServeHTTP(w, r)
	}
}

func (g *Guard) match(key string) bool {
	return subtle.ConstantTimeCompare([]byte(key), []byte(g.key)) == 1
}

func (g *Guard) allowedHost(name string) bool {
	if name == "localhost" || g.hosts[name] {
		return true
	}
	ip := net.ParseIP(name)
	return ip != nil && ip.IsLoopback()
}

// open reports whether r needs no server key: the health check, the tool
// list (the same for everyone), the session routes (their session token
// is checked by the sandbox service), and the old preview path form (it
// only redirects to the preview's own origin).
func open(r *http.Request) bool {
	p := r.URL.Path
	switch {
	case p == "/healthz" && (r.Method == http.MethodGet || r.Method == http.MethodHead),
		p == "/v1/tools" && r.Method == http.MethodGet,
		strings.HasPrefix(p, "/v1/sessions/"),
		strings.HasPrefix(p, "/preview/"):
		return true
	}
	return false
}

// splitHost splits a Host header into its lowercase name (no brackets) and
// port ("80" when none).
func splitHost(hostport string) (name, port string) {
	name, port, err := net.SplitHostPort(hostport)
	if err != nil {
		name, port = hostport, "80"
	}
	return strings.ToLower(strings.Trim(name, "[]")), port
}

// hostOf returns the host[:port] of an origin URL.
func hostOf(origin string) string {
	u, err := url.Parse(origin)
	if err != nil {
		return ""
	}
	return u.Host
}

// sameOrigin reports whether origin is http://host itself.
func sameOrigin(origin, host string) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Scheme != "http" {
		return false
	}
	on, op := splitHost(u.Host)
	hn, hp := splitHost(host)
	return on == hn && op == hp
}

func writeGuardError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// BodyPace is how fast a request body must arrive: its first bytes within
// Grace, then at MinRate bytes a second on average, and the whole of it
// within Max however fast it comes.
type BodyPace struct {
	Grace   time.Duration
	MinRate int64         // 0: no minimum
	Max     time.Duration // 0: no pace at all
}

// Pace is the body pace of the options.
func (o HTTPOptions) Pace() BodyPace {
	return BodyPace{Grace: o.BodyGrace, MinRate: o.BodyMinRate, Max: o.BodyTimeout}
}

// deadline is when a body that started at start and has brought got bytes
// must have brought more: the grace, plus a second for each MinRate bytes
// (mod_reqtimeout's MinRate), never past Max.
func (p BodyPace) deadline(start time.Time, got int64) time.Time {
	d := p.Max
	if p.MinRate > 0 && p.Grace < p.Max {
		d = min(p.Grace+time.Duration(float64(got)/float64(p.MinRate)*float64(time.Second)), p.Max)
	}
	return start.Add(d)
}

// WithBodyPace holds a request's body to p with a read deadline on its
// connection, moved on as the body arrives and lifted once it has (an
// http.Server.ReadTimeout would also cut the connection under a
// long-lived response, such as a watch, and cancel its context). A body
// that falls behind is answered 408, its connection closed.
//
// Hand-written: net/http has only whole-request timeouts, and a reverse
// proxy in front (nginx's client_body_timeout, Apache's mod_reqtimeout)
// is what usually does this; cellbox serves without one.
func WithBodyPace(p BodyPace, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p.Max <= 0 || r.Body == nil || r.Body == http.NoBody {
			h.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		start := time.Now()
		b := &pacedBody{ReadCloser: r.Body, rc: rc, pace: p, start: start, at: p.deadline(start, 0)}
		if rc.SetReadDeadline(b.at) != nil {
			h.ServeHTTP(w, r)
			return
		}
		b.w = &cutWriter{ResponseWriter: w}
		r.Body = b
		h.ServeHTTP(b.w, r)
	})
}

// pacedBody moves its connection's read deadline on as it is read.
type pacedBody struct {
	io.ReadCloser
	rc    *http.ResponseController
	w     *cutWriter
	pace  BodyPace
	start time.Time
	at    time.Time // the deadline set
	got   int64
	done  bool
}

func (b *pacedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if b.done {
		return n, err
	}
	b.got += int64(n)
	switch {
	case err == io.EOF:
		b.rc.SetReadDeadline(time.Time{})
		b.done = true
	case errors.Is(err, os.ErrDeadlineExceeded):
		b.done = true
		b.w.cut(http.StatusRequestTimeout, fmt.Sprintf(
			"request body too slow: %d bytes in %s; a body must start within %s, then keep up %d bytes/s, and end within %s (server flags --body-grace, --body-min-rate, --body-timeout)",
			b.got, time.Since(b.start).Round(time.Millisecond), b.pace.Grace, b.pace.MinRate, b.pace.Max))
	case n > 0:
		// Moved in steps of at least 100 ms: not a syscall per read.
		if at := b.pace.deadline(b.start, b.got); at.Sub(b.at) >= 100*time.Millisecond {
			if b.rc.SetReadDeadline(at) == nil {
				b.at = at
			}
		}
	}
	return n, err
}

// cutWriter lets its handler answer until cut answers in its stead: what
// the handler writes after that is dropped.
type cutWriter struct {
	http.ResponseWriter
	wrote, isCut bool
}

// cut answers status with msg, unless the handler has begun its answer.
func (w *cutWriter) cut(status int, msg string) {
	if w.wrote || w.isCut {
		return
	}
	w.isCut = true
	w.Header().Set("Connection", "close")
	writeGuardError(w.ResponseWriter, status, msg)
}

func (w *cutWriter) WriteHeader(status int) {
	if w.isCut {
		return
	}
	w.wrote = true
	w.ResponseWriter.WriteHeader(status)
}

func (w *cutWriter) Write(p []byte) (int, error) {
	if w.isCut {
		return len(p), nil
	}
	w.wrote = true
	return w.ResponseWriter.Write(p)
}

// Flush is for the handlers that ask for an http.Flusher themselves.
func (w *cutWriter) Flush() {
	if !w.isCut {
		w.wrote = true
		http.NewResponseController(w.ResponseWriter).Flush()
	}
}

// Unwrap gives http.ResponseController the connection's writer (Flush,
// deadlines, Hijack).
func (w *cutWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Serve serves handler on ln until h.Close, with the limits of the
// Host's HTTPOptions and its stop (requests given the shutdown grace,
// then ended; the runtime API's watches ended at once); the channel
// reports the server stopping on its own. ServeUnix and ServeTCP serve
// through it; a server role may serve a handler of its own so (over TCP,
// behind a Guard).
func (h *Host) Serve(ln net.Listener, handler http.Handler) <-chan error {
	idle := h.opts.IdleTimeout
	if idle <= 0 {
		idle = defaultIdleTimeout
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: headerTimeout, IdleTimeout: idle, MaxHeaderBytes: maxHeaderBytes,
		BaseContext: func(net.Listener) context.Context { return h.reqs }}
	srv.RegisterOnShutdown(h.api.Shutdown) // end watches
	h.servers = append(h.servers, srv)
	stopped := make(chan error, 1)
	go func() { stopped <- srv.Serve(ln) }()
	return stopped
}
