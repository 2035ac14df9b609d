package backend

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"

	"github.com/cellbox/cellbox/sandbox/agent"
)

// SocketDialer is Dial for the backends whose boxes' agents listen on this
// host, in the box's host directory (Spec.HostDir, SocketName in it). It
// remembers each box's directory, so that a connection costs no question
// to the engine; lookup finds a box it has not seen (an earlier process's).
type SocketDialer struct {
	lookup func(ctx context.Context, id string) (hostDir string, err error)
	mu     sync.Mutex
	dirs   map[string]string
}

// NewSocketDialer returns a SocketDialer that asks lookup for the host
// directory of a box it has not been told of.
func NewSocketDialer(lookup func(ctx context.Context, id string) (string, error)) *SocketDialer {
	return &SocketDialer{lookup: lookup, dirs: map[string]string{}}
}

// Remember notes box id's host directory.
func (d *SocketDialer) Remember(id, hostDir string) {
	if hostDir == "" {
		return
	}
	d.mu.Lock()
	d.dirs[id] = hostDir
	d.mu.Unlock()
}

// Forget drops box id (removed).
func (d *SocketDialer) Forget(id string) {
	d.mu.Lock()
	delete(d.dirs, id)
	d.mu.Unlock()
}

// Dial connects to box id's agent socket, pinned against a box that swaps
// it for a link (agent.DialSocket). A socket that is not there or refuses
// is ErrNotReady; an unknown box ErrNotFound (from lookup).
func (d *SocketDialer) Dial(ctx context.Context, id string) (net.Conn, error) {
	d.mu.Lock()
	dir, ok := d.dirs[id]
	d.mu.Unlock()
	if !ok {
		var err error
		if dir, err = d.lookup(ctx, id); err != nil {
			return nil, fmt.Errorf("dial box %s: %w", id, err)
		}
		if dir == "" {
			return nil, fmt.Errorf("dial box %s: it has no host directory: %w", id, ErrNotReady)
		}
		d.Remember(id, dir)
	}
	conn, err := agent.DialSocket(ctx, filepath.Join(dir, SocketName))
	if err != nil && !errors.Is(err, agent.ErrNotSocket) {
		err = fmt.Errorf("dial box %s: %w: %w", id, ErrNotReady, err)
	}
	return conn, err
}
