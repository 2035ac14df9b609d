package sandboxclient_test

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandboxclient"
)

// TestNoServer: a client pointed where no server listens says so and what
// to do, not only "dial tcp …: connection refused" (what `cellbox tool`
// and `cellbox session new` printed with no `cellbox serve` running).
func TestNoServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close())

	c := sandboxclient.New(url, "s-x", "t")
	_, err = c.Tools(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no cellbox server answers at "+url+" (start one with `cellbox serve`, or set --server or CELLBOX_SERVER)")
	assert.Contains(t, err.Error(), "connection refused")
	_, err = sandboxclient.NewSessionWithKey(context.Background(), url, "key")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no cellbox server answers at "+url)
}
