// Package egress is the host side of a box's network when the box has no
// network of its own: an HTTP forward proxy (plain requests and CONNECT)
// that lets a box reach only the names and addresses of its allow list,
// resolving names on the host and only for allowed names, and that can add
// a header (an API key) to plain HTTP requests to one host, so the key never
// enters the box.
//
// The box side is the agent's forwarder (sandbox/agent, ForwardEgress):
// 127.0.0.1:ProxyPort in the box is piped to SocketName in the box's host
// directory, where a Proxy listens (Listen).
package egress

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/cellbox/cellbox/sandbox/api"
)

// Where the two halves meet.
const (
	// SocketName is the proxy's unix socket in a box's host directory
	// (backend.SocketDir inside the box).
	SocketName = "egress.sock"
	// ProxyPort is the TCP port on the box's loopback the agent forwards
	// to SocketName.
	ProxyPort = 3128
	// SecretEnvPrefix prefixes the server's environment variables that
	// Header.Secret may name: only those, so a rule cannot send any other
	// variable of the server (a cloud credential) to a host of its choice.
	SecretEnvPrefix = "CELLBOX_SECRET_"
	// EnvListen is set in the environment of a box whose network goes
	// through the proxy; the agent (PID 1) forwards that address to
	// SocketName.
	EnvListen = "CELLBOX_EGRESS"
)

// Bounds of a policy (it is stored with its box and checked per request).
const (
	MaxAllow   = 256
	MaxHeaders = 32
	MaxValue   = 8 << 10
)

// ProxyEnv is the environment a box whose network goes through the proxy
// gets: the usual proxy variables (curl, pip, npm, git, Python, Go read
// them), with the box's own loopback left direct.
func ProxyEnv() map[string]string {
	u := "http://127.0.0.1:" + strconv.Itoa(ProxyPort)
	no := "localhost,127.0.0.1,::1"
	return map[string]string{
		EnvListen:    "127.0.0.1:" + strconv.Itoa(ProxyPort),
		"HTTP_PROXY": u, "HTTPS_PROXY": u, "ALL_PROXY": u, "NO_PROXY": no,
		"http_proxy": u, "https_proxy": u, "all_proxy": u, "no_proxy": no,
	}
}

// Header is a header the proxy sets on plain HTTP requests to Host (a name
// or an IP, "*.example.org" for its subdomains). Exactly one of Value and
// Secret is set: Secret names SecretEnvPrefix+Secret in the server's
// environment, read at each request. TLS upgrades those requests: the box
// sends http://Host/..., the proxy adds the header and sends the request to
// https://Host/... (port 443 unless the URL names one), verifying the
// certificate — the way to give a key to an HTTPS API, whose CONNECT
// tunnels the proxy cannot (and does not) look into.
type Header struct {
	Host   string `json:"host"`
	Header string `json:"header"`
	Value  string `json:"value,omitempty"`
	Secret string `json:"secret,omitempty"`
	TLS    bool   `json:"tls,omitempty"`
}

// Policy is a compiled allow list with its headers. The zero Policy (and a
// nil one) allows nothing.
type Policy struct {
	rules   []rule
	headers []Header
}

// rule is one entry of an allow list: a name pattern or a prefix, and a
// port (0: any).
type rule struct {
	text   string
	name   string // "example.org", "*.example.org", "*"; "" for a prefix
	prefix netip.Prefix
	port   int
}

var (
	// The lengths are checked beside labelRE and secretRE, not by counted
	// repetitions, which compile to large programs at every start.
	labelRE = regexp.MustCompile(`^[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?$`)
	// framingHeaders are the headers an inject rule may not name: the
	// request line's host, the body's framing and the hop-by-hop ones,
	// which the proxy (net/http) writes itself and drops from a rule.
	framingHeaders = []string{"Host", "Content-Length", "Transfer-Encoding", "Trailer", "Te", "Connection", "Keep-Alive", "Proxy-Connection", "Upgrade"}
	headerRE       = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
	secretRE       = regexp.MustCompile(`^[A-Za-z0-9_]+$`)
)

// CompileRules compiles the rules of a box's network as the tools and
// patterns give them (api.NetworkRules).
func CompileRules(r api.NetworkRules) (*Policy, error) {
	hs := make([]Header, len(r.Inject))
	for i, in := range r.Inject {
		hs[i] = Header{Host: in.Host, Header: in.Header, Value: in.Value, Secret: in.Secret, TLS: in.TLS}
	}
	return Compile(r.Allow, hs)
}

// Compile checks an allow list and its headers and compiles them. Allow
// entries are a name ("example.org"), a wildcard ("*.example.org": its
// subdomains; "*": any name), an IP or a CIDR ("10.1.2.0/24"), each with
// an optional port ("example.org:443", "10.1.2.0/24:8080", "[::1]:80").
func Compile(allow []string, headers []Header) (*Policy, error) {
	p := &Policy{}
	var errs []string
	if len(allow) > MaxAllow || len(headers) > MaxHeaders {
		return nil, fmt.Errorf("network: %d allow entries and %d inject rules; at most %d and %d (use wildcards and CIDRs)", len(allow), len(headers), MaxAllow, MaxHeaders)
	}
	for _, a := range allow {
		r, err := parseRule(a)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		p.rules = append(p.rules, r)
	}
	for i, h := range headers {
		h.Host = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(h.Host)), ".")
		switch {
		case h.Host == "" || (!validName(h.Host) && !validIP(h.Host)):
			errs = append(errs, fmt.Sprintf("inject[%d]: host %q: want a name (api.example.org, *.example.org) or an IP", i, h.Host))
		case !headerRE.MatchString(h.Header):
			errs = append(errs, fmt.Sprintf("inject[%d]: header %q: want an HTTP header name (Authorization, X-Api-Key)", i, h.Header))
		case slices.Contains(framingHeaders, http.CanonicalHeaderKey(h.Header)):
			errs = append(errs, fmt.Sprintf("inject[%d]: header %q frames the request or its connection, which the proxy sets itself (it would never be sent); inject an application header (Authorization, X-Api-Key)", i, h.Header))
		case (h.Value == "") == (h.Secret == ""):
			errs = append(errs, fmt.Sprintf("inject[%d]: give exactly one of value and secret", i))
		case len(h.Value) > MaxValue:
			errs = append(errs, fmt.Sprintf("inject[%d]: value has %d bytes; at most %d", i, len(h.Value), MaxValue))
		case strings.ContainsAny(h.Value, "\r\n\x00"):
			errs = append(errs, fmt.Sprintf("inject[%d]: value holds a line break or NUL", i))
		case h.Secret != "" && (len(h.Secret) > 64 || !secretRE.MatchString(h.Secret)):
			errs = append(errs, fmt.Sprintf("inject[%d]: secret %q: want 1-64 letters, digits or '_' (the server reads %sNAME)", i, h.Secret, SecretEnvPrefix))
		}
		p.headers = append(p.headers, h)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("network: %s", strings.Join(errs, "; "))
	}
	return p, nil
}

func parseRule(text string) (rule, error) {
	r := rule{text: text}
	s := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(text)), ".")
	bad := func(why string) (rule, error) {
		return rule{}, fmt.Errorf("allow %q: %s (want example.org, *.example.org, 10.1.2.0/24 or 1.2.3.4, each optionally with :PORT)", text, why)
	}
	switch {
	case s == "":
		return bad("empty")
	case strings.Contains(s, "://"):
		if u, err := url.Parse(strings.TrimSpace(text)); err == nil && u.Host != "" {
			return bad("a URL; give its host: " + strconv.Quote(u.Host))
		}
		return bad("a URL; give its host only")
	case strings.HasSuffix(strings.TrimSpace(text), "*."):
		return bad("a wildcard needs a domain (*.example.org), or * for any name")
	}
	host := s
	if h, p, err := net.SplitHostPort(s); err == nil {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return bad("port " + strconv.Quote(p) + " is not 1-65535")
		}
		host, r.port = h, n
	} else if i := strings.LastIndex(s, ":"); i >= 0 && strings.Contains(s, "/") && i > strings.Index(s, "/") {
		// A CIDR with a port: 10.0.0.0/8:443 (SplitHostPort wants brackets).
		n, err := strconv.Atoi(s[i+1:])
		if err != nil || n < 1 || n > 65535 {
			return bad("port " + strconv.Quote(s[i+1:]) + " is not 1-65535")
		}
		host, r.port = s[:i], n
	}
	if strings.Contains(host, "/") {
		pfx, err := netip.ParsePrefix(host)
		if err != nil {
			return bad("not a CIDR: " + err.Error())
		}
		r.prefix = pfx.Masked()
		return r, nil
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		if addr.Unmap().IsUnspecified() {
			return bad("the unspecified address reaches every address of the host, cellbox's API included; name the service: 127.0.0.1:PORT")
		}
		r.prefix = netip.PrefixFrom(addr.Unmap(), addr.Unmap().BitLen())
		return r, nil
	}
	if !validName(host) {
		return bad("not a host name")
	}
	r.name = host
	return r, nil
}

// Warnings says which allow entries open more than their authors may
// mean: a loopback address with no port opens every service of this
// machine's loopback to the box, cellbox's own API among them.
func (p *Policy) Warnings() []string {
	var out []string
	if p == nil {
		return nil
	}
	for _, r := range p.rules {
		if r.name == "" && r.port == 0 && r.prefix.IsSingleIP() && r.prefix.Addr().IsLoopback() {
			a := r.prefix.Addr().String()
			if r.prefix.Addr().Is6() {
				a = "[" + a + "]"
			}
			out = append(out, fmt.Sprintf("allow %q opens every port of this machine's loopback to the box, the cellbox API's and any local database's included; to open one service, name its port (%s:8080)", r.text, a))
		}
	}
	return out
}

func validIP(s string) bool { _, err := netip.ParseAddr(s); return err == nil }

// validName accepts a DNS name, "*.name" or "*".
func validName(s string) bool {
	if s == "*" {
		return true
	}
	s = strings.TrimPrefix(s, "*.")
	if len(s) > 253 {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if len(l) > 63 || !labelRE.MatchString(l) {
			return false
		}
	}
	return true
}

// matchName reports whether the name pattern pat matches host.
func matchName(pat, host string) bool {
	switch {
	case pat == "*":
		return true
	case strings.HasPrefix(pat, "*."):
		return strings.HasSuffix(host, pat[1:])
	}
	return pat == host
}

// MissingSecrets says which secrets the headers name that the server's
// environment lacks (checked when a rule is set; a restarted server whose
// environment lost one still loads the policy, and refuses the requests).
func (p *Policy) MissingSecrets() error {
	var errs []string
	for _, h := range p.headers {
		if _, ok := os.LookupEnv(SecretEnvPrefix + h.Secret); h.Secret != "" && !ok {
			errs = append(errs, fmt.Sprintf("secret %q: the server has no %s%s in its environment; set it where cellbox serve starts", h.Secret, SecretEnvPrefix, h.Secret))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("network: %s", strings.Join(errs, "; "))
	}
	return nil
}

// Allow lists the policy's allow entries as given.
func (p *Policy) Allow() []string {
	if p == nil {
		return nil
	}
	out := make([]string, len(p.rules))
	for i, r := range p.rules {
		out[i] = r.text
	}
	return out
}

// nameAllowed reports whether a name rule admits host:port.
func (p *Policy) nameAllowed(host string, port int) bool {
	return p != nil && slices.ContainsFunc(p.rules, func(r rule) bool {
		return r.name != "" && matchName(r.name, host) && (r.port == 0 || r.port == port)
	})
}

// addrAllowed reports whether an IP rule admits addr:port. The host
// itself (loopback, where cellbox's own API listens) and link-local
// addresses (cloud metadata at 169.254.169.254) are admitted only by a
// rule that names the very address, never by a range: "0.0.0.0/0", the
// usual way to write "any IPv4 address", must not open them.
func (p *Policy) addrAllowed(addr netip.Addr, port int) bool {
	addr = addr.Unmap()
	exactOnly := addr.IsLoopback() || addr.IsLinkLocalUnicast() || addr.IsUnspecified()
	return p != nil && slices.ContainsFunc(p.rules, func(r rule) bool {
		return r.name == "" && r.prefix.Contains(addr) && (r.port == 0 || r.port == port) &&
			(!exactOnly || r.prefix.IsSingleIP())
	})
}

// headersFor returns the headers to set on a request to host, resolving
// secrets, and whether a rule upgrades it to TLS; an error names a secret
// the server no longer has.
func (p *Policy) headersFor(host string) (out [][2]string, upgrade bool, err error) {
	if p == nil {
		return nil, false, nil
	}
	for _, h := range p.headers {
		if !matchName(h.Host, host) {
			continue
		}
		upgrade = upgrade || h.TLS
		v := h.Value
		if h.Secret != "" {
			var ok bool
			if v, ok = os.LookupEnv(SecretEnvPrefix + h.Secret); !ok {
				return nil, false, fmt.Errorf("the rule injecting %s for %s names secret %q, and the server has no %s%s in its environment any more", h.Header, h.Host, h.Secret, SecretEnvPrefix, h.Secret)
			}
		}
		out = append(out, [2]string{h.Header, v})
	}
	return out, upgrade, nil
}

// internal reports whether addr is one a name may not resolve to unless an
// IP rule allows it: the host's own and private networks (loopback,
// RFC 1918, CGNAT, link-local with cloud metadata, ULA, unspecified,
// multicast). Without this, any allowed name whose DNS its owner controls
// could be pointed at 127.0.0.1 and reach the host's own services.
func internal(addr netip.Addr) bool {
	addr = addr.Unmap()
	return addr.IsLoopback() || addr.IsPrivate() || addr.IsLinkLocalUnicast() ||
		addr.IsLinkLocalMulticast() || addr.IsInterfaceLocalMulticast() || addr.IsMulticast() ||
		addr.IsUnspecified() || cgnat.Contains(addr) || thisNet.Contains(addr) || !addr.IsGlobalUnicast()
}

var (
	cgnat   = netip.MustParsePrefix("100.64.0.0/10")
	thisNet = netip.MustParsePrefix("0.0.0.0/8")
)
