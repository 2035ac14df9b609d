// Package netpipe joins two connections into one byte stream: the agent's
// port tunnels and egress forwarder, and the host's egress proxy's CONNECT
// tunnels all need the same careful copy.
package netpipe

import (
	"io"
	"net"
)

// Pipe copies a<->b until both directions end. ar is what to read a
// through (a bufio.Reader holding bytes already read from a), nil for a
// itself. Each write side is half-closed as its source ends, so a client
// that shuts down its sending side still gets the answer; an error in
// either direction closes both connections, so neither copy hangs.
func Pipe(a net.Conn, ar io.Reader, b net.Conn) {
	if ar == nil {
		ar = a
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := io.Copy(b, ar); err != nil {
			a.Close()
			b.Close()
		}
		closeWrite(b)
	}()
	if _, err := io.Copy(a, b); err != nil {
		a.Close()
		b.Close()
	}
	closeWrite(a)
	<-done
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}
