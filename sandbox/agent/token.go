package agent

import (
	"bufio"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"
)

// A TCP agent (Options.Socket "tcp:HOST:PORT") takes only connections that
// open with the box's token: the line "CELLBOX-AGENT <token>\n", answered
// with PipeReady. The handshake is the agent's own (not an HTTP header) so
// that it guards every route, the hijacked ones (DialPort, Watch) too,
// and is checked before the HTTP server reads a byte of a request.

const (
	tcpPrefix      = "tcp:"
	tokenGreeting  = "CELLBOX-AGENT "
	handshakeLimit = 10 * time.Second
	// MinTokenLen is the shortest token a TCP agent takes.
	MinTokenLen = 32
)

// ErrBadToken is what a TCP agent's connection fails with when it does
// not open with the box's token: the connection is closed unanswered.
var ErrBadToken = errors.New("agent: the connection did not open with the box's token")

// listen opens the agent's listener: a unix socket, or a TCP address whose
// connections must pass the token handshake.
func listen(opts Options) (net.Listener, error) {
	addr, ok := strings.CutPrefix(opts.Socket, tcpPrefix)
	if !ok {
		ln, err := net.Listen("unix", opts.Socket)
		if err != nil {
			return nil, fmt.Errorf("agent: listen on %s: %w", opts.Socket, err)
		}
		return ln, nil
	}
	if len(opts.Token) < MinTokenLen {
		return nil, fmt.Errorf("agent: listening on %s needs a token of at least %d characters (CELLBOX_AGENT_TOKEN)", addr, MinTokenLen)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("agent: listen on %s: %w", addr, err)
	}
	return &tokenListener{Listener: ln, token: []byte(opts.Token)}, nil
}

// tokenListener hands out connections that check the token on their first
// read: Accept itself never waits on a client, so a slow or silent one
// holds up no other.
type tokenListener struct {
	net.Listener
	token []byte
}

func (l *tokenListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &tokenConn{Conn: c, token: l.token}, nil
}

type tokenConn struct {
	net.Conn
	token []byte
	once  sync.Once
	r     io.Reader // after the handshake: what the greeting's reader buffered, then the conn
	err   error
}

func (c *tokenConn) Read(p []byte) (int, error) {
	c.once.Do(c.handshake)
	if c.err != nil {
		return 0, c.err
	}
	return c.r.Read(p)
}

func (c *tokenConn) Write(p []byte) (int, error) {
	c.once.Do(c.handshake)
	if c.err != nil {
		return 0, c.err
	}
	return c.Conn.Write(p)
}

// handshake reads the greeting (bounded in size and time) and compares
// its token in constant time; a match is answered with PipeReady.
func (c *tokenConn) handshake() {
	c.Conn.SetReadDeadline(time.Now().Add(handshakeLimit))
	br := bufio.NewReaderSize(io.LimitReader(c.Conn, 512), 512)
	line, err := br.ReadString('\n')
	c.Conn.SetReadDeadline(time.Time{})
	got, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), tokenGreeting)
	if err != nil || !ok || subtle.ConstantTimeCompare([]byte(got), c.token) != 1 {
		c.err = ErrBadToken
		c.Conn.Close()
		return
	}
	if _, err := c.Conn.Write([]byte{PipeReady}); err != nil {
		c.err = err
		return
	}
	// Nothing follows the greeting before PipeReady is read, so the
	// buffer holds at most what a client sent early; keep it.
	c.r = io.MultiReader(io.LimitReader(br, int64(br.Buffered())), c.Conn)
}

// CloseWrite passes a half-close on (DialPort's conns need it).
func (c *tokenConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// Handshake opens conn, a connection to a TCP agent, with token and waits
// for the agent's PipeReady (until ctx-independent deadline dl, zero for
// none). An error means the agent did not take the connection: it is not
// listening yet, or the token is wrong (then the agent closed it
// unanswered).
func Handshake(conn net.Conn, token string, dl time.Time) error {
	conn.SetDeadline(dl)
	defer conn.SetDeadline(time.Time{})
	if _, err := io.WriteString(conn, tokenGreeting+token+"\n"); err != nil {
		return err
	}
	var b [1]byte
	if _, err := io.ReadFull(conn, b[:]); err != nil {
		return fmt.Errorf("the agent did not take the connection: %w", err)
	}
	if b[0] != PipeReady {
		return fmt.Errorf("the agent answered %q, not that it is connected", b[:])
	}
	return nil
}

// EnvToken is the environment variable a TCP agent reads its token from
// (and removes from its environment before it runs anything).
const EnvToken = "CELLBOX_AGENT_TOKEN"

// InstallSelf copies the running binary to dst with mode 0555, through a
// temporary file renamed into place, so that a box never sees half a
// binary (`cellbox agent --install`).
func InstallSelf(dst string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("agent install: %w", err)
	}
	in, err := os.Open(self)
	if err != nil {
		return fmt.Errorf("agent install: %w", err)
	}
	defer in.Close()
	tmp := dst + ".part"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o555)
	if err != nil {
		return fmt.Errorf("agent install: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		os.Remove(tmp)
		return fmt.Errorf("agent install: copy to %s: %w", dst, err)
	}
	if err := out.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("agent install: %w", err)
	}
	return os.Rename(tmp, dst)
}

// Probe tries TCP connections to addr, one every probeEvery, for up to
// probeFor (`cellbox agent --probe`, the Kubernetes backend's network
// policy probe). Without blocked it returns nil at the first that
// connects (a pod without a policy reaches addr). With blocked it returns
// an error at the first that fails (a deny-all policy took hold: the
// enforcer programs a new pod's rules some time after it starts, seconds
// on a busy node) and nil if every one connected for probeFor (nothing
// enforces the policy).
func Probe(ctx context.Context, addr string, blocked bool) error {
	return probe(ctx, addr, blocked, probeEvery)
}

// WaitShut returns once a TCP connection to addr fails (`cellbox agent
// --egress-shut`): the agent of a Kubernetes box without network answers
// no one until its pod's deny-all policy holds, which the network plugin
// programs some time after the pod starts. If addr still answers after
// probeFor it returns an error, and the agent does not serve.
func WaitShut(ctx context.Context, addr string) error {
	err := probe(ctx, addr, true, shutEvery)
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		return nil // shut
	}
	return fmt.Errorf("this box should have no network, but %s still answered %s after it started: its NetworkPolicy did not take hold, so the agent will not serve it (is the cluster's network plugin still enforcing policies?)", addr, probeFor)
}

func probe(ctx context.Context, addr string, blocked bool, every time.Duration) error {
	deadline := time.Now().Add(probeFor)
	var last error
	for {
		d := net.Dialer{Timeout: every}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
			if !blocked {
				return nil
			}
		} else if blocked {
			return fmt.Errorf("probe %s: blocked: %w", addr, err)
		}
		last = err
		if time.Now().After(deadline) {
			if blocked {
				return nil // never blocked
			}
			return fmt.Errorf("probe %s: %w", addr, last)
		}
		select {
		case <-time.After(every):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

const (
	probeFor   = 45 * time.Second
	probeEvery = time.Second
	shutEvery  = 100 * time.Millisecond // a box's start waits on it
)
