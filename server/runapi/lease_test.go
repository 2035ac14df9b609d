package runapi_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/patterns"
	"github.com/cellbox/cellbox/runtime"
	"github.com/cellbox/cellbox/sandbox/lease"
	"github.com/cellbox/cellbox/server/runapi"
)

// TestPatternLease: a pattern instance runs on the one server that holds
// its lease. Held by another server, a load is refused (409, naming it);
// once free, it loads here and this server holds it; when the lease is
// lost (taken by another), the instance stops here; Stop gives it up.
func TestPatternLease(t *testing.T) {
	ctx := context.Background()
	shared := lease.NewLocal()
	store := cells.NewMemory(cells.Options{})
	rt := runtime.New(store, runtime.Options{})
	api := runapi.New(runapi.Config{Runtime: rt, Store: store, Logger: slog.New(slog.DiscardHandler), Leaser: shared, Holder: "this server"})
	t.Cleanup(func() {
		api.Shutdown()
		rt.Close(ctx)
		store.Close()
	})
	p, err := patterns.Parse("calc.yaml", []byte("name: calc\ncells:\n  a: 1\nnodes:\n  b: {computed: '${a + 1}'}\n"), nil)
	require.NoError(t, err)

	other, err := shared.Acquire(ctx, "pattern/default/calc", "another server", time.Hour)
	require.NoError(t, err)
	_, err = api.Load(ctx, p, runapi.LoadOptions{})
	require.ErrorIs(t, err, lease.ErrHeld)
	var e *runapi.Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, 409, e.Status)
	assert.Contains(t, e.Message, "another server")
	assert.Empty(t, rt.Nodes(), "nothing of it runs here")

	require.NoError(t, shared.Release(ctx, other))
	_, err = api.Load(ctx, p, runapi.LoadOptions{})
	require.NoError(t, err)
	h, err := shared.Holder(ctx, "pattern/default/calc")
	require.NoError(t, err)
	assert.Equal(t, "this server", h)
	assert.NotEmpty(t, rt.Nodes())

	// Lost: another server took it (this one was cut off): it stops here.
	mine := lease.Lease{Name: "pattern/default/calc", Holder: "this server"}
	for _, tok := range []uint64{1, 2, 3} { // whichever token it has
		mine.Token = tok
		shared.Release(ctx, mine)
	}
	_, err = shared.Acquire(ctx, "pattern/default/calc", "another server", time.Hour)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		ins, err := api.Instances()
		return err == nil && len(ins) == 0 && len(rt.Nodes()) == 0
	}, 30*time.Second, 10*time.Millisecond, "the instance stops on the server that lost its lease")
}
