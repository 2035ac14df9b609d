package egress

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cellbox/cellbox/internal/netpipe"
)

// Resolver resolves names; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Options configure a Proxy.
type Options struct {
	// Box names the box in logs and refusals.
	Box string
	// Policy returns the box's current policy, read at each connection so
	// a change applies to the next one; nil allows nothing.
	Policy func() *Policy
	// Resolver defaults to net.DefaultResolver.
	Resolver Resolver
	// Logger defaults to slog.Default(). Header values are never logged.
	Logger *slog.Logger
	// RootCAs verify upstreams of Header.TLS rules; nil: the host's.
	RootCAs *x509.CertPool
	// MaxConns bounds the box's connections open at once (each holds a
	// descriptor or two on the host); more wait until one ends. Default
	// DefaultMaxConns.
	MaxConns int
}

// DefaultMaxConns is Options.MaxConns's default.
const DefaultMaxConns = 256

// Proxy is one box's egress proxy: an HTTP forward proxy that speaks
// plain requests (absolute URLs) and CONNECT.
type Proxy struct {
	opts   Options
	srv    *http.Server
	rp     *httputil.ReverseProxy
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // tunnels
}

// dialTimeout bounds a name lookup and a connection to a destination.
const dialTimeout = 15 * time.Second

type targetKey struct{}

// New makes a proxy; Serve runs it.
func New(opts Options) *Proxy {
	if opts.Resolver == nil {
		opts.Resolver = net.DefaultResolver
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = DefaultMaxConns
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{opts: opts, ctx: ctx, cancel: cancel}
	tr := &http.Transport{
		Proxy: nil,
		// Each request dials the address decide checked (carried in its
		// context), never the name again: a second lookup could answer
		// another address (DNS rebinding). No pooling, so a connection made
		// under an older policy is never reused under a newer one.
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			to, _ := ctx.Value(targetKey{}).(netip.AddrPort)
			return dial(ctx, to)
		},
		DisableKeepAlives:     true,
		ResponseHeaderTimeout: 5 * time.Minute,
		TLSClientConfig:       &tls.Config{RootCAs: opts.RootCAs, MinVersion: tls.VersionTLS12},
	}
	p.rp = &httputil.ReverseProxy{
		Transport: tr,
		Rewrite:   func(*httputil.ProxyRequest) {}, // set per request in serveHTTP
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			p.refuse(w, http.StatusBadGateway, fmt.Sprintf("cellbox egress: %s: %v", r.URL.Host, err))
		},
	}
	p.srv = &http.Server{
		Handler:           http.HandlerFunc(p.serveHTTP),
		ReadHeaderTimeout: time.Minute,
		IdleTimeout:       2 * time.Minute, // an idle keep-alive gives its slot back
		ErrorLog:          slog.NewLogLogger(opts.Logger.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	return p
}

// Serve answers connections on ln until Close.
func (p *Proxy) Serve(ln net.Listener) error {
	err := p.srv.Serve(&limitListener{Listener: ln, ctx: p.ctx, slots: make(chan struct{}, p.opts.MaxConns)})
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops the proxy and ends its tunnels.
func (p *Proxy) Close() error {
	p.cancel()
	err := p.srv.Close()
	p.wg.Wait()
	return err
}

func dial(ctx context.Context, to netip.AddrPort) (net.Conn, error) {
	if !to.IsValid() {
		return nil, errors.New("no checked destination")
	}
	d := net.Dialer{Timeout: dialTimeout}
	return d.DialContext(ctx, "tcp", to.String())
}

// denied is a destination the policy refuses; its message says what rule
// would admit it.
type denied struct{ msg string }

func (d *denied) Error() string { return d.msg }

// decide checks host:port against the policy and returns the address to
// connect to. A name must match a name rule and is then resolved here (the
// box has no DNS); an address a name resolves to that is internal (see
// internal) must also match an IP rule. An IP must match an IP rule.
func (p *Proxy) decide(ctx context.Context, pol *Policy, host string, port int) (netip.AddrPort, error) {
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	dest := net.JoinHostPort(host, strconv.Itoa(port))
	if pol == nil || len(pol.rules) == 0 {
		entries, _ := json.Marshal(allowEntries(host, port))
		return netip.AddrPort{}, &denied{fmt.Sprintf("cellbox egress: %s refused: box %q has no network access (its allow list is empty); allow it with network_set {\"allow\": %s}", dest, p.opts.Box, entries)}
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		if !pol.addrAllowed(addr, port) {
			return netip.AddrPort{}, &denied{fmt.Sprintf("cellbox egress: %s refused: no rule of box %q allows this address (allow: %q); %s with network_set", dest, p.opts.Box, pol.Allow(), addHint(host, port))}
		}
		return netip.AddrPortFrom(addr.Unmap(), uint16(port)), nil
	}
	if !pol.nameAllowed(host, port) {
		return netip.AddrPort{}, &denied{fmt.Sprintf("cellbox egress: %s refused: no rule of box %q allows this name (allow: %q); %s with network_set", dest, p.opts.Box, pol.Allow(), addHint(host, port))}
	}
	lctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	addrs, err := p.opts.Resolver.LookupNetIP(lctx, "ip", host)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("cellbox egress: resolve %s: %w", host, err)
	}
	var inner []string
	for _, a := range addrs {
		a = a.Unmap()
		if internal(a) && !pol.addrAllowed(a, port) {
			inner = append(inner, a.String())
			continue
		}
		return netip.AddrPortFrom(a, uint16(port)), nil
	}
	if len(inner) == 0 {
		return netip.AddrPort{}, fmt.Errorf("cellbox egress: %s has no address", host)
	}
	return netip.AddrPort{}, &denied{fmt.Sprintf("cellbox egress: %s refused: %s resolves to %s, a loopback, private or link-local address; an allowed name may reach such an address only if the address is allowed too (else any name's DNS could point the box at this host's own services): %s with network_set", dest, host, strings.Join(inner, ", "), addHint(inner[0], port))}
}

// allowEntry is the allow-list entry a refusal proposes for host:port (a
// valid Compile entry, tested): a loopback, private or link-local address
// only with its port, since allowing a whole 127.0.0.1 opens every service
// of the host, cellbox's own API among them (docs/security.md); a public
// address or a name without one.
func allowEntry(host string, port int) string {
	if addr, err := netip.ParseAddr(host); err == nil {
		addr = addr.Unmap().WithZone("")
		if internal(addr) {
			return net.JoinHostPort(addr.String(), strconv.Itoa(port))
		}
		return addr.String()
	}
	return host
}

// allowEntries are the allow-list entries a refusal of host:port proposes:
// allowEntry's, and for a name that is always loopback (localhost,
// *.localhost: RFC 6761) the loopback address with the port too, without
// which the name would be refused again as it resolves there. (A name is
// not resolved to find out: a box would have the host look up any name it
// asks for, a channel out through DNS.)
func allowEntries(host string, port int) []string {
	entries := []string{allowEntry(host, port)}
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		entries = append(entries, allowEntry("127.0.0.1", port))
	}
	return entries
}

// addHint is the "add …" part of a refusal: the entries of allowEntries,
// and for a name or a public address the narrower host:port too.
func addHint(host string, port int) string {
	if es := allowEntries(host, port); len(es) > 1 {
		return fmt.Sprintf("add %q and %q (a name that is always loopback needs its address too, with the port)", es[0], es[1])
	}
	e := allowEntry(host, port)
	if _, _, err := net.SplitHostPort(e); err == nil {
		return fmt.Sprintf("add %q (with its port: the whole address would open every service there, on loopback cellbox's own API too)", e)
	}
	cidr := ""
	if _, err := netip.ParseAddr(e); err == nil {
		cidr = " or a CIDR holding it"
	}
	return fmt.Sprintf("add %q%s, or %q for this port only,", e, cidr, net.JoinHostPort(e, strconv.Itoa(port)))
}

// refuse answers a request the proxy will not forward.
func (p *Proxy) refuse(w http.ResponseWriter, code int, msg string) {
	p.opts.Logger.Info("egress refused", "box", p.opts.Box, "status", code, "why", msg)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Cellbox-Egress", "refused")
	w.Header().Set("Connection", "close")
	w.WriteHeader(code)
	io.WriteString(w, msg+"\n")
}

func (p *Proxy) fail(w http.ResponseWriter, err error) {
	var d *denied
	if errors.As(err, &d) {
		p.refuse(w, http.StatusForbidden, d.msg)
		return
	}
	p.refuse(w, http.StatusBadGateway, err.Error())
}

func (p *Proxy) serveHTTP(w http.ResponseWriter, r *http.Request) {
	pol := p.opts.Policy()
	if r.Method == http.MethodConnect {
		p.connect(w, r, pol)
		return
	}
	if !r.URL.IsAbs() || r.URL.Scheme != "http" || r.URL.Host == "" {
		p.refuse(w, http.StatusBadRequest, fmt.Sprintf("cellbox egress: %s %s: this is an HTTP proxy: send http:// URLs in full, and https through CONNECT (HTTPS_PROXY does this)", r.Method, r.URL))
		return
	}
	host := strings.TrimSuffix(strings.ToLower(r.URL.Hostname()), ".")
	headers, upgrade, err := pol.headersFor(host)
	if err != nil {
		p.refuse(w, http.StatusBadGateway, "cellbox egress: "+err.Error())
		return
	}
	port := 80
	if upgrade {
		port = 443
	}
	if ps := r.URL.Port(); ps != "" {
		n, err := strconv.Atoi(ps)
		if err != nil || n < 1 || n > 65535 {
			p.refuse(w, http.StatusBadRequest, fmt.Sprintf("cellbox egress: %s: bad port", r.URL.Host))
			return
		}
		port = n
	}
	to, err := p.decide(r.Context(), pol, host, port)
	if err != nil {
		p.fail(w, err)
		return
	}
	rp := *p.rp
	rp.Rewrite = func(pr *httputil.ProxyRequest) {
		pr.Out.Host = "" // the URL's host: the one that was checked
		pr.Out.RequestURI = ""
		if upgrade {
			u := *pr.Out.URL
			u.Scheme, u.Host = "https", net.JoinHostPort(host, strconv.Itoa(port))
			pr.Out.URL = &u
		}
		for _, h := range headers {
			pr.Out.Header.Set(h[0], h[1])
		}
	}
	rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), targetKey{}, to)))
}

// connect answers CONNECT: a byte tunnel to an allowed destination (TLS,
// end to end between the box and the destination; no header is injected).
func (p *Proxy) connect(w http.ResponseWriter, r *http.Request, pol *Policy) {
	host, ps, err := net.SplitHostPort(r.Host)
	port, perr := strconv.Atoi(ps)
	if err != nil || perr != nil || port < 1 || port > 65535 {
		p.refuse(w, http.StatusBadRequest, fmt.Sprintf("cellbox egress: CONNECT %q: want HOST:PORT", r.Host))
		return
	}
	to, err := p.decide(r.Context(), pol, host, port)
	if err != nil {
		p.fail(w, err)
		return
	}
	up, err := dial(r.Context(), to)
	if err != nil {
		p.refuse(w, http.StatusBadGateway, fmt.Sprintf("cellbox egress: connect to %s (%s): %v", r.Host, to, err))
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		up.Close()
		p.refuse(w, http.StatusInternalServerError, "cellbox egress: cannot take over the connection: "+err.Error())
		return
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer conn.Close()
		defer up.Close()
		if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
			return
		}
		stop := context.AfterFunc(p.ctx, func() { conn.Close(); up.Close() })
		defer stop()
		netpipe.Pipe(conn, brw.Reader, up)
	}()
}

// limitListener accepts a connection only when one of its slots is free;
// the connection's Close frees it (also after a hijack: the tunnel closes
// the connection it took over).
type limitListener struct {
	net.Listener
	ctx   context.Context // ends at Close: a waiting Accept gives up
	slots chan struct{}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.ctx.Done():
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &slotConn{Conn: c, free: sync.OnceFunc(func() { <-l.slots })}, nil
}

type slotConn struct {
	net.Conn
	free func()
}

// CloseWrite passes a half-close on (a tunnel's end of one direction).
func (c *slotConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.free()
	return err
}

// Listen makes the proxy's socket for a box and puts it at
// hostDir/SocketName. hostDir is the box's: the box can write there, so the
// socket is made in staging (a directory only the host writes), given its
// mode there, and renamed into hostDir, which replaces whatever the box
// left at that name (rename follows no link). The socket is 0666: the box
// user must connect to it, and hostDir is what guards it, as it guards the
// agent's socket.
func Listen(staging, hostDir string) (net.Listener, error) {
	// A short name: the path must fit a unix socket's 107 bytes wherever
	// the box's own socket path does.
	var rnd [4]byte
	rand.Read(rnd[:])
	tmp := filepath.Join(staging, "e"+hex.EncodeToString(rnd[:]))
	ln, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, fmt.Errorf("egress proxy: listen: %w", err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o666); err != nil {
		ln.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("egress proxy: chmod socket: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(hostDir, SocketName)); err != nil {
		ln.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("egress proxy: place socket in the box's host dir: %w", err)
	}
	return ln, nil
}
