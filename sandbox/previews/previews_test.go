package previews_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/previews"
)

// TestIDs: only "p" and 32 lower-case hex digits is an id, and a Host is
// a preview's origin only as ID.localhost (read in lower case).
func TestIDs(t *testing.T) {
	id := "p" + strings.Repeat("0a", 16)
	for s, ok := range map[string]bool{
		id: true, id[:32]: false, id + "0": false, "q" + id[1:]: false,
	} {
		assert.Equal(t, ok, previews.IsID(s), "preview id %q", s)
		_, got := previews.IDFromHost(s + ".localhost:8080")
		assert.Equal(t, ok, got, "Host %q.localhost", s)
	}
	assert.False(t, previews.IsID("p"+strings.Repeat("0A", 16)), "upper case")
	got, ok := previews.IDFromHost("P" + strings.Repeat("0A", 16) + ".LOCALHOST")
	assert.True(t, ok, "a Host is read in lower case")
	assert.Equal(t, id, got)
	for _, host := range []string{"localhost", id + ".localhost.evil.test", id + ".example.com", "x." + id + ".localhost", id} {
		_, ok := previews.IDFromHost(host)
		assert.False(t, ok, "Host %q is not a preview's origin", host)
	}
	a, b := previews.NewID(), previews.NewID()
	assert.True(t, previews.IsID(a), a)
	assert.NotEqual(t, a, b)
}

// TestURL: a preview's address is its own origin on the server's port.
func TestURL(t *testing.T) {
	id := previews.NewID()
	u, err := previews.URL("http://127.0.0.1:7070", id, "/x?y=1")
	require.NoError(t, err)
	assert.Equal(t, "http://"+id+".localhost:7070/x?y=1", u)
	u, err = previews.URL("https://box.example", id, "/")
	require.NoError(t, err)
	assert.Equal(t, "http://"+id+".localhost:80/", u)
	_, err = previews.URL("not a url", id, "/")
	assert.ErrorContains(t, err, "previews need one")
}

// TestTable: ids lead to their targets until dropped.
func TestTable(t *testing.T) {
	tb := previews.NewTable()
	a, b := previews.NewID(), previews.NewID()
	tb.Add(a, previews.Target{Box: "cb-1", Port: 8000})
	tb.Add(b, previews.Target{Box: "cb-1", Port: 9000})
	got, ok := tb.Get(a)
	require.True(t, ok)
	assert.Equal(t, previews.Target{Box: "cb-1", Port: 8000}, got)
	tb.Drop(a, b)
	_, ok = tb.Get(b)
	assert.False(t, ok)
}
