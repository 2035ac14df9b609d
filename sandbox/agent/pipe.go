package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
)

// PipeReady is the byte Pipe writes once it is connected to the agent:
// the other end of the pipe (a remote engine's exec stream) reads it before
// it sends a request, so a pipe that could not connect (no agent yet) is
// told from one that dropped a request.
const PipeReady = 0x06

// Pipe connects to the agent's socket and carries one connection over in
// and out (`cellbox agent --connect`, run in a box by a backend whose boxes
// are on another machine: the engine's exec stream is the connection). It
// writes PipeReady first; it returns when the agent ends the connection
// (after in has ended, or on its own).
func Pipe(ctx context.Context, socket string, in io.Reader, out io.Writer) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return fmt.Errorf("connect to the agent at %s: %w", socket, err)
	}
	defer conn.Close()
	if _, err := out.Write([]byte{PipeReady}); err != nil {
		return err
	}
	go func() {
		io.Copy(conn, in)
		if uc, ok := conn.(*net.UnixConn); ok {
			uc.CloseWrite() // the requests are done; their answers may still come
		}
	}()
	// Done when the agent is: it closes once the other end has closed.
	_, err = io.Copy(out, conn)
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
