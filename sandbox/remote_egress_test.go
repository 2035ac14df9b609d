package sandbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/docker"
	"github.com/cellbox/cellbox/sandbox/docker/remotetest"
	"github.com/cellbox/cellbox/sandbox/sandboxtest"
)

// TestAllowListOnRemoteEngine: allow lists on a Docker Engine that shares
// nothing with this machine but its API. The box has no network at all;
// its agent carries its connections to the proxy back over connections
// the server lends it through the engine's exec streams.
func TestAllowListOnRemoteEngine(t *testing.T) {
	host := remotetest.Engine(t)
	remotetest.LoadBase(t, host)
	r, err := docker.NewRemote(context.Background(), docker.RemoteOptions{Host: host})
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	svc, _ := sandboxtest.Service(t, sandboxtest.Options{Backend: r})
	sandboxtest.AllowList(t, svc)
}
