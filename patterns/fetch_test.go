package patterns

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/builtins"
)

const fetchYAML = `
name: prices
cells:
  city: paris
nodes:
  weather:
    fetch:
      url: https://api.example.com/v1/weather?city=${city}
      method: POST
      headers: {Accept: application/json, X-City: '${city}'}
      secret_headers: {Authorization: WEATHER_TOKEN}
      body: '${ {"city": city} }'
      format: json
      cache: false
      timeout: 10s
      max_bytes: 65536
  temp: {computed: '${weather.result?.body?.temp}'}
`

// fetchBuilder builds fetchYAML in Go.
func fetchBuilder() *Builder {
	b := New("prices")
	b.Cell("city", "paris")
	w := b.Fetch("weather", FetchSpec{
		URL:           Str("https://api.example.com/v1/weather?city=${city}"),
		Method:        Literal("POST"),
		Headers:       Strings(map[string]string{"Accept": "application/json", "X-City": "${city}"}),
		SecretHeaders: map[string]string{"Authorization": "WEATHER_TOKEN"},
		Body:          Expr(`{"city": city}`),
		Format:        "json",
		NoCache:       true,
		Timeout:       10 * time.Second,
		MaxBytes:      65536,
	})
	b.Computed("temp", w.Expr+".result?.body?.temp")
	return b
}

func TestFetchNode(t *testing.T) {
	p, err := Parse("p.yaml", []byte(fetchYAML), nil)
	require.NoError(t, err)
	n, ok := p.Node("weather")
	require.True(t, ok)
	assert.Equal(t, KindFetch, n.Kind)
	assert.Equal(t, []string{"city"}, n.Reads)
	assert.Equal(t, "application/json", n.Fetch.Headers["Accept"].Text)
	assert.Equal(t, map[string]string{"Authorization": "WEATHER_TOKEN"}, n.Fetch.SecretHeaders)
	temp, _ := p.Node("temp")
	assert.Equal(t, []string{"weather"}, temp.Reads)

	fromGo, err := fetchBuilder().Build()
	require.NoError(t, err)
	p.Source, fromGo.Source = nil, nil
	assert.Equal(t, p, fromGo, "the Go builder makes the same pattern")

	rp, err := Compile(p, builtins.Env{})
	require.NoError(t, err, "a fetch node needs no sandbox client")
	assert.IsType(t, &builtins.Fetch{}, rp.Nodes[0].Kind)
}

func TestFetchNodeErrors(t *testing.T) {
	tests := []struct {
		name, src string
		want      []string
	}{
		{"missing url", "name: x\nnodes:\n  f: {fetch: {method: GET}}\n", []string{
			`p.yaml:3: nodes.f.fetch.url: missing: a fetch node needs a url (http or https)`}},
		{"bad fields", "name: x\nnodes:\n  f:\n    fetch:\n      url: http://x\n      format: xml\n      max_bytes: lots\n      secret_headers: {Authorization: 'Bearer abc'}\n      headers: {'bad header': x}\n      timeot: 1s\n", []string{
			`p.yaml:6: nodes.f.fetch.format: unknown format "xml" (want text or json)`,
			`p.yaml:7: nodes.f.fetch.max_bytes: want a positive number of bytes such as 1048576, got the string "lots"`,
			`p.yaml:8: nodes.f.fetch.secret_headers.Authorization: "Bearer abc" is not an environment variable name: secret_headers maps a header to the name of a variable of the runner's environment (e.g. Authorization: API_TOKEN)`,
			`p.yaml:9: nodes.f.fetch.headers["bad header"]: "bad header" is not a valid HTTP header name`,
			`p.yaml:10: nodes.f.fetch.timeot: unknown field "timeot" (did you mean "timeout"?) (fields: url, method, headers, secret_headers, body, format, cache, timeout, max_bytes)`}},
		{"a method that is none", "name: x\nnodes:\n  f: {fetch: {url: 'http://x', method: 'GE T'}}\n  g: {fetch: {url: 'http://x', method: '${m}'}}\ncells:\n  m: POST\n", []string{
			`p.yaml:3: nodes.f.fetch.method: method "GE T" is not an HTTP method (e.g. GET, POST)`}},
		{"cellbox's own variables", "name: x\nnodes:\n  f: {fetch: {url: 'http://x', secret_headers: {Authorization: CELLBOX_KEY}}}\n", []string{
			`p.yaml:3: nodes.f.fetch.secret_headers.Authorization: CELLBOX_KEY is cellbox's own configuration (CELLBOX_KEY is the server key): a pattern cannot send it; put the token in a variable of its own`}},
		{"reading the result", "name: x\nnodes:\n  f: {fetch: {url: 'http://x'}}\n  a: {computed: '${f.result.stauts}'}\n  b: {computed: '${f.body}'}\n", []string{
			`p.yaml:4: nodes.a.computed: fetch node "f" has no output "result.stauts" (did you mean "status"?) (result has: status, headers, body)`,
			`p.yaml:5: nodes.b.computed: fetch node "f" has no output "body" (outputs: pending, result, error)`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(tt.src), nil)
			require.Error(t, err)
			assert.Equal(t, strings.Join(tt.want, "\n"), err.Error())
			var list ErrorList
			require.True(t, errors.As(err, &list))
		})
	}
}
