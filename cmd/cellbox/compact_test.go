package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/server"
)

// TestCompact fills a data dir's state file with data it then deletes
// (as an evicted memo cache leaves it), compacts it with `cellbox
// compact`: the file shrinks and every cell keeps its value. While a
// process holds the data dir, compact is refused.
func TestCompact(t *testing.T) {
	data := t.TempDir()
	path := filepath.Join(data, sandbox.StateFile)
	state, err := server.OpenState(data)
	require.NoError(t, err)
	big := []byte(strings.Repeat("x", 1<<20))
	want := map[cells.Address]string{}
	for i := range 32 {
		require.NoError(t, state.Cells.Update(context.Background(), func(tx cells.Tx) error {
			a := cells.Address{Space: "default", Pattern: "p", Name: fmt.Sprintf("c%d", i)}
			want[a] = fmt.Sprintf(`{"n":%d}`, i)
			if _, err := tx.Set(a, json.RawMessage(want[a])); err != nil {
				return err
			}
			return tx.Meta("runtime.memo").Put(fmt.Sprintf("k%d", i), big)
		}))
	}
	require.NoError(t, state.Cells.Update(context.Background(), func(tx cells.Tx) error {
		for i := range 32 {
			if err := tx.Meta("runtime.memo").Delete(fmt.Sprintf("k%d", i)); err != nil {
				return err
			}
		}
		return nil
	}))

	_, errOut, err := cellbox(t, "compact", "--data", data)
	require.Error(t, err, "the data dir is held")
	assert.Contains(t, errOut, "data dir "+data+" is in use")
	require.NoError(t, state.Close())

	before := fileSize(t, path)
	out, errOut, err := cellbox(t, "compact", "--data", data)
	require.NoError(t, err, errOut)
	assert.Contains(t, out, "compacted "+path+": ")
	after := fileSize(t, path)
	assert.Less(t, after, before/4, "the deleted 32 MiB are given back")
	assert.NoFileExists(t, path+".compact")
	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	state, err = server.OpenState(data)
	require.NoError(t, err)
	defer state.Close()
	for a, v := range want {
		c, err := state.Cells.Get(context.Background(), a)
		require.NoError(t, err, a.String())
		assert.JSONEq(t, v, string(c.Value), a.String())
	}
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	require.NoError(t, err)
	return st.Size()
}
