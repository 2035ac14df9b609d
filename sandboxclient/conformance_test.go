package sandboxclient_test

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/boxtest"
	"github.com/cellbox/cellbox/sandboxclient"
	"github.com/cellbox/cellbox/sandboxclient/clienttest"
)

// TestConformance runs the one suite against both clients over the same
// real service (local backend): in process, and over HTTP (the service's
// own handler, which takes session tokens).
func TestConformance(t *testing.T) {
	svc, _ := boxtest.Service(t, boxtest.Options{})
	t.Run("local", func(t *testing.T) {
		clienttest.Run(t, func(t *testing.T) sandboxclient.Client {
			id, _, err := svc.NewSession(context.Background())
			require.NoError(t, err)
			t.Cleanup(func() { svc.DeleteSession(context.Background(), id) })
			return svc.Client(id)
		})
	})
	t.Run("http", func(t *testing.T) {
		hs := httptest.NewServer(svc.Handler())
		t.Cleanup(hs.Close)
		clienttest.Run(t, func(t *testing.T) sandboxclient.Client {
			c, err := sandboxclient.NewSession(context.Background(), hs.URL)
			require.NoError(t, err)
			t.Cleanup(func() {
				id, _ := c.Session()
				svc.DeleteSession(context.Background(), id)
			})
			return c
		})
	})
}
