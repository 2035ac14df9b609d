package sandbox

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestProcessLogsPastTheRing: once the agent's 1 MiB ring of a background
// process's output has dropped old output, logs says how much of what was
// asked for is gone, and next_offset follows on from the output returned
// (it was the requested offset plus the bytes returned, so a client
// following next_offset got the same chunk about 89 times).
func TestProcessLogsPastTheRing(t *testing.T) {
	s := newTestService(t, newFakeBackend(t), "", nil)
	h := newSession(t, s)
	bg := h.tool("shell", map[string]any{"command": "seq 1 300000", "background": true})
	id := bg["process_id"].(string)
	require.Eventually(t, func() bool {
		return h.tool("process", map[string]any{"action": "logs", "id": id, "offset": 1 << 30})["running"] == false
	}, 20*time.Second, 20*time.Millisecond)

	var all strings.Builder
	for i := 1; i <= 300000; i++ {
		fmt.Fprintf(&all, "%d\n", i)
	}
	total := int64(all.Len())
	const ring = 1 << 20
	kept := all.String()[total-ring:]

	var got strings.Builder
	offset, calls := int64(0), 0
	for {
		lg := h.tool("process", map[string]any{"action": "logs", "id": id, "offset": offset})
		calls++
		require.Less(t, calls, 40, "next_offset moves on")
		out, _ := lg["output"].(string)
		next := int64(lg["next_offset"].(float64))
		if offset == 0 {
			assert.EqualValues(t, total-ring, lg["dropped"], "the bytes dropped before the output")
			assert.Equal(t, kept[:20], out[:20])
			assert.Equal(t, true, lg["truncated"])
			assert.Equal(t, total-ring+int64(len(out)), next)
		} else {
			assert.Nil(t, lg["dropped"], "nothing dropped from offset %d on", offset)
		}
		got.WriteString(out)
		if out == "" {
			assert.Equal(t, total, next)
			break
		}
		offset = next
	}
	assert.Equal(t, len(kept), got.Len())
	assert.True(t, kept == got.String(), "paging from offset 0 gives the last MiB, once and in order")
	assert.LessOrEqual(t, calls, ring/(64<<10)+2)
}
