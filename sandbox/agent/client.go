package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cellbox/cellbox/internal/readall"
)

const (
	// maxJSONResponse caps a JSON response body from the agent.
	maxJSONResponse = 64 << 20
	// maxErrorResponse caps an error response body.
	maxErrorResponse = 1 << 20
	// maxFrame caps one NDJSON frame of a stream.
	maxFrame = 16 << 20
)

// Client talks to one agent over connections its DialFunc makes (a unix
// socket on this host, a stream through an engine's API). It is safe for
// concurrent use; connections are pooled (keep-alive).
type Client struct {
	dial     DialFunc
	watchDir string // a host directory the agent's socket appears in, or ""
	socket   string // the socket's path there, or ""
	hc       *http.Client
	tr       *http.Transport
	// heal, if set, is called when a request could not reach the agent
	// (see SetHeal).
	heal func(ctx context.Context) error
}

// SetHeal sets what the client does when a request cannot reach the
// agent at all — its socket is gone or refuses connections, so the
// request was never sent: heal (which brings the agent back on the same
// socket, or says why it cannot) runs, and the request is sent once more.
// This is how the pool checks a box's health only when a call fails,
// instead of pinging the agent before every call. Call it before the
// client is shared. A request under a context of WithoutHeal is not
// healed (the health check itself, which heal runs).
func (c *Client) SetHeal(heal func(ctx context.Context) error) { c.heal = heal }

type noHealKey struct{}

// WithoutHeal returns ctx under which a failed request does not call the
// client's heal.
func WithoutHeal(ctx context.Context) context.Context {
	return context.WithValue(ctx, noHealKey{}, true)
}

// undeliveredError is a failure to connect to the agent: nothing of the
// request was sent.
type undeliveredError struct{ err error }

func (e *undeliveredError) Error() string { return e.err.Error() }
func (e *undeliveredError) Unwrap() error { return e.err }

// DialFunc makes a new connection to an agent. An error means nothing was
// sent; one wrapping ErrNotSocket is a refusal (the client does not try to
// heal the box over it).
type DialFunc func(ctx context.Context) (net.Conn, error)

// Dial returns a Client for the agent listening at socketPath on this
// host (DialSocket). It does not connect; each call does (or reuses a
// pooled connection).
func Dial(socketPath string) *Client {
	c := NewClient(func(ctx context.Context) (net.Conn, error) { return DialSocket(ctx, socketPath) })
	c.watchDir, c.socket = filepath.Dir(socketPath), socketPath
	return c
}

// WatchSocket tells the client that the agent's socket appears at path on
// this host, so that WaitReady sleeps on an inotify watch of its directory
// until it does rather than dial every few milliseconds. Call it before
// the client is shared.
func (c *Client) WatchSocket(path string) { c.watchDir, c.socket = filepath.Dir(path), path }

// NewClient returns a Client whose connections dial makes. It does not
// connect; each call does (or reuses a pooled connection).
func NewClient(dial DialFunc) *Client {
	c := &Client{dial: dial}
	c.tr = &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			conn, err := c.dial(ctx)
			if err != nil && !errors.Is(err, ErrNotSocket) {
				err = &undeliveredError{err}
			}
			return conn, err
		},
		MaxIdleConns:        32,
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	c.hc = &http.Client{Transport: c.tr}
	return c
}

// ErrNotSocket is DialSocket's refusal of a path that is not a unix socket
// (a box put something else in its place).
var ErrNotSocket = errors.New("refusing to connect")

// DialSocket connects to an agent's unix socket at path on this host
// without following a link.
//
// The directory the socket lives in is writable by the box (the agent must
// be able to bind there), so the box can swap agent.sock for a symlink to a
// host socket (the Docker Engine's, the server's own) at any moment. A
// check-then-connect by name (lstat, then connect) loses that race. Instead
// the socket's inode is pinned first: open(O_PATH|O_NOFOLLOW) gives an fd
// for the file itself (a symlink stays a symlink, never followed), fstat of
// that fd must say "socket", and connect goes to /proc/self/fd/N, a magic
// link that resolves to exactly that inode whatever the name points to
// now. A socket inode in the box's directory can only have been bound by a
// process that sees that directory, i.e. the box itself: host sockets live
// on other mounts and cannot be hard-linked in (EXDEV). (Connecting through
// /proc/self/fd/DIRFD/agent.sock would not do: that walk follows a final
// symlink.)
func DialSocket(ctx context.Context, path string) (net.Conn, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("agent socket %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("agent socket %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("agent socket %s is not a unix socket (mode %#o); %w", path, st.Mode, ErrNotSocket)
	}
	var d net.Dialer
	return d.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
}

// Close drops the pooled connections.
func (c *Client) Close() error {
	c.tr.CloseIdleConnections()
	return nil
}

func (c *Client) url(path string, q url.Values) string {
	u := "http://cellbox-agent" + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return u
}

// do sends a request and returns the response if it is a 2xx from an agent
// speaking our protocol; otherwise an error (an *Error from the agent about
// the request where it sent one).
func (c *Client) do(ctx context.Context, method, path string, q url.Values, body io.Reader, contentType string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.url(path, q), body)
	if err != nil {
		return nil, fmt.Errorf("agent %s %s: %w", method, path, err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	// A streamed body is watched: if the request fails before a byte of
	// it was read, it can go again as it is.
	var streamed *readWatch
	if body != nil && req.GetBody == nil {
		streamed = &readWatch{r: body}
		req.Body = io.NopCloser(streamed)
	}
	resp, err := c.hc.Do(req)
	var ue *undeliveredError
	if err != nil && c.heal != nil && errors.As(err, &ue) && ctx.Err() == nil && ctx.Value(noHealKey{}) == nil && (streamed == nil || !streamed.read) {
		// Not sent: heal the agent and send it again.
		if herr := c.heal(ctx); herr != nil {
			return nil, fmt.Errorf("agent %s %s: %w", method, path, herr)
		}
		if req, err = retryRequest(req); err == nil {
			resp, err = c.hc.Do(req)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("agent %s %s: %w", method, path, err)
	}
	if err := checkProtocol(resp.Header); err != nil {
		resp.Body.Close()
		return nil, err
	}
	if resp.StatusCode/100 != 2 && resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		return nil, decodeError(path, resp)
	}
	return resp, nil
}

// retryRequest is req again: with a fresh copy of its body if it has
// one to make, else with its (unread) body.
func retryRequest(req *http.Request) (*http.Request, error) {
	r := req.Clone(req.Context())
	if req.GetBody != nil {
		b, err := req.GetBody()
		if err != nil {
			return nil, err
		}
		r.Body = b
	}
	return r, nil
}

// readWatch is a reader that notes whether it was read from.
type readWatch struct {
	r    io.Reader
	read bool
}

func (w *readWatch) Read(p []byte) (int, error) {
	w.read = true
	return w.r.Read(p)
}

func checkProtocol(h http.Header) error {
	v := h.Get(ProtocolHeader)
	if v == strconv.Itoa(ProtocolVersion) {
		return nil
	}
	got, _ := strconv.Atoi(v)
	return &ProtocolError{Got: got}
}

func decodeError(path string, resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorResponse))
	var we wireError
	if json.Unmarshal(b, &we) == nil && we.Error != nil {
		return remoteError(we.Error)
	}
	return fmt.Errorf("agent %s: %s: %s", path, resp.Status, bytes.TrimSpace(b))
}

// remoteError returns an *Error for errors about the request, a plain error
// for the agent's own failures.
func remoteError(e *Error) error {
	if e.Code == "" {
		return fmt.Errorf("agent: %s", e.Message)
	}
	return e
}

// call POSTs in as JSON (GET when in is nil) and decodes the JSON answer.
func (c *Client) call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	ct := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("agent %s: encode request: %w", path, err)
		}
		body, ct = bytes.NewReader(b), "application/json"
	}
	resp, err := c.do(ctx, method, path, nil, body, ct)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return decodeBody(path, resp.Body, out)
}

func decodeBody(path string, r io.Reader, out any) error {
	b, err := io.ReadAll(io.LimitReader(r, maxJSONResponse+1))
	if err != nil {
		return fmt.Errorf("agent %s: read response: %w", path, err)
	}
	if len(b) > maxJSONResponse {
		return fmt.Errorf("agent %s: response over %d bytes", path, maxJSONResponse)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("agent %s: decode response: %w", path, err)
	}
	return nil
}

// frameReader reads NDJSON frames of at most maxFrame bytes.
type frameReader struct {
	path string
	br   *bufio.Reader
	buf  []byte
}

func newFrameReader(path string, r io.Reader) *frameReader {
	return &frameReader{path: path, br: bufio.NewReaderSize(r, 64<<10)}
}

// next decodes the next frame into v; io.EOF at a clean end of stream.
func (f *frameReader) next(v any) error {
	f.buf = f.buf[:0]
	for {
		line, err := f.br.ReadSlice('\n')
		f.buf = append(f.buf, line...)
		if len(f.buf) > maxFrame {
			return fmt.Errorf("agent %s: stream frame over %d bytes", f.path, maxFrame)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err == io.EOF && len(f.buf) == 0 {
			return io.EOF
		}
		if err != nil && err != io.EOF {
			return fmt.Errorf("agent %s: read stream: %w", f.path, err)
		}
		if err == io.EOF {
			return fmt.Errorf("agent %s: stream ended mid-frame: %w", f.path, io.ErrUnexpectedEOF)
		}
		if err := json.Unmarshal(f.buf, v); err != nil {
			return fmt.Errorf("agent %s: decode stream frame: %w", f.path, err)
		}
		return nil
	}
}

// Version asks the agent who it is.
func (c *Client) Version(ctx context.Context) (Version, error) {
	var v Version
	err := c.call(ctx, http.MethodGet, "/v1/version", nil, &v)
	return v, err
}

// WaitReady waits until the agent answers or ctx ends; a protocol
// mismatch is returned at once. It does not poll blindly: until the
// agent's socket appears it sleeps on an inotify watch of the socket's
// directory (woken when the socket is created), and only then tries
// every millisecond — the moments between bind and listen. Where inotify
// is not to be had, it tries every 2 ms.
func (c *Client) WaitReady(ctx context.Context) error {
	var w *dirWatch
	if c.watchDir != "" {
		w = newDirWatch(c.watchDir)
	}
	defer w.close()
	for {
		_, err := c.Version(ctx)
		var pe *ProtocolError
		if err == nil || errors.As(err, &pe) {
			return err
		}
		wait := 2 * time.Millisecond
		if w != nil {
			wait = time.Millisecond
			if _, serr := os.Lstat(c.socket); serr != nil {
				// No socket yet: sleep until something is created in
				// its directory (or, in case an event is missed, 50 ms).
				if werr := w.wait(ctx, 50*time.Millisecond); werr == nil {
					continue
				}
			}
		}
		select {
		case <-ctx.Done():
			where := ""
			if c.socket != "" {
				where = " at " + c.socket
			}
			return fmt.Errorf("agent%s not ready: %w (last error: %v)", where, ctx.Err(), err)
		case <-time.After(wait):
		}
	}
}

// dirWatch is an inotify watch of a directory for entries created in it.
type dirWatch struct{ fd int }

// newDirWatch watches dir, or returns nil if inotify is not to be had.
func newDirWatch(dir string) *dirWatch {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		unix.Close(fd)
		return nil
	}
	return &dirWatch{fd: fd}
}

// close closes the watch in the background: closing an inotify instance
// waits for the kernel's fsnotify SRCU grace period (10-15 ms here), which
// was a quarter of every box's create+start → agent ready.
func (w *dirWatch) close() {
	if w != nil {
		go unix.Close(w.fd)
	}
}

// wait returns when an entry was created in the directory since the last
// call (nil), after limit, or when ctx ends (an error either way).
func (w *dirWatch) wait(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	buf := make([]byte, 4096)
	for {
		if n, _ := unix.Read(w.fd, buf); n > 0 {
			return nil // drained; what was created is looked at by the caller
		}
		left := time.Until(deadline)
		if left <= 0 {
			return context.DeadlineExceeded
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		// Poll in slices of at most 10 ms so that ctx is heard.
		ms := int(min(left, 10*time.Millisecond) / time.Millisecond)
		_, _ = unix.Poll([]unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}, max(ms, 1))
	}
}

// Exec runs a command to completion. onOutput (may be nil) sees the output
// as it comes, up to MaxOutput bytes per stream, the same bytes the result
// holds. Cancelling ctx kills the command's process group.
func (c *Client) Exec(ctx context.Context, req ExecRequest, onOutput func(stream string, data []byte)) (ExecResult, error) {
	var res ExecResult
	if onOutput == nil {
		err := c.call(ctx, http.MethodPost, "/v1/exec", req, &res)
		return res, err
	}
	b, err := json.Marshal(req)
	if err != nil {
		return res, fmt.Errorf("agent exec: encode request: %w", err)
	}
	resp, err := c.do(ctx, http.MethodPost, "/v1/exec", url.Values{"stream": {"1"}}, bytes.NewReader(b), "application/json")
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	fr := newFrameReader("/v1/exec", resp.Body)
	var stdout, stderr []byte
	for {
		var f execFrame
		if err := fr.next(&f); err != nil {
			if err == io.EOF {
				err = fmt.Errorf("agent exec: stream ended without a result: %w", io.ErrUnexpectedEOF)
			}
			return res, err
		}
		switch {
		case f.Error != nil:
			return res, remoteError(f.Error)
		case f.Result != nil:
			res = *f.Result
			res.Stdout = toUTF8(stdout, res.Truncated)
			res.Stderr = toUTF8(stderr, res.Truncated)
			return res, nil
		case f.Stream == "stdout":
			stdout = keepOutput(stdout, f.Data, req.Follow)
			onOutput(f.Stream, f.Data)
		case f.Stream == "stderr":
			stderr = keepOutput(stderr, f.Data, req.Follow)
			onOutput(f.Stream, f.Data)
		}
	}
}

// keepOutput adds a streamed chunk to what the result keeps: nothing when
// following (a server's output has no end), else up to maxOutputCap (the
// agent's own bound: a hostile agent sending more is not believed).
func keepOutput(kept, data []byte, follow bool) []byte {
	if follow {
		return kept
	}
	return append(kept, data[:min(len(data), max(maxOutputCap-len(kept), 0))]...)
}

// Start starts a background process and returns at once. Its combined
// output is kept in a 1 MiB ring buffer (see Logs). TimeoutMs, if set, kills
// it after that long.
func (c *Client) Start(ctx context.Context, req ExecRequest) (Process, error) {
	var p Process
	err := c.call(ctx, http.MethodPost, "/v1/proc", req, &p)
	return p, err
}

// KillAll ends every process of the box but the agent (background jobs
// included) and says how many it ended.
func (c *Client) KillAll(ctx context.Context) (int, error) {
	var res KillAllResult
	err := c.call(ctx, http.MethodPost, "/v1/proc/kill-all", struct{}{}, &res)
	return res.Ended, err
}

// Processes lists the running commands and the last finished background
// processes, oldest first.
func (c *Client) Processes(ctx context.Context) ([]Process, error) {
	var ps []Process
	err := c.call(ctx, http.MethodGet, "/v1/proc", nil, &ps)
	return ps, err
}

// Logs copies a background process's combined output from offset to w; with
// follow it streams until the process exits or ctx ends. If the ring buffer
// no longer holds offset, it starts at the oldest byte kept. It returns the
// offset to continue from.
func (c *Client) Logs(ctx context.Context, id string, offset int64, follow bool, w io.Writer) (int64, error) {
	_, next, err := c.LogsFrom(ctx, id, offset, follow, w)
	return next, err
}

// LogsFrom is Logs, and also returns the offset the output written to w
// starts at: past offset when the ring buffer had dropped the bytes from
// offset on (it keeps the last 1 MiB), below it when offset was past the end.
func (c *Client) LogsFrom(ctx context.Context, id string, offset int64, follow bool, w io.Writer) (start, next int64, err error) {
	q := url.Values{"offset": {strconv.FormatInt(offset, 10)}}
	if follow {
		q.Set("follow", "1")
	}
	resp, err := c.do(ctx, http.MethodGet, "/v1/proc/"+url.PathEscape(id)+"/logs", q, nil, "")
	if err != nil {
		return offset, offset, err
	}
	defer resp.Body.Close()
	start = offset
	if at, err := strconv.ParseInt(resp.Header.Get(logOffsetHeader), 10, 64); err == nil {
		start = at
	}
	n, err := io.Copy(w, resp.Body)
	next = start + n
	if err != nil {
		if ctx.Err() != nil {
			return start, next, ctx.Err()
		}
		return start, next, fmt.Errorf("agent logs %s: %w", id, err)
	}
	return start, next, nil
}

// Signal sends sig to the process's whole group.
func (c *Client) Signal(ctx context.Context, id string, sig syscall.Signal) error {
	return c.call(ctx, http.MethodPost, "/v1/proc/"+url.PathEscape(id)+"/signal", map[string]int{"signal": int(sig)}, nil)
}

// Wait waits until the process exits (or ctx ends).
func (c *Client) Wait(ctx context.Context, id string) (Process, error) {
	var p Process
	err := c.call(ctx, http.MethodPost, "/v1/proc/"+url.PathEscape(id)+"/wait", struct{}{}, &p)
	return p, err
}

type pathRequest struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive,omitempty"`
}

// Stat describes path (a symlink itself, not its target).
func (c *Client) Stat(ctx context.Context, path string) (FileInfo, error) {
	var fi FileInfo
	err := c.call(ctx, http.MethodPost, "/v1/fs/stat", pathRequest{Path: path}, &fi)
	return fi, err
}

// ReadFile reads a window of a file: lines, or a byte range.
//
// The content comes back as the raw response body and the rest in the
// readResultHeader header, so a large window is not JSON-encoded twice.
func (c *Client) ReadFile(ctx context.Context, req ReadRequest) (ReadResult, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return ReadResult{}, fmt.Errorf("agent read: encode request: %w", err)
	}
	resp, err := c.do(ctx, http.MethodPost, "/v1/fs/read", nil, bytes.NewReader(b), "application/json")
	if err != nil {
		return ReadResult{}, err
	}
	defer resp.Body.Close()
	var res ReadResult
	if err := json.Unmarshal([]byte(resp.Header.Get(readResultHeader)), &res); err != nil {
		return ReadResult{}, fmt.Errorf("agent read: bad %s header: %w", readResultHeader, err)
	}
	content, err := readall.String(resp.Body, resp.ContentLength, maxJSONResponse+1)
	if err != nil {
		return ReadResult{}, fmt.Errorf("agent read: read response: %w", err)
	}
	if len(content) > maxJSONResponse {
		return ReadResult{}, fmt.Errorf("agent read: response over %d bytes", maxJSONResponse)
	}
	res.Content = content
	return res, nil
}

// WriteFile creates parent dirs and writes atomically (temp + rename, except
// append); an existing file keeps its mode.
//
// The data travels as the raw request body (no JSON, no base64): a large
// write costs a copy, not an encoding.
func (c *Client) WriteFile(ctx context.Context, req WriteRequest) (WriteResult, error) {
	return c.WriteFileFrom(ctx, req, bytes.NewReader(req.Data))
}

// WriteFileFrom is WriteFile with the data read from data, a
// *bytes.Reader or a *strings.Reader (req.Data is not used): write_file
// hands its content string over as it is, not copied into bytes first.
func (c *Client) WriteFileFrom(ctx context.Context, req WriteRequest, data io.Reader) (WriteResult, error) {
	q := url.Values{"path": {req.Path}}
	if req.Append {
		q.Set("append", "1")
	}
	if req.MaxBytes != 0 {
		q.Set("max_bytes", strconv.FormatInt(req.MaxBytes, 10))
	}
	if req.Mode != 0 {
		q.Set("mode", strconv.FormatUint(uint64(req.Mode), 8))
	}
	// A *bytes.Reader or *strings.Reader as it is: the request announces
	// its length (the agent reads it into one buffer of that size) and can
	// be sent again.
	resp, err := c.do(ctx, http.MethodPost, "/v1/fs/write", q, data, "application/octet-stream")
	if err != nil {
		return WriteResult{}, err
	}
	defer resp.Body.Close()
	var res WriteResult
	err = decodeBody("/v1/fs/write", resp.Body, &res)
	return res, err
}

// copyStream copies a raw byte stream body to w and reports an error the
// agent sent in the trailer after the body.
func copyStream(op string, resp *http.Response, w io.Writer) (int64, error) {
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("agent %s: %w", op, err)
	}
	if msg := resp.Trailer.Get(errorTrailer); msg != "" {
		var e Error
		if json.Unmarshal([]byte(msg), &e) == nil {
			return n, remoteError(&e)
		}
		return n, fmt.Errorf("agent %s: %s", op, msg)
	}
	return n, nil
}

// Download copies a file's bytes to w.
func (c *Client) Download(ctx context.Context, path string, w io.Writer) (int64, error) {
	resp, err := c.do(ctx, http.MethodGet, "/v1/fs/download", url.Values{"path": {path}}, nil, "")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return copyStream("download "+path, resp, w)
}

// countingReader counts the bytes read through it. The count is atomic:
// when the agent answers before the whole body is sent (an extraction that
// fails on a full disk), the transport may still be reading while the
// caller reads the count.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// Upload writes r's bytes to path atomically (no size cap) and returns the
// size written. mode is for a new file (0 = 0644); an existing file keeps its
// mode.
func (c *Client) Upload(ctx context.Context, path string, r io.Reader, mode uint32) (int64, error) {
	cr := &countingReader{r: r}
	q := url.Values{"path": {path}}
	if mode != 0 {
		q.Set("mode", strconv.FormatUint(uint64(mode), 8))
	}
	resp, err := c.do(ctx, http.MethodPut, "/v1/fs/upload", q, io.NopCloser(cr), "application/octet-stream")
	if err != nil {
		return cr.n.Load(), err
	}
	defer resp.Body.Close()
	var res WriteResult
	if err := decodeBody("/v1/fs/upload", resp.Body, &res); err != nil {
		return cr.n.Load(), err
	}
	return res.Size, nil
}

// Mkdir creates a directory and its parents.
func (c *Client) Mkdir(ctx context.Context, path string) error {
	return c.call(ctx, http.MethodPost, "/v1/fs/mkdir", pathRequest{Path: path}, nil)
}

// Remove removes a file, symlink or empty directory; recursive removes a tree.
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	return c.call(ctx, http.MethodPost, "/v1/fs/remove", pathRequest{Path: path, Recursive: recursive}, nil)
}

type treeRequest struct {
	Path       string `json:"path"`
	Depth      int    `json:"depth,omitempty"`
	MaxEntries int    `json:"max_entries,omitempty"`
}

type treeResult struct {
	Root      TreeEntry `json:"root"`
	Truncated bool      `json:"truncated,omitempty"`
}

// Tree lists a directory depth levels deep (0 = 2), at most maxEntries
// entries (0 = 1000); every Path in it is absolute.
func (c *Client) Tree(ctx context.Context, path string, depth int, maxEntries int) (TreeEntry, bool, error) {
	var res treeResult
	err := c.call(ctx, http.MethodPost, "/v1/fs/tree", treeRequest{Path: path, Depth: depth, MaxEntries: maxEntries}, &res)
	return res.Root, res.Truncated, err
}

type globRequest struct {
	Pattern string `json:"pattern"`
	Cwd     string `json:"cwd,omitempty"`
	Max     int    `json:"max,omitempty"`
}

type globResult struct {
	Paths     []string `json:"paths"`
	Truncated bool     `json:"truncated,omitempty"`
}

// Glob returns the files (not directories) matching pattern, sorted and
// absolute. Patterns support *, ?, [...], {a,b} and ** (any number of
// directories); relative patterns are taken against cwd (default the
// workspace). max 0 = 1000.
func (c *Client) Glob(ctx context.Context, pattern, cwd string, max int) ([]string, bool, error) {
	var res globResult
	err := c.call(ctx, http.MethodPost, "/v1/fs/glob", globRequest{Pattern: pattern, Cwd: cwd, Max: max}, &res)
	return res.Paths, res.Truncated, err
}

// Grep searches the text files under req.Path (default the workspace).
func (c *Client) Grep(ctx context.Context, req GrepRequest) (GrepResult, error) {
	var res GrepResult
	err := c.call(ctx, http.MethodPost, "/v1/fs/grep", req, &res)
	return res, err
}

// TarOut writes a tar of path (a file or a tree; entries named relative to
// path's parent, base name first) to w and returns the tar's size.
func (c *Client) TarOut(ctx context.Context, path string, w io.Writer) (int64, error) {
	resp, err := c.do(ctx, http.MethodGet, "/v1/fs/tar", url.Values{"path": {path}}, nil, "")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return copyStream("tar "+path, resp, w)
}

// TarIn extracts the tar read from r under dir (created if missing) and
// returns the tar's size. Entries that would land outside dir (.., absolute
// names, links pointing out) fail the extraction.
func (c *Client) TarIn(ctx context.Context, dir string, r io.Reader) (int64, error) {
	cr := &countingReader{r: r}
	resp, err := c.do(ctx, http.MethodPut, "/v1/fs/tar", url.Values{"dir": {dir}}, io.NopCloser(cr), "application/x-tar")
	if err != nil {
		return cr.n.Load(), err
	}
	defer resp.Body.Close()
	return cr.n.Load(), decodeBody("/v1/fs/tar", resp.Body, nil)
}

// watchFrame is one NDJSON frame of a watch stream.
type watchFrame struct {
	Ready  bool    `json:"ready,omitempty"`
	Events []Event `json:"events,omitempty"`
	Error  *Error  `json:"error,omitempty"`
}

// Watch watches a tree recursively and delivers debounced batches of events
// until ctx ends (or the stream fails); the channel is closed then. It
// returns once the watch is in place.
func (c *Client) Watch(ctx context.Context, path string, debounce time.Duration) (<-chan []Event, error) {
	q := url.Values{"path": {path}}
	if debounce > 0 {
		q.Set("debounce_ms", strconv.FormatInt(debounce.Milliseconds(), 10))
	}
	resp, err := c.do(ctx, http.MethodGet, "/v1/watch", q, nil, "")
	if err != nil {
		return nil, err
	}
	fr := newFrameReader("/v1/watch", resp.Body)
	var f watchFrame
	if err := fr.next(&f); err != nil || !f.Ready {
		resp.Body.Close()
		if f.Error != nil {
			return nil, remoteError(f.Error)
		}
		return nil, fmt.Errorf("agent watch %s: no ready frame: %v", path, err)
	}
	ch := make(chan []Event)
	go func() {
		defer close(ch)
		defer resp.Body.Close()
		for {
			var f watchFrame
			if err := fr.next(&f); err != nil || f.Error != nil {
				return
			}
			if len(f.Events) == 0 {
				continue
			}
			select {
			case ch <- f.Events:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}

// tunnelConn is the connection of a port tunnel; bytes the HTTP reader
// buffered past the upgrade response are read first.
type tunnelConn struct {
	net.Conn
	r io.Reader
}

func (t *tunnelConn) Read(p []byte) (int, error) { return t.r.Read(p) }

// CloseWrite half-closes where the connection underneath can (a unix
// socket, a port-forward stream, an exec stream); else it closes.
func (t *tunnelConn) CloseWrite() error {
	if cw, ok := t.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return t.Conn.Close()
}

// DialPort connects to 127.0.0.1:port inside the box. The returned
// connection supports CloseWrite.
func (c *Client) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port <= 0 || port > 65535 {
		return nil, &Error{Op: "port", Code: CodeInvalid, Message: fmt.Sprintf("port %d: not a TCP port", port)}
	}
	return c.upgrade(ctx, fmt.Sprintf("/v1/port/%d", port), fmt.Sprintf("agent port %d", port))
}

// PullEgress lends the agent a connection for the box's egress, for a
// box whose host holds no proxy socket (a remote backend's): it waits
// until a process of the box connects to its egress address
// (127.0.0.1:3128) and returns that connection, carrying what the process
// sends to its proxy, for the server's egress proxy to serve. Until then
// the agent holds it idle; ctx ending closes it.
func (c *Client) PullEgress(ctx context.Context) (net.Conn, error) {
	conn, err := c.upgrade(ctx, "/v1/egress/pull", "agent egress pull")
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	var mark [1]byte
	_, err = io.ReadFull(conn, mark[:])
	if !stop() {
		return nil, ctx.Err()
	}
	if err != nil || mark[0] != egressMark {
		conn.Close()
		if err == nil {
			err = fmt.Errorf("unexpected byte %q", mark[0])
		}
		return nil, fmt.Errorf("agent egress pull: %w", err)
	}
	return conn, nil
}

// upgrade makes a new connection to the agent and turns it into a raw
// tunnel with GET path (Upgrade: tcp); what names the tunnel in errors.
func (c *Client) upgrade(ctx context.Context, path, what string) (net.Conn, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	req := "GET " + path + " HTTP/1.1\r\nHost: cellbox-agent\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		conn.Close()
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := checkProtocol(resp.Header); err != nil {
		conn.Close()
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		err := decodeError(path, resp)
		conn.Close()
		return nil, err
	}
	if !stop() {
		conn.Close()
		return nil, fmt.Errorf("%s: %w", what, ctx.Err())
	}
	var r io.Reader = conn
	if n := br.Buffered(); n > 0 {
		buffered, _ := br.Peek(n)
		r = io.MultiReader(bytes.NewReader(bytes.Clone(buffered)), conn)
	}
	return &tunnelConn{Conn: conn, r: r}, nil
}
