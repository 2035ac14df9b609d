package agent

import (
	"context"
	"io"
	"net"

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
			up, err := (&net.Dialer{}).DialContext(ctx, "unix", socket)
			if err != nil {
				io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\ncellbox egress: the host's proxy is not reachable from this box ("+err.Error()+")\n")
				return
			}
			defer up.Close()
			stop := context.AfterFunc(ctx, func() { c.Close(); up.Close() })
			defer stop()
			netpipe.Pipe(c, nil, up)
		}()
	}
}
