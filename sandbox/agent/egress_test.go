package agent

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEgressPull: an agent whose host holds no proxy socket (a box on
// another machine) carries each connection a process of the box makes to
// its egress address over a connection the server lent it, skipping lent
// connections whose server end has gone.
func TestEgressPull(t *testing.T) {
	c, egressAddr := startEgressAgent(t)

	// A lent connection whose server end went away before it is used:
	// it ends (EOF) but still takes writes, as a port-forward stream may
	// whose far end is gone.
	dead, err := c.upgrade(ctxT(t), "/v1/egress/pull", "test pull")
	require.NoError(t, err)
	defer dead.Close()
	require.NoError(t, dead.(*tunnelConn).CloseWrite())
	time.Sleep(100 * time.Millisecond) // the agent holds it

	// Then a live one; a process of the box connects.
	pulled := make(chan net.Conn, 1)
	go func() {
		conn, err := c.PullEgress(ctxT(t))
		assert.NoError(t, err)
		pulled <- conn
	}()
	var box net.Conn
	require.Eventually(t, func() bool {
		box, err = net.Dial("tcp", egressAddr)
		return err == nil
	}, 5*time.Second, 20*time.Millisecond, "the agent listens on the egress address")
	defer box.Close()
	_, err = io.WriteString(box, "CONNECT example:80 HTTP/1.1\r\n\r\n")
	require.NoError(t, err)

	var up net.Conn
	select {
	case up = <-pulled:
	case <-time.After(10 * time.Second):
		t.Fatal("the box's connection did not come out of the live lent connection")
	}
	require.NotNil(t, up)
	defer up.Close()
	line, err := bufio.NewReader(up).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "CONNECT example:80 HTTP/1.1\r\n", line, "what the box sent comes out at the server")
	_, err = io.WriteString(up, "HTTP/1.1 200 OK\r\n\r\n")
	require.NoError(t, err)
	box.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := bufio.NewReader(box).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "HTTP/1.1 200 OK\r\n", got, "and the server's answer reaches the box")
}

// TestEgressUnlent: while the server has lent nothing (it lends only to a
// box with an allow list), a box's connection to its proxy is refused
// soon, saying how to open the network.
func TestEgressUnlent(t *testing.T) {
	_, egressAddr := startEgressAgent(t)
	box, err := net.Dial("tcp", egressAddr)
	require.NoError(t, err)
	defer box.Close()
	io.WriteString(box, "GET http://example/ HTTP/1.1\r\nHost: example\r\n\r\n")
	box.SetReadDeadline(time.Now().Add(20 * time.Second))
	got, err := io.ReadAll(box)
	require.NoError(t, err)
	assert.Contains(t, string(got), "403 Forbidden")
	assert.Contains(t, string(got), "network_set")
}

// startEgressAgent serves an agent whose box forwards egressAddr to a
// proxy socket that does not exist (a box on another machine), and
// returns a client of it.
func startEgressAgent(t *testing.T) (*Client, string) {
	t.Helper()
	sockDir, err := os.MkdirTemp("", "cbeg")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	free, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	egressAddr := free.Addr().String()
	free.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, Options{Socket: filepath.Join(sockDir, "agent.sock"), Workspace: t.TempDir(),
			EgressListen: egressAddr, EgressSocket: filepath.Join(sockDir, "egress.sock"),
			Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	}()
	c := Dial(filepath.Join(sockDir, "agent.sock"))
	t.Cleanup(func() {
		c.Close()
		cancel()
		<-done
	})
	require.NoError(t, c.WaitReady(ctxT(t)))
	return c, egressAddr
}
