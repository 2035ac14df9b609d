package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/cells/kvtest"
	"github.com/cellbox/cellbox/runtime"
)

// conflictKV is a shared KV whose next armed commits conflict, as when
// another server committed first (etcd): the Store runs the runtime's
// batch again.
type conflictKV struct {
	cells.KV
	armed atomic.Int32
}

func (k *conflictKV) Begin(ctx context.Context, writable bool) (cells.KVTx, error) {
	t, err := k.KV.Begin(ctx, writable)
	if err != nil {
		return nil, err
	}
	return &conflictTx{KVTx: t, kv: k}, nil
}

type conflictTx struct {
	cells.KVTx
	kv *conflictKV
}

func (t *conflictTx) Commit(ctx context.Context, versioned bool) (uint64, error) {
	if versioned && t.kv.armed.Add(-1) >= 0 {
		t.KVTx.Rollback()
		return 0, fmt.Errorf("armed: %w", cells.ErrConflict)
	}
	return t.KVTx.Commit(ctx, versioned)
}

// TestBatchRunsAgainWhole: a batch whose commit conflicts runs again from
// what the store holds, as if the first attempt never ran: every node it
// had queued is queued again, and nothing it staged is read as committed.
func TestBatchRunsAgainWhole(t *testing.T) {
	kv := &conflictKV{KV: kvtest.NewServer().Client()}
	s, err := cells.Open(t.Context(), kv, cells.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	p := runtime.Pattern{
		Cells: []runtime.Cell{{Name: "a", Initial: json.RawMessage(`1`)}},
		Nodes: []runtime.Node{computed(t, "b", "a + 1"), computed(t, "c", "b * 2"), computed(t, "d", "c > 10 ? 'big' : 'small'")},
	}
	rt := start(t, s, p, runtime.Options{})
	require.JSONEq(t, `4`, string(get(t, s, "c").Value))
	for i, want := range []string{`12`, `6`, `40`} {
		kv.armed.Store(int32(1 + i%2)) // one or two conflicts in a row
		a := map[string]string{`12`: `5`, `6`: `2`, `40`: `19`}[want]
		set(t, rt, "a", a)
		settle(t, rt)
		assert.JSONEq(t, want, string(get(t, s, "c").Value), "c after a=%s", a)
		wantD := `"small"`
		if want != `6` {
			wantD = `"big"`
		}
		assert.JSONEq(t, wantD, string(get(t, s, "d").Value), "d after a=%s", a)
		assert.Equal(t, int32(-1), kv.armed.Load(), "the conflicts were met")
	}
}
