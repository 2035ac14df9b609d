package sandboxclient_test

import (
	"context"
	"io"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/httpapi"
	"github.com/cellbox/cellbox/sandbox/sandboxtest"
	"github.com/cellbox/cellbox/sandboxclient"
	"github.com/cellbox/cellbox/sandboxclient/clienttest"
)

// TestConformance runs the one suite against both clients over the same
// real service (local backend): in process, and over HTTP (the service's
// own handler, which takes session tokens).
func TestConformance(t *testing.T) {
	svc, _ := sandboxtest.Service(t, sandboxtest.Options{})
	t.Run("local", func(t *testing.T) {
		clienttest.Run(t, func(t *testing.T) sandboxclient.Client {
			id, _, err := svc.NewSession(context.Background())
			require.NoError(t, err)
			t.Cleanup(func() { svc.DeleteSession(context.Background(), id) })
			return svc.Client(id)
		})
	})
	t.Run("http", func(t *testing.T) {
		hs := httptest.NewServer(httpapi.Handler(svc))
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

// TestRefusedCode: a command outside the session's allowed_commands is a
// tool error with the code refused on both clients.
func TestRefusedCode(t *testing.T) {
	svc, _ := sandboxtest.Service(t, sandboxtest.Options{})
	ctx := context.Background()
	opts := api.NewSessionRequest{AllowedCommands: []string{"echo"}}
	id, _, err := svc.NewSessionWith(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() { svc.DeleteSession(ctx, id) })
	hs := httptest.NewServer(httpapi.Handler(svc))
	t.Cleanup(hs.Close)
	hc, err := sandboxclient.NewSessionWithOptions(ctx, hs.URL, "", opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		id, _ := hc.Session()
		svc.DeleteSession(ctx, id)
	})
	for name, c := range map[string]sandboxclient.Client{"local": svc.Client(id), "http": hc} {
		t.Run(name, func(t *testing.T) {
			_, err := c.Tool(ctx, "shell", map[string]any{"command": "rm -rf /workspace"})
			var te *sandboxclient.ToolError
			require.ErrorAs(t, err, &te)
			assert.Equal(t, api.CodeRefused, te.Code)
			assert.ErrorIs(t, err, sandboxclient.ErrRefused)
			assert.Contains(t, te.Message, "allowed_commands")

			_, err = c.Exec(ctx, "default", api.ExecRequest{Command: "rm -rf /workspace"}, nil)
			assert.ErrorIs(t, err, sandboxclient.ErrRefused, "the exec endpoint refuses with the same code")
		})
	}
}

// TestNoSessionCode: a deleted session is no_session on both clients, for
// the box endpoints too (not a missing file).
func TestNoSessionCode(t *testing.T) {
	svc, _ := sandboxtest.Service(t, sandboxtest.Options{})
	ctx := context.Background()
	hs := httptest.NewServer(httpapi.Handler(svc))
	t.Cleanup(hs.Close)
	hc, err := sandboxclient.NewSession(ctx, hs.URL)
	require.NoError(t, err)
	id, _ := hc.Session()
	local := svc.Client(id)
	require.NoError(t, svc.DeleteSession(ctx, id))
	for name, c := range map[string]sandboxclient.Client{"local": local, "http": hc} {
		t.Run(name, func(t *testing.T) {
			_, err := c.Download(ctx, "default", "x.txt", io.Discard)
			assert.ErrorIs(t, err, sandboxclient.ErrNoSession)
			assert.NotErrorIs(t, err, sandboxclient.ErrNotFound, "not a missing file")
		})
	}
}
