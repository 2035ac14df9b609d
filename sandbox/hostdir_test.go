package sandbox

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/backend/boxdisk"
)

// TestHostDirCapped: /run/cellbox, the one host directory a box may write
// (its agent's socket lives there), is a small tmpfs of the box's own, so
// a box writing there runs out of space instead of filling the host's
// disk. It used to be a plain directory on the data dir's filesystem. A
// box put to sleep leaves no mount behind and wakes with its agent and
// egress sockets back.
func TestHostDirCapped(t *testing.T) {
	for _, kind := range []string{"local", "docker"} {
		t.Run(kind, func(t *testing.T) {
			rb := newRealService(t, kind, nil)
			m := rb.ok("shell", map[string]any{"command": "head -c 2000000 /dev/zero > /run/cellbox/fill; echo rc=$?; for i in $(seq 100); do : > /run/cellbox/f$i || break; done; echo files=$i"})
			assert.Contains(t, m["stderr"], "No space left on device")
			assert.Contains(t, m["stdout"], "rc=1")
			assert.NotContains(t, m["stdout"], "files=100", "the inodes are capped too")
			id := rb.id("default")
			assert.True(t, boxdisk.IsMountPoint(rb.s.boxTop(id)), "the host dir is a filesystem of its own")

			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			rb.s.mu.Lock()
			b := rb.s.sessions[rb.sess].boxes["default"]
			rb.s.mu.Unlock()
			b.life.Lock()
			require.NoError(t, rb.s.sleep(ctx, b, 0))
			b.life.Unlock()
			assert.Empty(t, testenv.Mounts(t, id), "a sleeping box leaves no mount")

			m = rb.ok("shell", map[string]any{"command": "ls /run/cellbox"})
			assert.Equal(t, "agent.sock\negress.sock\n", m["stdout"], "woken with its sockets, without what it wrote")
		})
	}
}
