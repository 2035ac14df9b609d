package blobstest

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// delete: Delete removes the blobs named and returns what Size shrank by;
// a hash the namespace does not hold is skipped (and frees nothing); the
// blobs not named stay; content deleted and put again is stored (and
// counted) again.
func (s *suite) delete(t *testing.T) {
	st := s.store(t)
	a, b, c := random(1000, 1), random(20_000, 2), random(300_000, 3)
	for _, x := range [][]byte{a, b, c} {
		put(t, st, "s-1", x)
	}
	absent := sum([]byte("never stored"))
	freed, err := st.Delete(ctx, "s-1", sum(a), absent, sum(c))
	require.NoError(t, err)
	assert.EqualValues(t, len(a)+len(c), freed, "freed: the bytes of the blobs deleted")
	notFound(t, st, "s-1", sum(a), "deleted")
	notFound(t, st, "s-1", sum(c), "deleted")
	assert.Equal(t, b, read(t, st, "s-1", sum(b)), "a blob not named stays")
	assert.Equal(t, []string{sum(b)}, hashes(t, st, "s-1"))
	assert.EqualValues(t, len(b), size(t, st, "s-1"))

	freed, err = st.Delete(ctx, "s-1", sum(a), sum(c))
	require.NoError(t, err, "deleting what is gone")
	assert.Zero(t, freed)
	freed, err = st.Delete(ctx, "s-1")
	require.NoError(t, err, "deleting nothing")
	assert.Zero(t, freed)
	freed, err = st.Delete(ctx, "s-none", sum(b))
	require.NoError(t, err, "deleting in an unknown namespace")
	assert.Zero(t, freed)
	assert.Equal(t, b, read(t, st, "s-1", sum(b)), "a Delete in another namespace leaves it")

	assert.EqualValues(t, len(a), put(t, st, "s-1", a), "put again after a delete: stored and counted again")
	assert.Equal(t, a, read(t, st, "s-1", sum(a)))
	assert.EqualValues(t, len(a)+len(b), size(t, st, "s-1"))
}

// deleteNamespace: DeleteNamespace removes every blob of the namespace and
// the namespace from Namespaces, and returns what its Size was; other
// namespaces keep theirs; an unknown namespace is no error; the namespace
// can be written again.
func (s *suite) deleteNamespace(t *testing.T) {
	st := s.store(t)
	a, b := random(70_000, 1), random(5000, 2)
	put(t, st, "s-1", a)
	put(t, st, "s-1", b)
	put(t, st, "s-2", a)
	want := size(t, st, "s-1")
	freed, err := st.DeleteNamespace(ctx, "s-1")
	require.NoError(t, err)
	assert.Equal(t, want, freed)
	assert.EqualValues(t, len(a)+len(b), freed)
	empty(t, st, "s-1", "after DeleteNamespace")
	notFound(t, st, "s-1", sum(a), "after DeleteNamespace")
	notFound(t, st, "s-1", sum(b), "after DeleteNamespace")
	ns, err := st.Namespaces(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"s-2"}, ns)
	assert.Equal(t, a, read(t, st, "s-2", sum(a)), "another namespace keeps its blobs")

	freed, err = st.DeleteNamespace(ctx, "s-unknown")
	require.NoError(t, err)
	assert.Zero(t, freed)

	// A namespace emptied blob by blob goes from the list too.
	_, err = st.Delete(ctx, "s-2", sum(a))
	require.NoError(t, err)
	freed, err = st.DeleteNamespace(ctx, "s-2")
	require.NoError(t, err)
	assert.Zero(t, freed)
	ns, err = st.Namespaces(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{}, ns)

	assert.EqualValues(t, len(b), put(t, st, "s-1", b), "a namespace deleted can be written again")
	assert.Equal(t, b, read(t, st, "s-1", sum(b)))
}

// list: List passes each blob once, whatever its hash (blobs spread over
// many hashes' prefixes); it stops at fn's first error and returns it;
// fn may delete the blob it is given; an unknown namespace is an empty
// walk.
func (s *suite) list(t *testing.T) {
	st := s.store(t)
	var want []string
	bytesOf := map[string]int64{}
	for i := range 300 {
		c := []byte(fmt.Sprintf("blob %d", i))
		put(t, st, "s-1", c)
		want = append(want, sum(c))
		bytesOf[sum(c)] = int64(len(c))
	}
	put(t, st, "s-2", []byte("elsewhere"))
	assert.Equal(t, sorted(want...), hashes(t, st, "s-1"), "each blob once, and only the namespace's")
	assert.Equal(t, []string{}, hashes(t, st, "s-unknown"))

	stop := errors.New("enough")
	calls := 0
	err := st.List(ctx, "s-1", func(string) error {
		calls++
		if calls == 10 {
			return stop
		}
		return nil
	})
	assert.ErrorIs(t, err, stop, "fn's error ends the walk and is returned")
	assert.Equal(t, 10, calls, "no call after fn's error")

	// The service's collection: delete what no record names, as the walk
	// goes.
	keep := map[string]bool{want[0]: true, want[150]: true}
	var freed, wantFreed int64
	require.NoError(t, st.List(ctx, "s-1", func(h string) error {
		if keep[h] {
			return nil
		}
		n, err := st.Delete(ctx, "s-1", h)
		freed, wantFreed = freed+n, wantFreed+bytesOf[h]
		return err
	}))
	assert.Equal(t, wantFreed, freed, "freed the bytes of the blobs deleted")
	assert.Equal(t, sorted(want[0], want[150]), hashes(t, st, "s-1"), "deleted during the walk")
	assert.Equal(t, int64(len("blob 0")+len("blob 150")), size(t, st, "s-1"))
}

// size: Size is the bytes of the namespace's blobs (for content with no
// zero byte, their sizes), grows by what each Put added and shrinks by
// what each Delete freed; an unknown namespace is 0.
func (s *suite) size(t *testing.T) {
	st := s.store(t)
	assert.Zero(t, size(t, st, "s-1"))
	var total int64
	for i, n := range []int{1, 4095, 4096, 4097, 100_000} {
		total += put(t, st, "s-1", random(n, uint64(i)))
		assert.Equal(t, total, size(t, st, "s-1"), "after a put of %d bytes", n)
	}
	assert.EqualValues(t, 1+4095+4096+4097+100_000, total)
	zeros := make([]byte, 3<<20)
	zeros[len(zeros)/2] = 1
	added := put(t, st, "s-1", zeros)
	assert.LessOrEqual(t, added, int64(len(zeros)), "content that is mostly zeros counts at most its size")
	assert.Greater(t, added, int64(0), "and at least its byte that is not zero")
	assert.Equal(t, total+added, size(t, st, "s-1"), "Size grew by what the Put added")
	freed, err := st.Delete(ctx, "s-1", sum(zeros))
	require.NoError(t, err)
	assert.Equal(t, added, freed, "and shrinks by the same when it is deleted")
	assert.Equal(t, total, size(t, st, "s-1"))
	assert.Zero(t, size(t, st, "s-unknown"))
}
