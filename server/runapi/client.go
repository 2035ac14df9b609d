package runapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"

	"github.com/cellbox/cellbox/internal/sse"
)

// Client is a client of the runtime API.
type Client struct {
	base string
	key  string // the server key, sent as a bearer token (TCP only)
	hc   *http.Client
	unix bool // over DATA/run.sock
}

// NewClient returns a client of the API at baseURL (http://127.0.0.1:PORT).
func NewClient(baseURL string) *Client {
	return &Client{base: strings.TrimRight(baseURL, "/"), hc: &http.Client{}}
}

// WithKey returns c sending the server key (cellbox serve's DATA/server.key,
// or CELLBOX_KEY): the API on TCP asks for it; the unix socket does not.
func (c *Client) WithKey(key string) *Client {
	cc := *c
	cc.key = key
	return &cc
}

// NewUnixClient returns a client of the API served on the unix socket at
// path.
func NewUnixClient(path string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}
	return &Client{base: "http://cellbox", hc: &http.Client{Transport: tr}, unix: true}
}

// escape escapes each segment of an address for a URL path.
func escape(addr string) string {
	parts := strings.Split(addr, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return strings.Join(parts, "/")
}

// do sends a request and decodes a JSON answer into out (unless nil); an
// error answer is returned as *Error.
func (c *Client) do(ctx context.Context, method, path string, body []byte, out any) error {
	resp, err := c.send(ctx, method, path, body, "application/json")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

func (c *Client) send(ctx context.Context, method, path string, body []byte, accept string) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", accept)
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if errors.Is(err, syscall.ECONNREFUSED) && !c.unix {
		return nil, fmt.Errorf("nothing answers at %s (start `cellbox run PATTERN` or `cellbox serve` there, or give --data DIR to work on the data dir itself): %w", c.base, err)
	}
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		e := &Error{Status: resp.StatusCode}
		if json.Unmarshal(b, e) != nil || e.Message == "" {
			e.Message = fmt.Sprintf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(b))
		}
		return nil, e
	}
	return resp, nil
}

// Load loads the pattern at path (absolute, on the server's machine) as an
// instance; name and space may be "" for the defaults.
func (c *Client) Load(ctx context.Context, path, name, space string) (Instance, error) {
	body, _ := json.Marshal(loadRequest{Path: path, Name: name, Space: space})
	var in Instance
	return in, c.do(ctx, http.MethodPost, "/v1/patterns", body, &in)
}

// Patterns lists the loaded instances.
func (c *Client) Patterns(ctx context.Context) ([]Instance, error) {
	var out []Instance
	return out, c.do(ctx, http.MethodGet, "/v1/patterns", nil, &out)
}

// Stop stops the instance called name.
func (c *Client) Stop(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/v1/patterns/"+escape(name), nil, nil)
}

// Cells lists the cells under prefix.
func (c *Client) Cells(ctx context.Context, prefix string) (CellList, error) {
	var out CellList
	return out, c.do(ctx, http.MethodGet, "/v1/cells?prefix="+url.QueryEscape(prefix), nil, &out)
}

// Get reads one cell.
func (c *Client) Get(ctx context.Context, addr string) (Cell, error) {
	var out Cell
	return out, c.do(ctx, http.MethodGet, "/v1/cells/"+escape(addr), nil, &out)
}

// Set writes a cell's JSON value and returns the cell as written.
func (c *Client) Set(ctx context.Context, addr string, value json.RawMessage) (Cell, error) {
	var out Cell
	return out, c.do(ctx, http.MethodPut, "/v1/cells/"+escape(addr), value, &out)
}

// Send sends an event to a stream ("node.stream").
func (c *Client) Send(ctx context.Context, addr string, payload json.RawMessage) (Sent, error) {
	var out Sent
	return out, c.do(ctx, http.MethodPost, "/v1/send/"+escape(addr), payload, &out)
}

// Retry runs a failed exec node again (see POST /v1/retry/{node}) and
// returns its cell, pending.
func (c *Client) Retry(ctx context.Context, node string) (Cell, error) {
	var out Cell
	return out, c.do(ctx, http.MethodPost, "/v1/retry/"+escape(node), nil, &out)
}

// Graph returns a loaded instance's graph in format ("dot" or "mermaid").
func (c *Client) Graph(ctx context.Context, name, format string) (string, error) {
	resp, err := c.send(ctx, http.MethodGet, "/v1/graph/"+escape(name)+"?format="+url.QueryEscape(format), nil, "text/plain")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// Watch calls fn with each batch under prefix until ctx ends, fn returns an
// error or the server closes the stream (io.EOF). from nil starts with a
// snapshot of the current state; otherwise every commit after *from is
// replayed first.
func (c *Client) Watch(ctx context.Context, prefix string, from *uint64, fn func(Batch) error) error {
	q := url.Values{}
	if prefix != "" {
		q.Set("prefix", prefix)
	}
	if from != nil {
		q.Set("from", strconv.FormatUint(*from, 10))
	}
	path := "/v1/watch"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	resp, err := c.send(ctx, http.MethodGet, path, nil, "text/event-stream")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var fnErr error // an event's error, or fn's: returned as it is
	err = sse.Read(resp.Body, maxBody, func(_ string, data []byte) error {
		var b Batch
		if err := json.Unmarshal(data, &b); err != nil {
			fnErr = fmt.Errorf("watch: bad event: %w", err)
		} else if b.Error != "" {
			fnErr = fmt.Errorf("the server ended the watch: %s", b.Error)
		} else {
			fnErr = fn(b)
		}
		return fnErr
	})
	if fnErr != nil {
		return fnErr
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("watch: %w", err)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return io.EOF
}
