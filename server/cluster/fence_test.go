package cluster_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/internal/etcdtest"
	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/patterns"
	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/state"
	"github.com/cellbox/cellbox/server"
	"github.com/cellbox/cellbox/server/runapi"
)

// TestFencedWrites: a server whose pattern lease was taken by another
// (behind its back, before its renewal notices) writes nothing more of the
// pattern: its commits carry the lease, and the store refuses them.
func TestFencedWrites(t *testing.T) {
	cl := etcdtest.Start(t, 1)
	ctx := context.Background()
	srv, err := server.Open(ctx, server.Config{DataDir: t.TempDir(), Backend: "local", Lazy: true,
		HTTP: server.DefaultHTTPOptions(), Cluster: server.ClusterConfig{Etcd: cl.Endpoints()}})
	require.NoError(t, err)
	defer srv.Close()
	p, err := patterns.Parse("calc.yaml", []byte("name: calc\ncells:\n  a: 1\nnodes:\n  b:\n    computed: ${a + 1}\n"), nil)
	require.NoError(t, err)
	_, err = srv.Host.API().Load(ctx, p, runapi.LoadOptions{})
	require.NoError(t, err)
	a := cells.Address{Space: runapi.DefaultSpace, Pattern: "calc", Name: "a"}
	require.NoError(t, srv.Host.Runtime().Set(ctx, a, json.RawMessage(`2`)), "the lease is this server's")

	// Another holder takes the lease between two renewals.
	c := cl.Client(t)
	key := "/cellbox/leases/pattern/default/calc"
	_, err = c.Delete(ctx, key)
	require.NoError(t, err)
	_, err = c.Put(ctx, key, "another")
	require.NoError(t, err)
	err = srv.Host.Runtime().Set(ctx, a, json.RawMessage(`3`))
	require.ErrorIs(t, err, cells.ErrFenced, "a write of a pattern whose lease is another's")
	got, err := srv.State.Cells.Get(ctx, a)
	require.NoError(t, err)
	assert.JSONEq(t, `2`, string(got.Value), "nothing written")
	b, err := srv.State.Cells.Get(ctx, cells.Address{Space: runapi.DefaultSpace, Pattern: "calc", Name: "b"})
	require.NoError(t, err)
	assert.JSONEq(t, `3`, string(b.Value))
}

// TestFencedSessionWrites: a server whose session lease was taken by
// another (behind its back, before its renewal notices) writes nothing
// more of the session's records: deleting the session there leaves its
// record and its box's for the server that holds it now.
func TestFencedSessionWrites(t *testing.T) {
	testenv.RequireBwrap(t)
	cl := etcdtest.Start(t, 1)
	ctx := context.Background()
	srv, err := server.Open(ctx, server.Config{DataDir: t.TempDir(), Backend: "local", Lazy: true,
		HTTP: server.DefaultHTTPOptions(), Cluster: server.ClusterConfig{Etcd: cl.Endpoints()},
		Sandbox: sandbox.Config{AgentBinary: testenv.CellboxBinary(t)}})
	require.NoError(t, err)
	defer srv.Close()
	svc, _, err := srv.Host.Sandboxes().Get(ctx)
	require.NoError(t, err)
	id, _, err := svc.NewSession(ctx)
	require.NoError(t, err)
	out, err := svc.CallTool(ctx, id, "shell", json.RawMessage(`{"command":"true"}`))
	require.NoError(t, err)
	require.Contains(t, string(out), `"is_error":false`, "a box made and recorded while the lease is this server's")
	boxes, err := srv.State.Sandbox.List(ctx, state.Boxes, "")
	require.NoError(t, err)
	require.Len(t, boxes, 1)

	// Another holder takes the lease between two renewals.
	c := cl.Client(t)
	key := "/cellbox/leases/session/" + id
	_, err = c.Delete(ctx, key)
	require.NoError(t, err)
	_, err = c.Put(ctx, key, "another")
	require.NoError(t, err)
	err = svc.DeleteSession(ctx, id)
	require.ErrorIs(t, err, state.ErrFenced, "a write of a session whose lease is another's")
	_, err = srv.State.Sandbox.Get(ctx, state.Sessions, id)
	require.NoError(t, err, "the session's record stays")
	_, err = srv.State.Sandbox.Get(ctx, state.Boxes, boxes[0].Key)
	require.NoError(t, err, "its box's record stays")
}
