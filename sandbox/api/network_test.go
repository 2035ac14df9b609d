package api

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNetworkRulesCheck: Check parses the allow list and normalizes the
// inject hosts; the egress proxy compiles what it returns (its tests cover
// each check through egress.Compile).
func TestNetworkRulesCheck(t *testing.T) {
	allow, inject, err := NetworkRules{
		Allow:  []string{"Example.org.", "*.example.org:443", "10.1.2.3/24:8080", "::1"},
		Inject: []Inject{{Host: " API.Example.org. ", Header: "X-Api-Key", Secret: "KEY"}},
	}.Check()
	require.NoError(t, err)
	assert.Equal(t, []AllowEntry{
		{Text: "Example.org.", Name: "example.org"},
		{Text: "*.example.org:443", Name: "*.example.org", Port: 443},
		{Text: "10.1.2.3/24:8080", Prefix: netip.MustParsePrefix("10.1.2.0/24"), Port: 8080},
		{Text: "::1", Prefix: netip.MustParsePrefix("::1/128")},
	}, allow)
	assert.Equal(t, "api.example.org", inject[0].Host)

	_, _, err = NetworkRules{Allow: []string{"http://x.org", "0.0.0.0"}, Inject: []Inject{{Host: "x.org", Header: "Host", Value: "v"}}}.Check()
	require.Error(t, err)
	for _, want := range []string{`allow "http://x.org": a URL; give its host: "x.org"`, `allow "0.0.0.0": the unspecified address`, `inject[0]: header "Host" frames the request`} {
		assert.Contains(t, err.Error(), want)
	}
}
