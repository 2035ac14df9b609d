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
)

// TestCompact fills a data dir's state file with data it then deletes
// (as an evicted memo cache leaves it), compacts it with `cellbox
// compact`: the file shrinks and every cell keeps its value. While a
// process holds the data dir, compact is refused.
func TestCompact(t *testing.T) {
	data := t.TempDir()
	path := filepath.Join(data, sandbox.StateFile)
	state, err := openState(data)
	require.NoError(t, err)
	big := []byte(strings.Repeat("x", 1<<20))
	want := map[cells.Address]string{}
	for i := range 32 {
		require.NoError(t, state.cells.Update(context.Background(), func(tx cells.Tx) error {
			a := cells.Address{Space: "default", Pattern: "p", Name: fmt.Sprintf("c%d", i)}
			want[a] = fmt.Sprintf(`{"n":%d}`, i)
			if _, err := tx.Set(a, json.RawMessage(want[a])); err != nil {
				return err
			}
			return tx.Meta("runtime.memo").Put(fmt.Sprintf("k%d", i), big)
		}))
	}
	require.NoError(t, state.cells.Update(context.Background(), func(tx cells.Tx) error {
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

	state, err = openState(data)
	require.NoError(t, err)
	defer state.Close()
	for a, v := range want {
		c, err := state.cells.Get(context.Background(), a)
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

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{{"1048576", 1 << 20}, {"512KiB", 512 << 10}, {"256MiB", 256 << 20}, {"2GiB", 2 << 30}, {"5MB", 5e6}, {"10 B", 10}} {
		got, err := parseSize(tc.in)
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, got, tc.in)
	}
	for _, bad := range []string{"", "0", "-1", "1TB", "lots", "99999999999GiB"} {
		_, err := parseSize(bad)
		assert.ErrorContains(t, err, "want a positive size in bytes, or with a unit: 512MiB, 2GiB", bad)
	}
}
