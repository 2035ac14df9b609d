package api

import (
	"fmt"
	"net"
	"net/netip"
	"net/textproto"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Bounds of a box's network rules (they are stored with the box and
// checked at each request).
const (
	MaxAllow       = 256
	MaxInject      = 32
	MaxInjectValue = 8 << 10
)

// SecretEnvPrefix prefixes the server's environment variables an Inject's
// Secret may name: only those, so a rule cannot send any other variable of
// the server (a cloud credential) to a host of its choice.
const SecretEnvPrefix = "CELLBOX_SECRET_"

// AllowEntry is one entry of an allow list, parsed: a name pattern or an
// address prefix, and a port.
type AllowEntry struct {
	Text   string       // as given
	Name   string       // "example.org", "*.example.org", "*"; "" for an address
	Prefix netip.Prefix // an IP or a CIDR, masked; zero for a name
	Port   int          // 0: any
}

var (
	// The lengths are checked beside labelRE and secretRE, not by counted
	// repetitions, which compile to large programs at every start.
	labelRE = regexp.MustCompile(`^[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?$`)
	// framingHeaders are the headers an inject rule may not name: the
	// request line's host, the body's framing and the hop-by-hop ones,
	// which the egress proxy (net/http) writes itself and drops from a
	// rule.
	framingHeaders = []string{"Host", "Content-Length", "Transfer-Encoding", "Trailer", "Te", "Connection", "Keep-Alive", "Proxy-Connection", "Upgrade"}
	headerRE       = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
	secretRE       = regexp.MustCompile(`^[A-Za-z0-9_]+$`)
)

// Check checks the rules as the egress proxy applies them and returns the
// allow entries parsed and the inject rules with their hosts normalized
// (lower case, no final dot); the error names every problem. Allow entries
// are a name ("example.org"), a wildcard ("*.example.org": its subdomains;
// "*": any name), an IP or a CIDR ("10.1.2.0/24"), each with an optional
// port ("example.org:443", "10.1.2.0/24:8080", "[::1]:80"). The egress
// proxy compiles a box's rules with it (sandbox/egress), and the pattern
// compiler checks a pattern's.
func (r NetworkRules) Check() ([]AllowEntry, []Inject, error) {
	if len(r.Allow) > MaxAllow || len(r.Inject) > MaxInject {
		return nil, nil, fmt.Errorf("network: %d allow entries and %d inject rules; at most %d and %d (use wildcards and CIDRs)", len(r.Allow), len(r.Inject), MaxAllow, MaxInject)
	}
	var (
		allow  []AllowEntry
		inject []Inject
		errs   []string
	)
	for _, a := range r.Allow {
		e, err := ParseAllow(a)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		allow = append(allow, e)
	}
	for i, h := range r.Inject {
		h.Host = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(h.Host)), ".")
		switch {
		case h.Host == "" || (!validName(h.Host) && !validIP(h.Host)):
			errs = append(errs, fmt.Sprintf("inject[%d]: host %q: want a name (api.example.org, *.example.org) or an IP", i, h.Host))
		case !headerRE.MatchString(h.Header):
			errs = append(errs, fmt.Sprintf("inject[%d]: header %q: want an HTTP header name (Authorization, X-Api-Key)", i, h.Header))
		case slices.Contains(framingHeaders, textproto.CanonicalMIMEHeaderKey(h.Header)):
			errs = append(errs, fmt.Sprintf("inject[%d]: header %q frames the request or its connection, which the proxy sets itself (it would never be sent); inject an application header (Authorization, X-Api-Key)", i, h.Header))
		case (h.Value == "") == (h.Secret == ""):
			errs = append(errs, fmt.Sprintf("inject[%d]: give exactly one of value and secret", i))
		case len(h.Value) > MaxInjectValue:
			errs = append(errs, fmt.Sprintf("inject[%d]: value has %d bytes; at most %d", i, len(h.Value), MaxInjectValue))
		case strings.ContainsAny(h.Value, "\r\n\x00"):
			errs = append(errs, fmt.Sprintf("inject[%d]: value holds a line break or NUL", i))
		case h.Secret != "" && (len(h.Secret) > 64 || !secretRE.MatchString(h.Secret)):
			errs = append(errs, fmt.Sprintf("inject[%d]: secret %q: want 1-64 letters, digits or '_' (the server reads %sNAME)", i, h.Secret, SecretEnvPrefix))
		}
		inject = append(inject, h)
	}
	if len(errs) > 0 {
		return nil, nil, fmt.Errorf("network: %s", strings.Join(errs, "; "))
	}
	return allow, inject, nil
}

// ParseAllow parses one entry of an allow list (see NetworkRules.Check).
func ParseAllow(text string) (AllowEntry, error) {
	r := AllowEntry{Text: text}
	s := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(text)), ".")
	bad := func(why string) (AllowEntry, error) {
		return AllowEntry{}, fmt.Errorf("allow %q: %s (want example.org, *.example.org, 10.1.2.0/24 or 1.2.3.4, each optionally with :PORT)", text, why)
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
		host, r.Port = h, n
	} else if i := strings.LastIndex(s, ":"); i >= 0 && strings.Contains(s, "/") && i > strings.Index(s, "/") {
		// A CIDR with a port: 10.0.0.0/8:443 (SplitHostPort wants brackets).
		n, err := strconv.Atoi(s[i+1:])
		if err != nil || n < 1 || n > 65535 {
			return bad("port " + strconv.Quote(s[i+1:]) + " is not 1-65535")
		}
		host, r.Port = s[:i], n
	}
	if strings.Contains(host, "/") {
		pfx, err := netip.ParsePrefix(host)
		if err != nil {
			return bad("not a CIDR: " + err.Error())
		}
		r.Prefix = pfx.Masked()
		return r, nil
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		if addr.Unmap().IsUnspecified() {
			return bad("the unspecified address reaches every address of the host, cellbox's API included; name the service: 127.0.0.1:PORT")
		}
		r.Prefix = netip.PrefixFrom(addr.Unmap(), addr.Unmap().BitLen())
		return r, nil
	}
	if !validName(host) {
		return bad("not a host name")
	}
	r.Name = host
	return r, nil
}

func validIP(s string) bool { _, err := netip.ParseAddr(s); return err == nil }

// validName accepts a DNS name (lower case), "*.name" or "*".
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
