package netpipe

import (
	"net"
	"sync"
)

// Listener is a net.Listener whose connections are handed to it
// (Deliver) rather than accepted from a socket: the egress proxy of a box
// on another machine serves the connections its agent carries back over
// connections the server opened (agent.Client.PullEgress). net/http
// serves any net.Listener; nothing in the standard library makes one of a
// stream of conns, hence this one.
type Listener struct {
	conns chan net.Conn
	once  sync.Once
	done  chan struct{}
}

// NewListener returns an open Listener.
func NewListener() *Listener {
	return &Listener{conns: make(chan net.Conn), done: make(chan struct{})}
}

// Deliver hands c to the next Accept, waiting for one; once the listener
// is closed it closes c and returns false.
func (l *Listener) Deliver(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		c.Close()
		return false
	}
}

// Accept returns the next delivered connection, or net.ErrClosed once the
// listener is closed.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops Accept and Deliver; it is safe to call more than once.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr is a placeholder: the connections come from no one address.
func (l *Listener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "delivered" }
