package agent

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/cellbox/cellbox/internal/netpipe"
)

// handlePort upgrades the connection to a raw byte pipe to 127.0.0.1:port in
// the box's network namespace.
func (s *server) handlePort(w http.ResponseWriter, r *http.Request) {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port <= 0 || port > 65535 {
		writeError(w, &Error{Op: "port", Code: CodeInvalid, Message: fmt.Sprintf("port %q: not a TCP port", r.PathValue("port"))})
		return
	}
	d := net.Dialer{Timeout: 5 * time.Second}
	up, err := d.DialContext(r.Context(), "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		writeError(w, &Error{Op: "port", Message: fmt.Sprintf("connect to port %d in the box: %v", port, err)})
		return
	}
	conn, br, err := switchProtocols(w, "port")
	if err != nil {
		up.Close()
		return
	}
	s.tunnels.Add(1)
	go func() {
		defer s.tunnels.Done()
		defer conn.Close()
		defer up.Close()
		stop := make(chan struct{})
		go func() {
			select {
			case <-s.ctx.Done():
				conn.Close()
				up.Close()
			case <-stop:
			}
		}()
		defer close(stop)
		netpipe.Pipe(conn, br, up)
	}()
}

// switchProtocols takes over the connection of w and answers 101
// (Upgrade: tcp): from then on it is a raw byte pipe, read through the
// returned reader (which may hold bytes the client sent early). An error
// has been answered (op names the request).
func switchProtocols(w http.ResponseWriter, op string) (net.Conn, *bufio.Reader, error) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		writeError(w, &Error{Op: op, Message: op + ": cannot take over the connection: " + err.Error()})
		return nil, nil, err
	}
	fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: tcp\r\nConnection: Upgrade\r\n%s: %d\r\n\r\n", ProtocolHeader, ProtocolVersion)
	if err := brw.Flush(); err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, brw.Reader, nil
}
