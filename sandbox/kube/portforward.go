package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"

	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/backend"
)

// The server reaches a box's agent through the API server: one
// port-forward connection (SPDY, or SPDY over WebSocket where the API
// server offers it) a pod, kept open, and two streams of it (data and
// error) a net.Conn, each opened with the box's token (agent.Handshake).
// The agent listens on 127.0.0.1 in the pod: nothing but a port-forward,
// which needs the RBAC verb pods/portforward, reaches it, and the token
// keeps out whoever has that verb but not the box's secret.

// forwarder is the port-forward connection of one pod.
type forwarder struct {
	conn    httpstream.Connection
	uid     string // the pod's UID: a new pod of the same name needs a new connection
	next    atomic.Int64
	active  atomic.Int64 // its streamConns not closed
	retired atomic.Bool  // no longer handed out; closed when active reaches 0
}

// retire stops handing f out (it stalled) without cutting the calls
// under way on it: its connection is closed when the last of its
// streamConns is.
func (b *Backend) retire(pod string, f *forwarder) {
	b.fw.mu.Lock()
	if b.fw.m[pod] == f {
		delete(b.fw.m, pod)
	}
	b.fw.mu.Unlock()
	f.retired.Store(true)
	if f.active.Load() == 0 {
		f.conn.Close()
	}
}

// forwarders keeps one forwarder a pod.
type forwarders struct {
	mu   sync.Mutex
	m    map[string]*forwarder // pod name → connection
	lost map[types.UID]string  // pods whose port-forward failed → why
}

// get returns the pod's forwarder, opening one if there is none or the one
// there is closed or for another pod of the same name.
func (b *Backend) forwarder(ctx context.Context, pod *corev1.Pod) (*forwarder, error) {
	b.fw.mu.Lock()
	defer b.fw.mu.Unlock()
	if f := b.fw.m[pod.Name]; f != nil {
		select {
		case <-f.conn.CloseChan():
		default:
			if f.uid == string(pod.UID) {
				return f, nil
			}
			f.conn.Close()
		}
		delete(b.fw.m, pod.Name)
	}
	url := b.c.core.Post().Resource("pods").Namespace(b.ns).Name(pod.Name).SubResource("portforward").URL()
	rt, upgrader, err := spdy.RoundTripperFor(b.rest)
	if err != nil {
		return nil, err
	}
	d := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, http.MethodPost, url)
	if ws, err := portforward.NewSPDYOverWebsocketDialer(url, b.rest); err == nil {
		d = portforward.NewFallbackDialer(ws, d, func(err error) bool {
			return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
		})
	}
	type result struct {
		c   httpstream.Connection
		err error
	}
	ch := make(chan result, 1)
	go func() { // Dial takes no context: a dial that outlives ctx is closed when it ends
		c, _, err := d.Dial(portforward.PortForwardProtocolV1Name)
		ch <- result{c, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, r.err
		}
		f := &forwarder{conn: r.c, uid: string(pod.UID)}
		b.fw.m[pod.Name] = f
		return f, nil
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.c != nil {
				r.c.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// dropForwarder closes and forgets pod's forwarder (the pod is gone).
func (b *Backend) dropForwarder(pod string) {
	b.fw.mu.Lock()
	defer b.fw.mu.Unlock()
	if f := b.fw.m[pod]; f != nil {
		f.conn.Close()
		delete(b.fw.m, pod)
	}
}

// dialAgent opens a stream to the agent's port in pod and hands the token
// over. An error wraps backend.ErrNotReady: nothing was sent but the
// handshake.
func (b *Backend) dialAgent(ctx context.Context, pod *corev1.Pod, token string) (net.Conn, error) {
	var f *forwarder
	var data, errStream httpstream.Stream
	for try := 0; ; try++ {
		var err error
		if f, err = b.forwarder(ctx, pod); err != nil {
			// The API server's "error dialing backend": it could not
			// reach the pod's kubelet. Any other failure (the API server
			// itself unreachable, a refusal) says nothing of the node.
			if ctx.Err() == nil && strings.Contains(err.Error(), "dialing backend") {
				b.lost(pod, err)
			}
			return nil, fmt.Errorf("port-forward to pod %s: %w: %w", pod.Name, backend.ErrNotReady, err)
		}
		b.found(pod)
		if data, errStream, err = b.streams(ctx, f, pod.Name); err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("port-forward to pod %s: %w: %w", pod.Name, backend.ErrNotReady, err)
		}
		// A connection that makes no streams (seen on the test cluster:
		// a pod's first one, now and then, answered none for 30 s) is
		// retired; a new one is tried once, as nothing was sent yet.
		b.retire(pod.Name, f)
		if try > 0 {
			return nil, fmt.Errorf("port-forward to pod %s: %w: %w", pod.Name, backend.ErrNotReady, err)
		}
		b.log.Warn("kubernetes backend: a port-forward connection made no stream; trying a new one", "pod", pod.Name, "err", err)
	}
	f.active.Add(1)
	c := &streamConn{f: f, data: data, errs: errStream, pod: pod.Name, failed: make(chan struct{})}
	go c.watchErrors()
	dl, _ := ctx.Deadline()
	if d := time.Now().Add(handshakeTimeout); dl.IsZero() || d.Before(dl) {
		dl = d
	}
	if err := agent.Handshake(c, token, dl); err != nil {
		c.Close()
		if msg := c.failure(); msg != "" {
			err = errors.New(msg)
		}
		return nil, fmt.Errorf("dial the agent of pod %s: %w: %w", pod.Name, backend.ErrNotReady, err)
	}
	return c, nil
}

// streams makes the error and data streams of a new port-forward request
// on f. Making a stream waits for the far end's reply (30 s in
// httpstream, deaf to the connection's closing and to ctx): it runs on
// its own, the caller leaves when ctx ends or after streamTimeout, and
// past streamTimeout f is retired (even if every caller left), so that
// later dials make a new connection rather than queue on one that
// stalled.
func (b *Backend) streams(ctx context.Context, f *forwarder, pod string) (data, errStream httpstream.Stream, err error) {
	type made struct {
		data, errs httpstream.Stream
		err        error
	}
	ch := make(chan made, 1)
	go func() {
		timer := time.AfterFunc(streamTimeout, func() { b.retire(pod, f) })
		defer timer.Stop()
		h := http.Header{}
		h.Set(corev1.StreamType, corev1.StreamTypeError)
		h.Set(corev1.PortHeader, strconv.Itoa(agentPort))
		h.Set(corev1.PortForwardRequestIDHeader, strconv.FormatInt(f.next.Add(1), 10))
		errs, err := f.conn.CreateStream(h)
		if err != nil {
			ch <- made{err: err}
			return
		}
		errs.Close() // nothing is written to it
		h.Set(corev1.StreamType, corev1.StreamTypeData)
		data, err := f.conn.CreateStream(h)
		if err != nil {
			f.conn.RemoveStreams(errs)
		}
		ch <- made{data, errs, err}
	}()
	stalled := time.NewTimer(streamTimeout)
	defer stalled.Stop()
	select {
	case m := <-ch:
		return m.data, m.errs, m.err
	case <-ctx.Done():
		err = ctx.Err()
	case <-stalled.C:
		err = fmt.Errorf("no stream within %s", streamTimeout)
	}
	go func() { // made after all: nobody wants them now
		if m := <-ch; m.err == nil {
			m.data.Reset()
			m.errs.Reset()
			f.conn.RemoveStreams(m.data, m.errs)
		}
	}()
	return nil, nil, err
}

// streamTimeout bounds making a port-forward request's streams.
// (milliseconds when all is well; a second or so on a loaded node). One
// that stalls is retired (retire), not closed: calls under way on it go
// on.
const streamTimeout = 3 * time.Second

// handshakeTimeout bounds the token handshake through the API server.
const handshakeTimeout = 10 * time.Second

// streamConn is a port-forward data stream as a net.Conn. Deadlines are
// emulated: a stream has none, so a deadline that passes resets the
// stream (reads and writes then fail), which is what its users want of
// one (an abandoned call).
type streamConn struct {
	f      *forwarder
	data   httpstream.Stream
	errs   httpstream.Stream
	pod    string
	mu     sync.Mutex
	timer  *time.Timer
	msg    string
	failed chan struct{}
	closed atomic.Bool
}

// watchErrors reads the error stream: the kubelet writes there when it
// cannot reach the port (nothing listens yet), then the stream ends.
func (c *streamConn) watchErrors() {
	b, _ := io.ReadAll(io.LimitReader(c.errs, 4096))
	if len(b) > 0 {
		c.mu.Lock()
		c.msg = string(b)
		c.mu.Unlock()
		close(c.failed)
		c.data.Reset()
	}
}

func (c *streamConn) failure() string {
	select {
	case <-c.failed:
	case <-time.After(50 * time.Millisecond): // the error stream may lag the data stream's end
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.msg
}

func (c *streamConn) Read(p []byte) (int, error)  { return c.data.Read(p) }
func (c *streamConn) Write(p []byte) (int, error) { return c.data.Write(p) }

// CloseWrite half-closes: the agent reads EOF, its answer still comes.
func (c *streamConn) CloseWrite() error { return c.data.Close() }

func (c *streamConn) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	c.mu.Lock()
	if c.timer != nil {
		c.timer.Stop()
	}
	c.mu.Unlock()
	c.data.Reset()
	c.errs.Reset()
	c.f.conn.RemoveStreams(c.data, c.errs)
	if c.f.active.Add(-1) == 0 && c.f.retired.Load() {
		c.f.conn.Close()
	}
	return nil
}

func (c *streamConn) LocalAddr() net.Addr  { return pfAddr(c.pod) }
func (c *streamConn) RemoteAddr() net.Addr { return pfAddr(c.pod) }

func (c *streamConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	if t.IsZero() {
		return nil
	}
	c.timer = time.AfterFunc(time.Until(t), func() { c.data.Reset() })
	return nil
}

func (c *streamConn) SetReadDeadline(t time.Time) error  { return c.SetDeadline(t) }
func (c *streamConn) SetWriteDeadline(t time.Time) error { return c.SetDeadline(t) }

// pfAddr names a port-forward's end.
type pfAddr string

func (a pfAddr) Network() string { return "portforward" }
func (a pfAddr) String() string  { return "pod/" + string(a) + ":" + strconv.Itoa(agentPort) }

// A pod whose port-forward fails although the API says it runs is on a
// node that does not answer (its kubelet dead or cut off): the API
// learns of it only after the node monitor's grace period, the
// port-forward at once. lost notes it, found forgets it; podState reads it.
func (b *Backend) lost(pod *corev1.Pod, err error) {
	b.fw.mu.Lock()
	defer b.fw.mu.Unlock()
	b.fw.lost[pod.UID] = err.Error()
}

func (b *Backend) found(pod *corev1.Pod) {
	b.fw.mu.Lock()
	defer b.fw.mu.Unlock()
	delete(b.fw.lost, pod.UID)
}

// unreachable says why pod's node does not answer, or "".
func (b *Backend) unreachable(pod *corev1.Pod) string {
	b.fw.mu.Lock()
	defer b.fw.mu.Unlock()
	return b.fw.lost[pod.UID]
}
