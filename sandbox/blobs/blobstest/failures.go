package blobstest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/blobs"
)

// failAfter reads b and then fails with err.
func failAfter(b []byte, err error) io.Reader {
	return io.MultiReader(bytes.NewReader(b), errReader{err})
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// nothingOf checks that a failed Put of content into ns left no trace:
// not its blob, nor one of the part read, nor any other (List, Size), and
// that the content can then be put whole.
func nothingOf(t *testing.T, st blobs.Store, ns string, content []byte, got int, why string) {
	t.Helper()
	notFound(t, st, ns, sum(content), why)
	notFound(t, st, ns, sum(content[:got]), why+": the part read")
	empty(t, st, ns, why)
	assert.EqualValues(t, len(content), put(t, st, ns, content), "%s: the content whole, put after", why)
	assert.Equal(t, content, read(t, st, ns, sum(content)))
	_, err := st.DeleteNamespace(ctx, ns)
	require.NoError(t, err)
}

// cutShort: a Put whose reader fails part way returns the reader's error
// (errors.Is finds it) and stores nothing: not the content, not the part
// read, no bytes in Size. So does one whose reader fails at once, or at
// its very end.
func (s *suite) cutShort(t *testing.T) {
	st := s.store(t)
	content := random(3<<20, 9)
	boom := errors.New("the box went away")
	for _, at := range []int{len(content) / 2, 0, len(content)} {
		_, _, err := st.Put(ctx, "s-1", failAfter(content[:at], boom), int64(len(content)))
		require.ErrorIs(t, err, boom, "cut after %d bytes", at)
		nothingOf(t, st, "s-1", content, at, "a reader failing after "+strconv.Itoa(at)+" bytes")
	}
	// A tar stream cut short says so with io.ErrUnexpectedEOF.
	_, _, err := st.Put(ctx, "s-1", failAfter(content[:1000], io.ErrUnexpectedEOF), int64(len(content)))
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	nothingOf(t, st, "s-1", content, 1000, "io.ErrUnexpectedEOF")

	// Nor does a failed Put of content the namespace holds take it away.
	put(t, st, "s-1", content)
	_, _, err = st.Put(ctx, "s-1", failAfter(content[:len(content)/2+1], boom), int64(len(content)))
	require.ErrorIs(t, err, boom)
	assert.Equal(t, content, read(t, st, "s-1", sum(content)), "the blob there before stays")
}

// sizeMismatch: a Put whose reader holds fewer bytes than its size, or
// more, fails with ErrSize and stores nothing: not the content, not the
// size's worth of it.
func (s *suite) sizeMismatch(t *testing.T) {
	st := s.store(t)
	content := random(1<<20, 4)
	for _, c := range []struct {
		name string
		size int64
	}{
		{"short by one", int64(len(content)) + 1},
		{"far short", 4 << 20},
		{"one too many", int64(len(content)) - 1},
		{"far too many", 1000},
		{"empty said", 0},
	} {
		_, _, err := st.Put(ctx, "s-1", bytes.NewReader(content), c.size)
		require.ErrorIs(t, err, blobs.ErrSize, c.name)
		n := min(int(c.size), len(content))
		notFound(t, st, "s-1", sum(content[:n]), c.name+": the size's worth")
		nothingOf(t, st, "s-1", content, n, c.name)
	}
}

// context: every call with a done context returns the context's error
// and changes nothing; a Put whose context ends while it reads fails with
// the context's error and stores nothing.
func (s *suite) context(t *testing.T) {
	st := s.store(t)
	kept := random(1000, 5)
	put(t, st, "s-1", kept)
	done, cancel := context.WithCancel(ctx)
	cancel()
	other := random(2000, 6)
	_, _, err := st.Put(done, "s-1", bytes.NewReader(other), int64(len(other)))
	assert.ErrorIs(t, err, context.Canceled, "Put")
	_, _, err = st.Open(done, "s-1", sum(kept))
	assert.ErrorIs(t, err, context.Canceled, "Open")
	_, err = st.Delete(done, "s-1", sum(kept))
	assert.ErrorIs(t, err, context.Canceled, "Delete")
	assert.ErrorIs(t, st.List(done, "s-1", func(string) error { return nil }), context.Canceled, "List")
	_, err = st.Size(done, "s-1")
	assert.ErrorIs(t, err, context.Canceled, "Size")
	_, err = st.Namespaces(done)
	assert.ErrorIs(t, err, context.Canceled, "Namespaces")
	_, err = st.DeleteNamespace(done, "s-1")
	assert.ErrorIs(t, err, context.Canceled, "DeleteNamespace")
	assert.Equal(t, []string{sum(kept)}, hashes(t, st, "s-1"), "calls with a done context change nothing")
	assert.Equal(t, kept, read(t, st, "s-1", sum(kept)))

	// Cancelled half way through the content.
	big := random(4<<20, 7)
	mid, cancel := context.WithCancel(ctx)
	defer cancel()
	r := io.MultiReader(bytes.NewReader(big[:len(big)/2]), cancelling{cancel}, bytes.NewReader(big[len(big)/2:]))
	_, _, err = st.Put(mid, "s-1", r, int64(len(big)))
	require.ErrorIs(t, err, context.Canceled, "a Put cancelled as it reads")
	notFound(t, st, "s-1", sum(big), "cancelled")
	assert.Equal(t, []string{sum(kept)}, hashes(t, st, "s-1"), "a cancelled Put leaves nothing")
	assert.EqualValues(t, len(kept), size(t, st, "s-1"))
}

// cancelling cancels a context when it is read, and then reads as at its
// end.
type cancelling struct{ cancel context.CancelFunc }

func (c cancelling) Read([]byte) (int, error) {
	c.cancel()
	return 0, io.EOF
}

// invalid: a namespace or hash no blob can have, or a negative size, is
// refused with ErrInvalid by every call, which does nothing.
func (s *suite) invalid(t *testing.T) {
	st := s.store(t)
	c := random(100, 8)
	put(t, st, "s-1", c)
	good := sum(c)
	for _, ns := range []string{"", ".", "..", ".hidden", "a/b", "../s-1", `a\b`, "a b", "a\x00", "s-ü", strings.Repeat("n", 129)} {
		_, _, err := st.Put(ctx, ns, bytes.NewReader(c), int64(len(c)))
		assert.ErrorIs(t, err, blobs.ErrInvalid, "Put in %q", ns)
		_, _, err = st.Open(ctx, ns, good)
		assert.ErrorIs(t, err, blobs.ErrInvalid, "Open in %q", ns)
		_, err = st.Delete(ctx, ns, good)
		assert.ErrorIs(t, err, blobs.ErrInvalid, "Delete in %q", ns)
		assert.ErrorIs(t, st.List(ctx, ns, func(string) error { return nil }), blobs.ErrInvalid, "List of %q", ns)
		_, err = st.Size(ctx, ns)
		assert.ErrorIs(t, err, blobs.ErrInvalid, "Size of %q", ns)
		_, err = st.DeleteNamespace(ctx, ns)
		assert.ErrorIs(t, err, blobs.ErrInvalid, "DeleteNamespace of %q", ns)
	}
	for _, h := range []string{"", good[:63], strings.ToUpper(good), good + "0", "../" + good[3:], strings.Repeat("g", 64)} {
		_, _, err := st.Open(ctx, "s-1", h)
		assert.ErrorIs(t, err, blobs.ErrInvalid, "Open of %q", h)
		_, err = st.Delete(ctx, "s-1", good, h)
		assert.ErrorIs(t, err, blobs.ErrInvalid, "Delete of %q", h)
	}
	_, _, err := st.Put(ctx, "s-1", bytes.NewReader(nil), -1)
	assert.ErrorIs(t, err, blobs.ErrInvalid, "a negative size")
	assert.Equal(t, c, read(t, st, "s-1", good), "a Delete with one invalid hash deletes none")
	assert.Equal(t, []string{good}, hashes(t, st, "s-1"))
	ns, err := st.Namespaces(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"s-1"}, ns)

	// The longest namespace and every character a namespace may hold.
	for _, ns := range []string{strings.Repeat("n", 128), "Aa0-_.z"} {
		assert.EqualValues(t, len(c), put(t, st, ns, c), ns)
		assert.Equal(t, c, read(t, st, ns, good), ns)
	}
}
