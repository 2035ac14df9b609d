package blobstest

import (
	"bytes"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/blobs"
)

// barrier holds the readers of Puts at their end until all have got
// there (or a while has passed, for a store that does not read to the
// end), so that the Puts make their blobs visible at the same moment.
type barrier struct {
	arrived sync.WaitGroup
	all     chan struct{}
}

func newBarrier(n int) *barrier {
	b := &barrier{all: make(chan struct{})}
	b.arrived.Add(n)
	go func() {
		b.arrived.Wait()
		close(b.all)
	}()
	return b
}

// reader reads content, and at its end waits for the other readers.
func (b *barrier) reader(content []byte) io.Reader {
	return &atEnd{r: bytes.NewReader(content), b: b}
}

type atEnd struct {
	r    io.Reader
	b    *barrier
	done bool
}

func (a *atEnd) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	if err == io.EOF && !a.done {
		a.done = true
		a.b.arrived.Done()
		select {
		case <-a.b.all:
		case <-time.After(5 * time.Second):
		}
	}
	return n, err
}

// concurrentSameContent: Puts of the same content into one namespace at
// once all succeed with its hash and leave one blob, and only one of them
// reports the bytes added (the others 0): their added sum to Size.
func (s *suite) concurrentSameContent(t *testing.T) {
	st := s.store(t)
	const puts = 8
	for round := range 3 {
		content := random(256<<10+round, uint64(round))
		b := newBarrier(puts)
		type result struct {
			hash  string
			added int64
			err   error
		}
		results := make(chan result, puts)
		within(t, "puts of one content at once", func() {
			var wg sync.WaitGroup
			for range puts {
				wg.Go(func() {
					h, n, err := st.Put(ctx, "s-1", b.reader(content), int64(len(content)))
					results <- result{h, n, err}
				})
			}
			wg.Wait()
		})
		close(results)
		var added int64
		adders := 0
		for r := range results {
			require.NoError(t, r.err)
			assert.Equal(t, sum(content), r.hash)
			added += r.added
			if r.added > 0 {
				adders++
			}
		}
		assert.Equal(t, 1, adders, "round %d: one Put of the content adds it", round)
		assert.EqualValues(t, len(content), added, "round %d: the Puts' added sum to the content's size", round)
		assert.Equal(t, content, read(t, st, "s-1", sum(content)))
		assert.Equal(t, []string{sum(content)}, hashes(t, st, "s-1"), "round %d: one blob", round)
		assert.EqualValues(t, len(content), size(t, st, "s-1"), "round %d", round)
		_, err := st.DeleteNamespace(ctx, "s-1")
		require.NoError(t, err)
	}
}

// concurrentPuts: many Puts at once, of different content and of the
// same content, in two namespaces, beside Opens, Lists and Sizes: every
// content is stored once per namespace and reads back as itself, and each
// namespace's Size is the sum of what its Puts added.
func (s *suite) concurrentPuts(t *testing.T) {
	st := s.store(t)
	const kinds = 8
	var contents [kinds][]byte
	for i := range contents {
		contents[i] = random(100_000+i*4096, uint64(100+i))
	}
	old := random(50_000, 99)
	put(t, st, "s-0", old)
	namespaces := []string{"s-0", "s-1"}
	var mu sync.Mutex
	added := map[string]int64{"s-0": int64(len(old))}
	var errs []error
	within(t, "puts at once", func() {
		var wg sync.WaitGroup
		for g := range 3 * kinds {
			ns := namespaces[(g/kinds)%2] // s-0 gets each content twice
			c := contents[g%kinds]
			wg.Go(func() {
				_, n, err := st.Put(ctx, ns, bytes.NewReader(c), int64(len(c)))
				mu.Lock()
				defer mu.Unlock()
				added[ns] += n
				errs = append(errs, err)
			})
			wg.Go(func() { // readers beside the writers
				b, err := readAll(st, "s-0", sum(old))
				if err == nil && !bytes.Equal(b, old) {
					err = io.ErrShortBuffer
				}
				if err == nil {
					err = st.List(ctx, ns, func(string) error { return nil })
				}
				if err == nil {
					_, err = st.Size(ctx, ns)
				}
				mu.Lock()
				defer mu.Unlock()
				errs = append(errs, err)
			})
		}
		wg.Wait()
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
	var want []string
	var total int64
	for _, c := range contents {
		want = append(want, sum(c))
		total += int64(len(c))
		for _, ns := range namespaces {
			assert.Equal(t, c, read(t, st, ns, sum(c)))
		}
	}
	assert.Equal(t, sorted(want...), hashes(t, st, "s-1"))
	assert.Equal(t, sorted(append(want, sum(old))...), hashes(t, st, "s-0"))
	assert.Equal(t, total, added["s-1"], "each content added once in s-1")
	assert.Equal(t, total+int64(len(old)), added["s-0"], "each content added once in s-0, though put twice")
	for _, ns := range namespaces {
		assert.Equal(t, added[ns], size(t, st, ns), "Size of %s", ns)
	}
}

// readAll reads blob hash of ns.
func readAll(st blobs.Store, ns, hash string) ([]byte, error) {
	rc, _, err := st.Open(ctx, ns, hash)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}
