package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/cellbox/cellbox/internal/netpipe"
)

// forwardEgress is the box half of the egress proxy (sandbox/egress): it
// listens on addr in the box (127.0.0.1:3128, where the box's HTTP_PROXY
// points) and pipes each connection to the host's proxy socket, which
// decides what may pass. The box has no other way out: its network is
// loopback only. Any process of the box may also connect to the socket
// itself; that is the same proxy under the same policy.
func (s *server) forwardEgress(ctx context.Context, addr, socket string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		s.log.Warn("egress forwarder: cannot listen; the box has no way out", "addr", addr, "err", err)
		return
	}
	s.log.Info("egress forwarder listening", "addr", addr, "to", socket)
	context.AfterFunc(ctx, func() { ln.Close() })
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("egress forwarder stopped", "err", err)
			}
			return
		}
		s.tunnels.Add(1)
		go func() {
			defer s.tunnels.Done()
			defer c.Close()
			var upr io.Reader
			up, err := (&net.Dialer{}).DialContext(ctx, "unix", socket)
			if errors.Is(err, fs.ErrNotExist) {
				// No socket: the server is on another machine and lends
				// connections instead (GET /v1/egress/pull).
				var p *pulled
				if p, err = s.takePull(ctx); err == nil {
					up, upr = p.c, p.r
				}
			}
			switch {
			case errors.Is(err, errNoAllowList):
				refuse(c, "403 Forbidden", err.Error())
				return
			case err != nil:
				refuse(c, "502 Bad Gateway", "cellbox egress: the server's proxy is not reachable from this box ("+err.Error()+")")
				return
			}
			defer up.Close()
			stop := context.AfterFunc(ctx, func() { c.Close(); up.Close() })
			defer stop()
			netpipe.Pipe(up, upr, c)
		}()
	}
}

// refuse answers a box's connection to its proxy with an HTTP error, then
// reads what the box sent (for up to a second) before it closes: closing
// with the request unread would reset the connection, and the box would
// see that rather than the answer.
func refuse(c net.Conn, status, text string) {
	io.WriteString(c, "HTTP/1.1 "+status+"\r\nContent-Type: text/plain\r\nContent-Length: "+strconv.Itoa(len(text)+1)+"\r\nConnection: close\r\n\r\n"+text+"\n")
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	c.SetReadDeadline(time.Now().Add(time.Second))
	io.Copy(io.Discard, io.LimitReader(c, 1<<20))
}

// errNoAllowList is takePull's answer while the server has lent nothing.
var errNoAllowList = errors.New("cellbox egress: this box has no network access: the server opens a way to its egress proxy only for a box with an allow list (give one with the network_set tool)")

// egressMark is the byte the agent sends on a pulled connection when it
// puts it to use: what follows is a box's connection to its proxy.
const egressMark = 'E'

// pulled is a connection the server lent for the box's egress.
type pulled struct {
	c net.Conn
	r *bufio.Reader
}

// pullWait bounds how long a box's connection to its proxy waits for the
// server to lend one (it lends a few ahead, and another as each is used);
// unlentWait is the bound while the server has lent none yet: it lends
// only to a box with an allow list, so a box without one is refused
// soon, and one just given a list gets its first within milliseconds.
const (
	pullWait   = 30 * time.Second
	unlentWait = 2 * time.Second
)

// handleEgressPull (GET /v1/egress/pull) takes a connection the server
// lends for the box's egress and holds it until a process of the box
// connects to its proxy address (forwardEgress).
func (s *server) handleEgressPull(w http.ResponseWriter, r *http.Request) {
	conn, br, err := switchProtocols(w, "egress pull")
	if err != nil {
		return
	}
	p := &pulled{c: conn, r: br}
	s.lent.Store(true)
	for {
		select {
		case s.pulls <- p:
			return
		default:
			// Full: those of a server gone (restarted, or another one
			// now) may fill it; the oldest makes room for the newest.
			select {
			case old := <-s.pulls:
				old.c.Close()
			default:
			}
		}
	}
}

// takePull returns a live lent connection, marked as used, waiting up to
// pullWait for one.
func (s *server) takePull(ctx context.Context) (*pulled, error) {
	wait := pullWait
	if !s.lent.Load() {
		wait = unlentWait
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case p := <-s.pulls:
			// One whose server end went away reads EOF at once; a live
			// one has nothing to read (the server sends nothing first).
			p.c.SetReadDeadline(time.Now().Add(time.Millisecond))
			_, err := p.r.Peek(1)
			p.c.SetReadDeadline(time.Time{})
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				p.c.Close()
				continue
			}
			if _, err := p.c.Write([]byte{egressMark}); err != nil {
				p.c.Close()
				continue
			}
			return p, nil
		case <-timer.C:
			if !s.lent.Load() {
				return nil, errNoAllowList
			}
			return nil, fmt.Errorf("the server lent no connection within %s", wait)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// maxPulls is how many lent connections the agent holds at most.
const maxPulls = 16
