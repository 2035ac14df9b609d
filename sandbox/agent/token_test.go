package agent

import (
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A TCP agent serves only connections that open with its token: a client
// without it (another pod reaching the port, a port-forward without the
// box's secret) gets the connection closed, unanswered, and no request of
// its runs.
func TestTCPAgentNeedsItsToken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	addr := "127.0.0.1:" + strconv.Itoa(port)
	token := strings.Repeat("k", 40)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, Options{Socket: "tcp:" + addr, Token: token, Workspace: t.TempDir()})
	}()
	t.Cleanup(func() { cancel(); <-done })

	dial := func(tok string) (net.Conn, error) {
		var c net.Conn
		var err error
		for i := 0; i < 200; i++ {
			if c, err = net.Dial("tcp", addr); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			return nil, err
		}
		if err := Handshake(c, tok, time.Now().Add(5*time.Second)); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}

	cl := NewClient(func(context.Context) (net.Conn, error) { return dial(token) })
	defer cl.Close()
	v, err := cl.Version(ctx)
	require.NoError(t, err)
	assert.Equal(t, ProtocolVersion, v.Protocol)

	_, err = dial(strings.Repeat("x", 40))
	assert.Error(t, err, "a wrong token is refused")

	// A client that skips the handshake and speaks HTTP at once gets no
	// answer: the request line is not a greeting.
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "GET /v1/version HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, _ := io.ReadAll(c)
	assert.Empty(t, got, "no answer without the token")

	// A short token is refused before the agent listens.
	err = Serve(ctx, Options{Socket: "tcp:127.0.0.1:0", Token: "short", Workspace: t.TempDir()})
	assert.ErrorContains(t, err, "token of at least")
}

// TestWaitShut: the agent of a box without network waits while the
// address it tries still answers, and goes on once it does not.
func TestWaitShut(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	shut := make(chan time.Time, 1)
	time.AfterFunc(500*time.Millisecond, func() { ln.Close(); shut <- time.Now() })
	require.NoError(t, WaitShut(context.Background(), addr))
	select {
	case <-shut:
	default:
		t.Fatal("WaitShut returned while the address still answered")
	}

	ctx, cancel := context.WithCancel(context.Background())
	open, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer open.Close()
	time.AfterFunc(300*time.Millisecond, cancel)
	assert.ErrorIs(t, WaitShut(ctx, open.Addr().String()), context.Canceled, "a stopped agent stops waiting")
}
