package docker_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/backend/backendtest"
	"github.com/cellbox/cellbox/sandbox/docker"
	"github.com/cellbox/cellbox/sandbox/docker/remotetest"
)

// TestRemoteConformance runs the portable suite on a Docker Engine that
// shares nothing with this machine but its API: the agent is shipped in
// as an image, reached through exec streams, the workspace a volume of
// the engine. A bind of any host path would fail there.
func TestRemoteConformance(t *testing.T) {
	host := remotetest.Engine(t)
	remotetest.LoadBase(t, host)
	var once sync.Once
	newRemote := func(t *testing.T) backend.Backend {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r, err := docker.NewRemote(ctx, docker.RemoteOptions{Host: host})
		require.NoError(t, err)
		t.Cleanup(func() { r.Close() })
		once.Do(func() { require.True(t, r.Capabilities().Remote) })
		return r
	}
	backendtest.RunWith(t, newRemote, backendtest.Options{AgentBinary: testenv.CellboxBinary(t), Unenforced: true})
}
