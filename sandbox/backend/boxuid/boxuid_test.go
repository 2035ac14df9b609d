package boxuid

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestClashes(t *testing.T) {
	etc := t.TempDir()
	for name, body := range map[string]string{
		"passwd": "root:x:0:0::/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\nbox:x:1900000005:100::/:/bin/false\n",
		"group":  "root:x:0:\nbig:x:1902097151:\n",
		"subuid": "alice:100000:65536\nwide:1899999000:2000\n",
		"subgid": "alice:100000:65536\nbelow:1899000000:1000000\n", // ends just below the range
	} {
		require.NoError(t, os.WriteFile(filepath.Join(etc, name), []byte(body), 0o644))
	}
	assert.Equal(t, []string{
		filepath.Join(etc, "passwd") + ": box",
		filepath.Join(etc, "group") + ": big",
		filepath.Join(etc, "subuid") + ": wide",
	}, Local.Clashes(etc))
	assert.Empty(t, Docker.Clashes(etc), "the Docker block starts above the local one")
	assert.Empty(t, Local.Clashes("/etc"), "this host's accounts use box uids")
	assert.Empty(t, Docker.Clashes("/etc"), "this host's accounts use box uids")
}

// TestAlloc: two boxes never share a uid; a freed uid comes back; uids
// fall in the block and map back to their slot.
func TestAlloc(t *testing.T) {
	for _, r := range []Range{Local, Docker} {
		r.Dir = t.TempDir()
		a, err := r.Alloc("box-a")
		require.NoError(t, err)
		b, err := r.Alloc("box-a") // the same id twice: two slots
		require.NoError(t, err)
		assert.NotEqual(t, a, b)
		for _, uid := range []int{a, b} {
			assert.GreaterOrEqual(t, uid, r.Base)
			assert.LessOrEqual(t, uid, r.Last())
			slot, ok := r.Slot(uid)
			require.True(t, ok)
			assert.Equal(t, uid, r.UID(slot))
		}
		r.Free("box-a", a)
		r.Free("someone-else", b) // not theirs: kept
		c, err := r.Alloc("box-a")
		require.NoError(t, err)
		assert.Equal(t, a, c, "the freed slot is found again first")
	}
	assert.Greater(t, Docker.Base, Local.Last(), "the blocks do not overlap")
}

// TestSweep frees what gone says is gone, once a minute old.
func TestSweep(t *testing.T) {
	r := Docker
	r.Dir = t.TempDir()
	old, err := r.Alloc("old-gone")
	require.NoError(t, err)
	kept, err := r.Alloc("old-alive")
	require.NoError(t, err)
	young, err := r.Alloc("young-gone")
	require.NoError(t, err)
	past := time.Now().Add(-2 * time.Minute)
	for _, uid := range []int{old, kept} {
		slot, _ := r.Slot(uid)
		require.NoError(t, os.Chtimes(filepath.Join(r.Dir, strconv.Itoa(slot)), past, past))
	}
	r.Sweep(time.Minute, func(id string) bool { return id != "old-alive" })
	left, err := os.ReadDir(r.Dir)
	require.NoError(t, err)
	var names []string
	for _, e := range left {
		names = append(names, e.Name())
	}
	ks, _ := r.Slot(kept)
	ys, _ := r.Slot(young)
	assert.ElementsMatch(t, []string{strconv.Itoa(ks), strconv.Itoa(ys)}, names)
}
