package builtins

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/internal/readall"
	"github.com/cellbox/cellbox/internal/textcut"
	"github.com/cellbox/cellbox/runtime"
)

// Defaults of a fetch node that sets no timeout or size cap.
const (
	DefaultFetchTimeout  = 30 * time.Second
	DefaultFetchMaxBytes = 10 << 20
	// fetchMaxRedirects caps the redirects one request follows.
	fetchMaxRedirects = 5
	// fetchErrorBody is how much of a non-2xx body its error quotes.
	fetchErrorBody = 200
)

// Response formats of a fetch node.
const (
	FetchText = "text"
	FetchJSON = "json"
)

// fetchHeaders are the response headers a fetch result keeps: enough to
// know what came back, not every header a server sends.
var fetchHeaders = []string{"Content-Type", "Content-Length", "ETag", "Last-Modified"}

// envNameRE is what a secret header's variable name must look like.
var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// CheckSecretVar checks the variable a secret header is read from: an
// environment variable name, and not one of cellbox's own (CELLBOX_KEY is
// the server key; a pattern must not be able to send it to a URL).
func CheckSecretVar(name string) error {
	switch {
	case !envNameRE.MatchString(name):
		return fmt.Errorf("%q is not an environment variable name: secret_headers maps a header to the name of a variable of the runner's environment (e.g. Authorization: API_TOKEN)", name)
	case strings.HasPrefix(strings.ToUpper(name), "CELLBOX_"):
		return fmt.Errorf("%s is cellbox's own configuration (CELLBOX_KEY is the server key): a pattern cannot send it; put the token in a variable of its own", name)
	}
	return nil
}

// FetchSpec describes a fetch node.
type FetchSpec struct {
	// Node is the node's output cell address (it names the node in logs).
	Node cells.Address
	// URL is the http or https URL to fetch, formatted with Text.
	URL Field
	// Method is the HTTP method; nil or "" is GET.
	Method Field
	// Headers are request headers, formatted with Text.
	Headers map[string]Field
	// SecretHeaders maps a header name to the name of an environment
	// variable of the runner holding its value (a token). The value is read
	// at each request and never stored: not in cells, the memo key, the
	// store or logs.
	SecretHeaders map[string]string
	// Body is the request body, formatted with Text (an object or list is
	// sent as JSON); nil is no body.
	Body Field
	// Format is how the response body is read: FetchText (the default) or
	// FetchJSON (parsed).
	Format string
	// NoCache turns the memo cache off (requests with side effects, or
	// whose answer changes).
	NoCache bool
	// Timeout bounds one request, body included; 0 is DefaultFetchTimeout.
	Timeout time.Duration
	// MaxBytes caps the response body; 0 is DefaultFetchMaxBytes.
	MaxBytes int64
}

// Fetch is the fetch node kind, a runtime.Async: it sends an HTTP request
// from the runner's process (not from a box) whenever an input changes.
// Like exec, a change of an input aborts the request in flight, and the
// memo key is a SHA-256 over the request (method, URL, headers, the names
// of the secret headers' variables, body, format): a restart or a revert
// repeats no request that finished.
//
// Its result is a FetchResult. A non-2xx status fails the run (the error
// names the status and quotes the start of the body) and keeps the result
// beside the error; a body over the cap, an unreachable host, a timeout or
// a JSON body that does not parse fail it with no result.
type Fetch struct {
	spec   FetchSpec
	log    *slog.Logger
	client *http.Client
}

var _ runtime.Async = (*Fetch)(nil)

// FetchResult is the result of a fetch.
type FetchResult struct {
	Status int `json:"status"`
	// Headers holds the response's Content-Type, Content-Length, ETag and
	// Last-Modified, those it sent.
	Headers map[string]string `json:"headers"`
	// Body is the body's text, or its parsed value with format json.
	Body any `json:"body"`
}

// FetchError is a response with a non-2xx status.
type FetchError struct {
	Result FetchResult
	Msg    string
}

func (e *FetchError) Error() string { return e.Msg }

// PartialResult is the result to keep alongside the error.
func (e *FetchError) PartialResult() any { return e.Result }

// NewFetch returns the fetch node kind for spec. It needs no sandbox
// client: the request is sent by the runner.
func NewFetch(env Env, spec FetchSpec) (*Fetch, error) {
	if spec.URL == nil {
		return nil, fmt.Errorf("fetch node %s: no url", spec.Node.Name)
	}
	switch spec.Format {
	case "":
		spec.Format = FetchText
	case FetchText, FetchJSON:
	default:
		return nil, fmt.Errorf("fetch node %s: unknown format %q (want text or json)", spec.Node.Name, spec.Format)
	}
	for h, v := range spec.SecretHeaders {
		if err := CheckSecretVar(v); err != nil {
			return nil, fmt.Errorf("fetch node %s: secret header %s: %w", spec.Node.Name, h, err)
		}
	}
	if spec.Timeout <= 0 {
		spec.Timeout = DefaultFetchTimeout
	}
	if spec.MaxBytes <= 0 {
		spec.MaxBytes = DefaultFetchMaxBytes
	}
	client := &http.Client{CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if len(via) > fetchMaxRedirects {
			return fmt.Errorf("stopped after %d redirects", fetchMaxRedirects)
		}
		if s := req.URL.Scheme; s != "http" && s != "https" {
			return fmt.Errorf("redirected to a %s: URL; only http and https are fetched", s)
		}
		return nil
	}}
	return &Fetch{spec: spec, log: env.logger().With("node", spec.Node.String()), client: client}, nil
}

// fetchJob is one request, resolved from the inputs; its JSON is hashed
// into the memo key. Secret headers appear by variable name only.
type fetchJob struct {
	Method  string            `json:"method"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers,omitempty"`
	Secrets map[string]string `json:"secrets,omitempty"` // header -> variable name
	Body    *string           `json:"body,omitempty"`
	Format  string            `json:"format"`
}

func (f *Fetch) resolve(in runtime.Inputs) (fetchJob, error) {
	job := fetchJob{Method: http.MethodGet, Format: f.spec.Format, Secrets: f.spec.SecretHeaders}
	var err error
	if job.URL, err = evalText(f.spec.URL, in, "url"); err != nil {
		return job, err
	}
	u, err := url.Parse(job.URL)
	switch {
	case err != nil:
		return job, fmt.Errorf("url %q: %w", job.URL, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return job, fmt.Errorf("url %q: only http and https URLs are fetched", job.URL)
	case u.Host == "":
		return job, fmt.Errorf("url %q has no host", job.URL)
	}
	if f.spec.Method != nil {
		m, err := evalText(f.spec.Method, in, "method")
		if err != nil {
			return job, err
		}
		if m != "" {
			job.Method = strings.ToUpper(m)
		}
		if strings.ContainsFunc(job.Method, func(r rune) bool { return r < 'A' || r > 'Z' }) {
			return job, fmt.Errorf("method %q is not an HTTP method (e.g. GET, POST)", m)
		}
	}
	for h, v := range f.spec.Headers {
		s, err := evalText(v, in, "header "+h)
		if err != nil {
			return job, err
		}
		if job.Headers == nil {
			job.Headers = map[string]string{}
		}
		job.Headers[h] = s
	}
	if f.spec.Body != nil {
		v, err := f.spec.Body(in)
		if err != nil {
			return job, fmt.Errorf("body: %w", err)
		}
		s, err := Text(v)
		if err != nil {
			return job, fmt.Errorf("body: %w", err)
		}
		job.Body = &s
		// An object or list goes as JSON: say so, unless a header does.
		switch v.(type) {
		case map[string]any, []any:
			if !slices.ContainsFunc(slices.Collect(maps.Keys(job.Headers)), func(h string) bool { return strings.EqualFold(h, "Content-Type") }) {
				if job.Headers == nil {
					job.Headers = map[string]string{}
				}
				job.Headers["Content-Type"] = "application/json"
			}
		}
	}
	return job, nil
}

// Key is the memo key of the request the inputs ask for.
func (f *Fetch) Key(in runtime.Inputs) (string, bool, error) {
	job, err := f.resolve(in)
	if err != nil {
		return "", false, err
	}
	return memoKey("fetch/v1", job, !f.spec.NoCache)
}

// Run sends the request and reads the response.
func (f *Fetch) Run(ctx context.Context, in runtime.Inputs) (any, error) {
	job, err := f.resolve(in)
	if err != nil {
		return nil, err
	}
	what := job.Method + " " + job.URL
	rctx, cancel := context.WithTimeout(ctx, f.spec.Timeout)
	defer cancel()
	var body io.Reader
	if job.Body != nil {
		body = strings.NewReader(*job.Body)
	}
	req, err := http.NewRequestWithContext(rctx, job.Method, job.URL, body)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	for h, v := range job.Headers {
		req.Header.Set(h, v)
	}
	for h, name := range job.Secrets {
		v, ok := os.LookupEnv(name)
		if !ok {
			return nil, fmt.Errorf("%s: secret header %s: environment variable %s is not set on the runner", what, h, name)
		}
		req.Header.Set(h, v)
	}
	// failed explains a transport error: the timeout, or the cause
	// without url.Error's repeat of the method and URL.
	failed := func(err error) error {
		if ctx.Err() == nil && rctx.Err() != nil {
			return fmt.Errorf("%s: timed out after %s", what, f.spec.Timeout)
		}
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, failed(err)
	}
	defer resp.Body.Close()
	raw, err := readall.Capped(resp.Body, f.spec.MaxBytes)
	if errors.Is(err, readall.ErrTooLarge) {
		return nil, fmt.Errorf("%s: response larger than %d bytes (raise the node's max_bytes to fetch it)", what, f.spec.MaxBytes)
	}
	if err != nil {
		return nil, failed(err)
	}
	res := FetchResult{Status: resp.StatusCode, Headers: map[string]string{}, Body: string(raw)}
	for _, h := range fetchHeaders {
		if v := resp.Header.Get(h); v != "" {
			res.Headers[h] = v
		}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, &FetchError{Result: res, Msg: fmt.Sprintf("%s: HTTP %s: %s", what, resp.Status, start(raw))}
	}
	if job.Format == FetchJSON && len(raw) == 0 {
		res.Body = nil // 204 No Content, or an empty answer: null, not an error
	} else if job.Format == FetchJSON {
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("%s: the response is not JSON (format json): %w; it starts %s", what, err, start(raw))
		}
		res.Body = v
	}
	f.log.Debug("fetched", "method", job.Method, "url", job.URL, "status", resp.StatusCode, "bytes", len(raw))
	return res, nil
}

// start quotes the start of a body for an error.
func start(raw []byte) string {
	if len(raw) <= fetchErrorBody {
		return fmt.Sprintf("%q", raw)
	}
	return fmt.Sprintf("%q…", textcut.Prefix(raw, fetchErrorBody))
}
