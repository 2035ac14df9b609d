// Package sandboxclient is the client of the sandbox service: the Client
// interface the pattern runtime's built-ins use, and its HTTP
// implementation. The service hands out an in-process implementation of the
// same interface (sandbox.Service.Client); both pass the conformance suite
// in sandboxclient/clienttest.
//
// Errors: a failure of the service has a code (api.Code*), and both
// implementations return errors for which errors.Is(err, ErrX) holds with
// the sentinel of that code (ErrNoBox, ErrNotFound, ...). A tool that
// fails returns its result along with a *ToolError carrying the code and
// the message. Test with errors.Is, never by matching messages.
package sandboxclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cellbox/cellbox/internal/readall"
	"github.com/cellbox/cellbox/internal/sse"
	"github.com/cellbox/cellbox/sandbox/api"
)

// Client drives the boxes of one session.
type Client interface {
	// Tool calls a tool of the registry with input (a struct, a map, or
	// JSON as json.RawMessage/[]byte) and returns the result object. A
	// result with is_error: true is returned along with a *ToolError.
	Tool(ctx context.Context, name string, input any) (json.RawMessage, error)
	// CreateBox creates (or ensures) a named box (the sandbox_create tool).
	CreateBox(ctx context.Context, in api.SandboxCreateInput) (api.SandboxCreateOutput, error)
	// Exec runs a command in box, calling onOutput (if not nil) with output
	// chunks ("stdout"/"stderr") as they come.
	Exec(ctx context.Context, box string, req api.ExecRequest, onOutput func(stream string, data []byte)) (api.ExecResult, error)
	// Upload writes r into the file path of box (parents are created).
	Upload(ctx context.Context, box, path string, r io.Reader) (int64, error)
	// Download writes the file path of box to w.
	Download(ctx context.Context, box, path string, w io.Writer) (int64, error)
	// Watch delivers batches of file changes under path in box until ctx
	// ends; the channel is closed then.
	Watch(ctx context.Context, box, path string) (<-chan []api.WatchEvent, error)
	// DestroyBox destroys box and its files.
	DestroyBox(ctx context.Context, box string) error
}

// ToolLister is a Client that also lists the registry's tools (the HTTP
// client and the service's in-process client both do); the llm node kind
// binds a box's tools for a model from it.
type ToolLister interface {
	Tools(ctx context.Context) ([]api.ToolInfo, error)
}

// ImageDigester is a Client that also says which build of an image a box
// created now would run: a digest that changes whenever the image is
// rebuilt under its name, "" when the service cannot tell (an image it
// does not have, one no digest describes). The exec node kind keys its
// memo cache by it. The service's in-process client is one; the HTTP
// client is not (the API has no endpoint for it), so exec nodes over HTTP
// key results by the image's name.
type ImageDigester interface {
	ImageDigest(ctx context.Context, image string) (string, error)
}

// ToolError is a tool result with is_error: true: its Code and Message
// (errors.Is(err, ErrX) holds for the code's sentinel).
type ToolError = api.ToolError

// The sentinel errors of the codes (see package api for the codes).
var (
	// ErrInvalidInput: the input is malformed or asks for the impossible.
	ErrInvalidInput = api.ErrInvalidInput
	// ErrNotFound: no such file or directory; it is fs.ErrNotExist.
	ErrNotFound = api.ErrNotFound
	// ErrNoBox: the session has no sandbox of that name (sandbox_destroy,
	// DestroyBox). Other operations create a missing box.
	ErrNoBox = api.ErrNoBox
	// ErrNoSession: the session does not exist (any more).
	ErrNoSession = api.ErrNoSession
	// ErrOutsideWorkspace: a path leaves the box's workspace.
	ErrOutsideWorkspace = api.ErrOutsideWorkspace
	// ErrExists: the thing to create is already there; it is fs.ErrExist.
	ErrExists = api.ErrExists
	// ErrTooLarge: a file, an input or an output is over a limit.
	ErrTooLarge = api.ErrTooLarge
	// ErrTimeout: the operation ran out of time.
	ErrTimeout = api.ErrTimeout
	// ErrRefused: the command is outside the session's allowed_commands.
	ErrRefused = api.ErrRefused
	// ErrLimit: the cap on sandboxes per session or per server is reached.
	ErrLimit = api.ErrLimit
	// ErrUnavailable: the server is shutting down (the call was ended,
	// or refused); call again once it is back.
	ErrUnavailable = api.ErrUnavailable
	// ErrInternal: a fault of the service or its backend.
	ErrInternal = api.ErrInternal
)

// APIError is a non-2xx answer of the HTTP API (bad JSON, unknown tool,
// authentication, a file that is not there, ...). errors.Is(err, ErrX)
// holds for the sentinel of its Code.
type APIError struct {
	Status  int
	Code    string // api.Code*; "" if the server sent none
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("sandbox API: %s (HTTP %d)", e.Message, e.Status)
}

// ErrorCode returns the code of the answer.
func (e *APIError) ErrorCode() string { return e.Code }

// Is makes errors.Is(err, ErrNotFound) (and the other sentinels) hold for
// the answer's code.
func (e *APIError) Is(target error) bool { return target != nil && target == api.Sentinel(e.Code) }

// fileStatusCodes are the codes of the statuses the files and watch
// endpoints answer for a box operation, for an answer without a code
// (the service sends the code in the body when it has one).
var fileStatusCodes = map[int]string{
	http.StatusNotFound:              api.CodeNotFound,
	http.StatusForbidden:             api.CodeOutsideWorkspace,
	http.StatusRequestEntityTooLarge: api.CodeTooLarge,
	http.StatusConflict:              api.CodeExists,
	http.StatusBadRequest:            api.CodeInvalidInput,
}

// fileError fills in the code of an *APIError of a files or watch
// endpoint from its status when the server sent none.
func fileError(err error) error {
	var ae *APIError
	if errors.As(err, &ae) && ae.Code == "" {
		ae.Code = fileStatusCodes[ae.Status]
	}
	return err
}

// HTTP is the Client over the HTTP API.
type HTTP struct {
	base    string
	session string
	token   string
	hc      *http.Client
}

var _ Client = (*HTTP)(nil)

// New returns a client of session sessionID (with its bearer token) on the
// server at baseURL (http://127.0.0.1:PORT).
func New(baseURL, sessionID, token string) *HTTP {
	return &HTTP{base: strings.TrimRight(baseURL, "/"), session: sessionID, token: token, hc: &http.Client{}}
}

// NewSession creates a session on the server at baseURL and returns its
// client; for a server that asks for a key, see NewSessionWithKey.
func NewSession(ctx context.Context, baseURL string) (*HTTP, error) {
	return NewSessionWithKey(ctx, baseURL, "")
}

// NewSessionWithKey creates a session on the server at baseURL with the
// server key (cellbox serve asks for it: its DATA/server.key, or
// CELLBOX_KEY) and returns its client, which uses the session's token.
func NewSessionWithKey(ctx context.Context, baseURL, key string) (*HTTP, error) {
	return NewSessionWithOptions(ctx, baseURL, key, api.NewSessionRequest{})
}

// NewSessionWithOptions is NewSessionWithKey with session options, such as
// allowed_commands (the prefixes every command of the session must start
// with).
func NewSessionWithOptions(ctx context.Context, baseURL, key string, opts api.NewSessionRequest) (*HTTP, error) {
	c := New(baseURL, "", key)
	var res api.NewSessionResult
	if err := c.do(ctx, http.MethodPost, "/v1/sessions", opts, &res); err != nil {
		return nil, fmt.Errorf("create session: %w", err)
	}
	c.session, c.token = res.ID, res.Token // from now on the session's token
	return c, nil
}

// Session returns the session id and token.
func (c *HTTP) Session() (id, token string) { return c.session, c.token }

// DeleteSession destroys the session and all its boxes.
func (c *HTTP) DeleteSession(ctx context.Context) error {
	return c.do(ctx, http.MethodDelete, "/v1/sessions/"+url.PathEscape(c.session), nil, nil)
}

// Tools lists the tools of the server.
func (c *HTTP) Tools(ctx context.Context) ([]api.ToolInfo, error) {
	return c.ToolsFor(ctx, "")
}

// ToolsFor lists the tools of a profile: cellbox's own (""), or a tool set
// agents already use under its own names and fields ("cloudflare",
// "fs-tools", "deerflow"; see docs/tools.md).
func (c *HTTP) ToolsFor(ctx context.Context, profile string) ([]api.ToolInfo, error) {
	var out []api.ToolInfo
	return out, c.do(ctx, http.MethodGet, "/v1/tools"+profileQuery(profile), nil, &out)
}

func profileQuery(profile string) string {
	if profile == "" {
		return ""
	}
	return "?profile=" + url.QueryEscape(profile)
}

func (c *HTTP) sessionPath(parts ...string) string {
	p := "/v1/sessions/" + url.PathEscape(c.session)
	for _, s := range parts {
		p += "/" + s
	}
	return p
}

func (c *HTTP) boxPath(box string, parts ...string) string {
	if box == "" {
		box = api.DefaultBox
	}
	return c.sessionPath(append([]string{"boxes", url.PathEscape(box)}, parts...)...)
}

// filesPath escapes a box file path for the files endpoint: relative paths
// stay relative to /workspace, an absolute path keeps its leading slash
// escaped, and "." and ".." segments are escaped (%2E) so that the URL is
// not cleaned on the way: the service sees the path as given and answers
// for it (outside_workspace for ../x), as the in-process client does.
func filesPath(p string) string {
	var b strings.Builder
	if strings.HasPrefix(p, "/") {
		b.WriteString("%2F")
		p = strings.TrimLeft(p, "/")
	}
	for i, seg := range strings.Split(p, "/") {
		if i > 0 {
			b.WriteByte('/')
		}
		if seg == "." || seg == ".." {
			b.WriteString(strings.Repeat("%2E", len(seg)))
			continue
		}
		b.WriteString(url.PathEscape(seg))
	}
	return b.String()
}

func (c *HTTP) request(ctx context.Context, method, path string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return req, nil
}

// send performs a request and turns a non-2xx answer into an *APIError.
func (c *HTTP) send(req *http.Request) (*http.Response, error) {
	resp, err := c.hc.Do(req)
	if errors.Is(err, syscall.ECONNREFUSED) {
		return nil, fmt.Errorf("no cellbox server answers at %s (start one with `cellbox serve`, or set --server or CELLBOX_SERVER): %w", c.base, err)
	}
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var eb api.ErrorBody
	if json.Unmarshal(data, &eb) != nil || eb.Error == "" {
		eb.Error = strings.TrimSpace(string(data))
	}
	return nil, &APIError{Status: resp.StatusCode, Code: eb.Code, Message: eb.Error}
}

// maxPrealloc is the largest announced answer read into a buffer of its
// size (a tool result is at most a few MiB).
const maxPrealloc = 64 << 20

// do sends in as JSON (if not nil) and decodes the answer into out (if not nil).
func (c *HTTP) do(ctx context.Context, method, path string, in any, out any) error {
	var body io.Reader
	if in != nil {
		k, err := encodeInput(in)
		if err != nil {
			return err
		}
		defer k.release() // the call's own hold: the body is not sent again once do returns
		body = k.body()
	}
	req, err := c.request(ctx, method, path, body)
	if err != nil {
		return err
	}
	if kb, ok := body.(*keptBody); ok {
		req.ContentLength = int64(kb.Len())
		req.GetBody = func() (io.ReadCloser, error) { return kb.k.body(), nil } // a POST retried on a fresh connection
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		return nil
	}
	size := resp.ContentLength
	if size > maxPrealloc { // not believed that far: grown as it comes
		size = -1
	}
	switch out := out.(type) {
	case *json.RawMessage:
		*out, err = readall.Sized(resp.Body, size, math.MaxInt64)
		return err
	case *bytes.Buffer: // a kept one (ToolInto)
		out.Grow(int(max(size, 0)) + bytes.MinRead)
		_, err = out.ReadFrom(resp.Body)
		return err
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode answer of %s %s: %w", method, path, err)
	}
	return nil
}

// keptInput is an encoded tool input in a buffer kept for the next call
// (a write_file input is a megabyte; see readall.BufferPool). The buffer
// goes back when every hold on it is released: the call's own (when do
// returns) and each body's (when the transport closes it, which it may do
// after do returns). A body the transport never closes leaves the buffer
// to the collector: never reused too early.
type keptInput struct {
	raw  []byte
	kept bool // raw is from inputs (not JSON the caller gave)
	refs atomic.Int32
}

// encodeInput encodes in, held once for the caller. JSON the caller gives
// is taken as it is.
func encodeInput(in any) (*keptInput, error) {
	k := &keptInput{}
	var err error
	switch in.(type) {
	case json.RawMessage, []byte:
		k.raw, err = api.MarshalInput(in)
	default:
		k.raw, err = api.AppendInput(inputs.Get().AvailableBuffer(), in)
		k.kept = true
	}
	if err != nil {
		return nil, err
	}
	k.refs.Store(1)
	return k, nil
}

// release drops one hold; the last gives a kept buffer back.
func (k *keptInput) release() {
	if k.refs.Add(-1) == 0 && k.kept {
		inputs.PutSlice(k.raw)
	}
}

// body is a new reader of the input, holding it until closed.
func (k *keptInput) body() *keptBody {
	k.refs.Add(1)
	b := &keptBody{k: k}
	b.Reset(k.raw)
	return b
}

// inputs keeps encoded tool inputs up to a write_file of the largest
// content (2 MiB, escaped).
var inputs = readall.BufferPool{Max: 5 << 20}

// keptBody is a request body of a keptInput; Close releases its hold
// (once).
type keptBody struct {
	bytes.Reader
	k    *keptInput
	once sync.Once
}

func (b *keptBody) Close() error {
	b.once.Do(b.k.release)
	return nil
}

// Tool calls a tool.
func (c *HTTP) Tool(ctx context.Context, name string, input any) (json.RawMessage, error) {
	return c.ToolAs(ctx, "", name, input)
}

// ToolAs calls the tool called name in profile (see ToolsFor).
func (c *HTTP) ToolAs(ctx context.Context, profile, name string, input any) (json.RawMessage, error) {
	var res json.RawMessage
	if err := c.postTool(ctx, profile, name, input, &res); err != nil {
		return nil, err
	}
	res = bytes.TrimSpace(res)
	return res, api.ResultError(name, res)
}

// postTool posts input (nil: {}) to the tool called name in profile and
// reads the answer into result, as do does.
func (c *HTTP) postTool(ctx context.Context, profile, name string, input, result any) error {
	if input == nil {
		input = struct{}{}
	}
	return c.do(ctx, http.MethodPost, c.sessionPath("tools", url.PathEscape(name))+profileQuery(profile), input, result)
}

// ToolInto calls the tool called name and decodes its result into out (a
// pointer to the tool's output struct, as api.DecodeResult takes); a
// failed result is a *ToolError. The result object itself is not kept: it
// is read into a buffer kept for the next call (a read_file window is
// 256 KiB: Tool then DecodeResult leave a megabyte of garbage per four).
func (c *HTTP) ToolInto(ctx context.Context, name string, input, out any) error {
	buf := results.Get()
	defer results.Put(buf)
	if err := c.postTool(ctx, "", name, input, buf); err != nil {
		return err
	}
	res := bytes.TrimSpace(buf.Bytes())
	if err := api.ResultError(name, res); err != nil {
		var te *ToolError
		if errors.As(err, &te) {
			te.Result = bytes.Clone(te.Result) // its own: the buffer is kept
		}
		return err
	}
	return api.DecodeResult(res, out)
}

// results keeps tool results ToolInto decodes, up to a read_file window
// of the largest (see readall.BufferPool).
var results = readall.BufferPool{Max: 5 << 20}

// CreateBox runs sandbox_create.
func (c *HTTP) CreateBox(ctx context.Context, in api.SandboxCreateInput) (api.SandboxCreateOutput, error) {
	var out api.SandboxCreateOutput
	return out, c.ToolInto(ctx, "sandbox_create", in, &out)
}

// DestroyBox runs sandbox_destroy.
func (c *HTTP) DestroyBox(ctx context.Context, box string) error {
	_, err := c.Tool(ctx, "sandbox_destroy", api.SandboxDestroyInput{Sandbox: box})
	return err
}

// Exec runs a command through the streaming exec endpoint.
func (c *HTTP) Exec(ctx context.Context, box string, req api.ExecRequest, onOutput func(stream string, data []byte)) (api.ExecResult, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return api.ExecResult{}, err
	}
	hreq, err := c.request(ctx, http.MethodPost, c.boxPath(box, "exec"), bytes.NewReader(body))
	if err != nil {
		return api.ExecResult{}, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := c.send(hreq)
	if err != nil {
		return api.ExecResult{}, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var f api.ExecFrame
		if err := dec.Decode(&f); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return api.ExecResult{}, fmt.Errorf("exec stream: %w", err)
		}
		switch {
		case f.Result != nil:
			return *f.Result, nil
		case f.Error != "":
			return api.ExecResult{}, api.WithCode(f.Code, errors.New(f.Error))
		case f.Stream != "" && onOutput != nil:
			onOutput(f.Stream, f.Data)
		}
	}
}

// Upload streams r into the file path of box.
func (c *HTTP) Upload(ctx context.Context, box, path string, r io.Reader) (int64, error) {
	req, err := c.request(ctx, http.MethodPut, c.boxPath(box, "files", filesPath(path)), r)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.send(req)
	if err != nil {
		return 0, fileError(err)
	}
	defer resp.Body.Close()
	var res api.UploadResult
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		return 0, fmt.Errorf("upload %s: decode answer: %w", path, err)
	}
	return res.Bytes, nil
}

// Download streams the file path of box to w.
func (c *HTTP) Download(ctx context.Context, box, path string, w io.Writer) (int64, error) {
	req, err := c.request(ctx, http.MethodGet, c.boxPath(box, "files", filesPath(path)), nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.send(req)
	if err != nil {
		return 0, fileError(err)
	}
	defer resp.Body.Close()
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("download %s: %w", path, err)
	}
	if resp.ContentLength >= 0 && n != resp.ContentLength {
		return n, fmt.Errorf("download %s: got %d of %d bytes", path, n, resp.ContentLength)
	}
	return n, nil
}

// Watch follows the watch endpoint's server-sent events.
func (c *HTTP) Watch(ctx context.Context, box, path string) (<-chan []api.WatchEvent, error) {
	req, err := c.request(ctx, http.MethodGet, c.boxPath(box, "watch")+"?path="+url.QueryEscape(path), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.send(req)
	if err != nil {
		return nil, fileError(err)
	}
	ch := make(chan []api.WatchEvent)
	go func() {
		defer close(ch)
		defer resp.Body.Close()
		_ = sse.Read(resp.Body, 16<<20, func(event string, data []byte) error {
			switch event {
			case "end":
				return sse.Stop
			case "changes":
				var evs []api.WatchEvent
				if json.Unmarshal(data, &evs) != nil {
					return nil
				}
				select {
				case ch <- evs:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		})
	}()
	return ch, nil
}

// WaitHealthy polls /healthz until the server answers or ctx ends.
func WaitHealthy(ctx context.Context, baseURL string) error {
	c := New(baseURL, "", "")
	for {
		if err := c.do(ctx, http.MethodGet, "/healthz", nil, nil); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("server %s did not answer: %w", baseURL, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
