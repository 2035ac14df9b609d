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
	"net/netip"
	"os"
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
	// EnvListen is set in the environment of a box whose network goes
	// through the proxy; the agent (PID 1) forwards that address to
	// SocketName.
	EnvListen = "CELLBOX_EGRESS"
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

// Policy is a box's network rules (api.NetworkRules) compiled: the proxy
// lets the box reach what its allow entries admit and sets the headers of
// its inject rules on plain HTTP requests to their hosts. An inject rule's
// Secret names api.SecretEnvPrefix+Secret in the server's environment, read
// at each request; its TLS upgrades the requests to its host: the box sends
// http://Host/..., the proxy adds the header and sends the request to
// https://Host/... (port 443 unless the URL names one), verifying the
// certificate — the way to give a key to an HTTPS API, whose CONNECT
// tunnels the proxy cannot (and does not) look into. The zero Policy (and a
// nil one) allows nothing.
type Policy struct {
	rules   []api.AllowEntry
	headers []api.Inject
}

// CompileRules checks a box's network rules as the tools and patterns give
// them (api.NetworkRules.Check, the one implementation of the checks) and
// compiles them.
func CompileRules(r api.NetworkRules) (*Policy, error) {
	rules, headers, err := r.Check()
	if err != nil {
		return nil, err
	}
	return &Policy{rules: rules, headers: headers}, nil
}

// Compile is CompileRules of an allow list and its inject rules.
func Compile(allow []string, inject []api.Inject) (*Policy, error) {
	return CompileRules(api.NetworkRules{Allow: allow, Inject: inject})
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
		if r.Name == "" && r.Port == 0 && r.Prefix.IsSingleIP() && r.Prefix.Addr().IsLoopback() {
			a := r.Prefix.Addr().String()
			if r.Prefix.Addr().Is6() {
				a = "[" + a + "]"
			}
			out = append(out, fmt.Sprintf("allow %q opens every port of this machine's loopback to the box, the cellbox API's and any local database's included; to open one service, name its port (%s:8080)", r.Text, a))
		}
	}
	return out
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
		if _, ok := os.LookupEnv(api.SecretEnvPrefix + h.Secret); h.Secret != "" && !ok {
			errs = append(errs, fmt.Sprintf("secret %q: the server has no %s%s in its environment; set it where cellbox serve starts", h.Secret, api.SecretEnvPrefix, h.Secret))
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
		out[i] = r.Text
	}
	return out
}

// nameAllowed reports whether a name rule admits host:port.
func (p *Policy) nameAllowed(host string, port int) bool {
	return p != nil && slices.ContainsFunc(p.rules, func(r api.AllowEntry) bool {
		return r.Name != "" && matchName(r.Name, host) && (r.Port == 0 || r.Port == port)
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
	return p != nil && slices.ContainsFunc(p.rules, func(r api.AllowEntry) bool {
		return r.Name == "" && r.Prefix.Contains(addr) && (r.Port == 0 || r.Port == port) &&
			(!exactOnly || r.Prefix.IsSingleIP())
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
			if v, ok = os.LookupEnv(api.SecretEnvPrefix + h.Secret); !ok {
				return nil, false, fmt.Errorf("the rule injecting %s for %s names secret %q, and the server has no %s%s in its environment any more", h.Header, h.Host, h.Secret, api.SecretEnvPrefix, h.Secret)
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
