// Package blobstest is the conformance suite of blobs.Store: every store
// (blobs.OpenDir's, and any other implementation, such as one over S3)
// runs it from its tests, and must pass all of it, so a caller of the
// contract never needs to know which store it holds.
//
// Each subtest checks one point of the contract as package blobs' doc
// comments state it, on a store of its own, through the exported API only:
//
//	func TestMyStore(t *testing.T) {
//		blobstest.Run(t, func(t *testing.T) blobs.Store {
//			s, err := mystore.Open(bucket(t))
//			require.NoError(t, err)
//			return s
//		})
//	}
package blobstest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/blobs"
)

// Open opens a new, empty store for the test t; it may register the
// removal of what the store leaves behind with t.Cleanup (t.TempDir does
// that for a directory).
type Open func(t *testing.T) blobs.Store

// wait bounds every wait of the suite for goroutines (the machines that run
// it are busy).
const wait = 30 * time.Second

// Run runs the suite: each subtest on a store of its own, made by open.
func Run(t *testing.T, open Open) {
	s := &suite{open: open}
	for _, c := range []struct {
		name string
		fn   func(*testing.T)
	}{
		// Content.
		{"RoundTrip", s.roundTrip},
		{"Hash", s.hash},
		{"Dedup", s.dedup},
		{"Namespaces", s.namespaces},
		// Removal and accounting.
		{"Delete", s.delete},
		{"DeleteNamespace", s.deleteNamespace},
		{"List", s.list},
		{"Size", s.size},
		// Puts that fail.
		{"CutShort", s.cutShort},
		{"SizeMismatch", s.sizeMismatch},
		{"Context", s.context},
		{"Invalid", s.invalid},
		// Puts at once.
		{"ConcurrentSameContent", s.concurrentSameContent},
		{"ConcurrentPuts", s.concurrentPuts},
	} {
		t.Run(c.name, c.fn)
	}
}

type suite struct{ open Open }

var ctx = context.Background()

// store opens a store.
func (s *suite) store(t *testing.T) blobs.Store {
	t.Helper()
	st := s.open(t)
	require.NotNil(t, st, "open returned no store")
	return st
}

// put stores content in ns, which must succeed with content's hash, and
// returns the bytes added.
func put(t *testing.T, st blobs.Store, ns string, content []byte) int64 {
	t.Helper()
	hash, added, err := st.Put(ctx, ns, bytes.NewReader(content), int64(len(content)))
	require.NoError(t, err, "put %d bytes into %s", len(content), ns)
	require.Equal(t, sum(content), hash, "put returns the SHA-256 of the content")
	return added
}

// read returns the content of blob hash of ns, which must exist, checking
// that Open's size is its length.
func read(t *testing.T, st blobs.Store, ns, hash string) []byte {
	t.Helper()
	rc, n, err := st.Open(ctx, ns, hash)
	require.NoError(t, err, "open %s in %s", hash, ns)
	defer rc.Close()
	b, err := io.ReadAll(rc)
	require.NoError(t, err)
	require.EqualValues(t, len(b), n, "Open's size is the content's")
	return b
}

// notFound checks that ns has no blob hash: Open wraps ErrNotFound.
func notFound(t *testing.T, st blobs.Store, ns, hash string, why string) {
	t.Helper()
	rc, _, err := st.Open(ctx, ns, hash)
	if err == nil {
		rc.Close()
	}
	assert.ErrorIs(t, err, blobs.ErrNotFound, "%s: open %s in %s", why, hash, ns)
}

// hashes returns the hashes List gives for ns, sorted (never nil).
func hashes(t *testing.T, st blobs.Store, ns string) []string {
	t.Helper()
	out := []string{}
	require.NoError(t, st.List(ctx, ns, func(h string) error {
		out = append(out, h)
		return nil
	}))
	slices.Sort(out)
	return out
}

// size returns Size(ns), which must succeed.
func size(t *testing.T, st blobs.Store, ns string) int64 {
	t.Helper()
	n, err := st.Size(ctx, ns)
	require.NoError(t, err)
	return n
}

// empty checks that ns shows no blob: List is empty and Size 0.
func empty(t *testing.T, st blobs.Store, ns, why string) {
	t.Helper()
	assert.Empty(t, hashes(t, st, ns), "%s: List of %s", why, ns)
	assert.Zero(t, size(t, st, ns), "%s: Size of %s", why, ns)
}

// sum is the hex SHA-256 of b.
func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// sorted returns hs sorted.
func sorted(hs ...string) []string {
	return slices.Sorted(slices.Values(hs))
}

// random returns n bytes of seed, none of them zero: content a store
// counts whole (only zeros may go uncounted).
func random(n int, seed uint64) []byte {
	r := rand.New(rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16), byte(seed >> 24)}))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(1 + r.IntN(255))
	}
	return b
}

// within fails the test if fn does not return within wait.
func within(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(wait):
		t.Fatalf("%s did not return within %v", what, wait)
	}
}
