package s3blobs_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/s3test"
	"github.com/cellbox/cellbox/sandbox/blobs"
	"github.com/cellbox/cellbox/sandbox/blobs/blobstest"
	"github.com/cellbox/cellbox/sandbox/blobs/s3blobs"
)

var ctx = context.Background()

// buckets numbers the buckets of a test binary's stores.
var buckets atomic.Int64

// newBucket returns a bucket name no store of this process has used.
func newBucket() string { return fmt.Sprintf("bucket-%d", buckets.Add(1)) }

// open opens the store at bucketAndPrefix of srv.
func open(t testing.TB, srv *s3test.Server, bucketAndPrefix string) *s3blobs.Store {
	t.Helper()
	s, err := s3blobs.Open(ctx, srv.URL(bucketAndPrefix))
	require.NoError(t, err)
	return s
}

// TestS3Store runs the conformance suite on versitygw: each store a new
// bucket (made by Open) with a prefix, on one server.
func TestS3Store(t *testing.T) {
	srv := s3test.StartServer(t)
	blobstest.Run(t, func(t *testing.T) blobs.Store {
		s := open(t, srv, newBucket()+"/snapshots/v1")
		assert.True(t, s.Conditional(), "versitygw honours If-None-Match: * on PUT")
		return s
	})
}

// TestS3StoreNoPrefix runs the suite on stores at the top of a bucket.
func TestS3StoreNoPrefix(t *testing.T) {
	srv := s3test.StartServer(t)
	blobstest.Run(t, func(t *testing.T) blobs.Store {
		return open(t, srv, newBucket())
	})
}

// client is a raw S3 client of srv, to look at the bucket behind the store.
func client(t testing.TB, srv *s3test.Server) *minio.Client {
	t.Helper()
	u, err := url.Parse(srv.Endpoint())
	require.NoError(t, err)
	access, secret := srv.Credentials()
	c, err := minio.New(u.Host, &minio.Options{Creds: credentials.NewStaticV4(access, secret, ""), Region: s3test.Region})
	require.NoError(t, err)
	return c
}

// keys lists every object of bucket, and every incomplete multipart upload
// (as "upload:KEY").
func keys(t testing.TB, c *minio.Client, bucket string) []string {
	t.Helper()
	out := []string{}
	for o := range c.ListObjectsIter(ctx, bucket, minio.ListObjectsOptions{Recursive: true}) {
		require.NoError(t, o.Err)
		out = append(out, o.Key)
	}
	for u := range c.ListIncompleteUploads(ctx, bucket, "", true) {
		require.NoError(t, u.Err)
		out = append(out, "upload:"+u.Key)
	}
	return out
}

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func random(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(1 + r.IntN(255))
	}
	return b
}

// failing reads b and then fails with err.
func failing(b []byte, err error) io.Reader {
	return io.MultiReader(bytes.NewReader(b), errReader{err})
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// TestFailedPutLeavesNoObject: Puts whose reader fails part way (content
// kept in memory, or spooled to a file), whose size is wrong, or whose
// context ends, leave no object and no multipart upload in the bucket, as
// a raw listing of it shows; the blob's key is where the package comment
// says.
func TestFailedPutLeavesNoObject(t *testing.T) {
	srv := s3test.StartServer(t)
	c := client(t, srv)
	bucket := newBucket()
	s := open(t, srv, bucket+"/pre")
	boom := errors.New("the box went away")
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	for _, n := range []int{1000, 3 << 20} {
		content := random(n, uint64(n))
		for name, put := range map[string]func() error{
			"reader error": func() error {
				_, _, err := s.Put(ctx, "s-1", failing(content[:n/2], boom), int64(n))
				if !errors.Is(err, boom) {
					return fmt.Errorf("want the reader's error, got %v", err)
				}
				return nil
			},
			"short": func() error {
				_, _, err := s.Put(ctx, "s-1", bytes.NewReader(content), int64(n)+1)
				if !errors.Is(err, blobs.ErrSize) {
					return fmt.Errorf("want ErrSize, got %v", err)
				}
				return nil
			},
			"long": func() error {
				_, _, err := s.Put(ctx, "s-1", bytes.NewReader(content), int64(n)-1)
				if !errors.Is(err, blobs.ErrSize) {
					return fmt.Errorf("want ErrSize, got %v", err)
				}
				return nil
			},
			"context": func() error {
				_, _, err := s.Put(cancelled, "s-1", bytes.NewReader(content), int64(n))
				if !errors.Is(err, context.Canceled) {
					return fmt.Errorf("want context.Canceled, got %v", err)
				}
				return nil
			},
		} {
			require.NoError(t, put(), "%s of %d bytes", name, n)
			assert.Empty(t, keys(t, c, bucket), "%s of %d bytes: the bucket holds nothing", name, n)
		}
	}
	content := random(5000, 1)
	hash, added, err := s.Put(ctx, "s-1", bytes.NewReader(content), int64(len(content)))
	require.NoError(t, err)
	assert.EqualValues(t, len(content), added)
	assert.Equal(t, []string{"pre/s-1/" + hash}, keys(t, c, bucket), "a blob is PREFIX/NS/HASH, and nothing else is left")
}

// TestWrongSizeRefused: a Put that says more or fewer bytes than its
// reader holds is refused with ErrSize, whichever way it spools; the
// content put with its true size is stored.
func TestWrongSizeRefused(t *testing.T) {
	srv := s3test.StartServer(t)
	s := open(t, srv, newBucket())
	for _, n := range []int{0, 10, 2 << 20} {
		content := random(n, 3)
		for _, said := range []int64{int64(n) + 1, int64(n) * 2, int64(n) - 1, 0} {
			if said == int64(n) || said < 0 {
				continue
			}
			_, _, err := s.Put(ctx, "s-1", bytes.NewReader(content), said)
			assert.ErrorIs(t, err, blobs.ErrSize, "%d bytes said to be %d", n, said)
		}
		size, err := s.Size(ctx, "s-1")
		require.NoError(t, err)
		assert.Zero(t, size, "nothing stored for %d bytes of the wrong size", n)
		hash, added, err := s.Put(ctx, "s-1", bytes.NewReader(content), int64(n))
		require.NoError(t, err)
		assert.Equal(t, sum(content), hash)
		assert.EqualValues(t, n, added)
		_, err = s.DeleteNamespace(ctx, "s-1")
		require.NoError(t, err)
	}
	_, _, err := s.Put(ctx, "s-1", bytes.NewReader(nil), -1)
	assert.ErrorIs(t, err, blobs.ErrInvalid)
}

// TestRestartKeepsBlobs: blobs outlive the server's process: after a
// restart the same store (and a store opened anew) reads, lists and
// counts them, and deduplicates against them.
func TestRestartKeepsBlobs(t *testing.T) {
	srv := s3test.StartServer(t)
	u := newBucket() + "/snap"
	s := open(t, srv, u)
	contents := [][]byte{random(100, 1), random(2<<20, 2), make([]byte, 3<<20)}
	var total int64
	for _, c := range contents {
		_, added, err := s.Put(ctx, "s-1", bytes.NewReader(c), int64(len(c)))
		require.NoError(t, err)
		total += added
	}
	assert.EqualValues(t, 100+2<<20+3<<20, total, "an object store counts every byte, zeros too")
	srv.Restart()
	for _, st := range []*s3blobs.Store{s, open(t, srv, u)} {
		for _, c := range contents {
			rc, n, err := st.Open(ctx, "s-1", sum(c))
			require.NoError(t, err)
			got, err := io.ReadAll(rc)
			rc.Close()
			require.NoError(t, err)
			assert.EqualValues(t, len(c), n)
			assert.True(t, bytes.Equal(c, got), "blob of %d bytes reads back after the restart", len(c))
			_, added, err := st.Put(ctx, "s-1", bytes.NewReader(c), int64(len(c)))
			require.NoError(t, err)
			assert.Zero(t, added, "content stored before the restart is not stored again")
		}
		size, err := st.Size(ctx, "s-1")
		require.NoError(t, err)
		assert.Equal(t, total, size)
		ns, err := st.Namespaces(ctx)
		require.NoError(t, err)
		assert.Equal(t, []string{"s-1"}, ns)
	}
	srv.Stop()
	_, _, err := s.Open(ctx, "s-1", sum(contents[0]))
	assert.Error(t, err, "a stopped server")
	assert.NotErrorIs(t, err, blobs.ErrNotFound, "a server that does not answer is no missing blob")
}

// TestBadURL: URLs Open cannot use are refused before any request, with an
// error wrapping ErrBadURL that says what was wrong and the form to write;
// a secret key in the URL is not repeated in the error.
func TestBadURL(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	const (
		keys = "access_key=a&secret_key=topsecret"
		ep   = "endpoint=http://127.0.0.1:1&" + keys
	)
	for u, want := range map[string]string{
		"":                                            "scheme",
		"bucket/prefix":                               "scheme",
		"http://127.0.0.1:8333/bucket?" + ep:          `the scheme is "http", not s3`,
		"s3:///prefix?" + ep:                          "no bucket",
		"s3://Bad_Bucket?" + ep:                       `bucket "Bad_Bucket"`,
		"s3://bk?" + ep:                               `bucket "bk"`,
		"s3://bkt//x?" + ep:                           "empty, . or .. segment",
		"s3://bkt/x/../y?" + ep:                       "empty, . or .. segment",
		"s3://bkt?" + ep + "&regoin=us-east-1":        `unknown parameter "regoin"`,
		"s3://bkt?endpoint=127.0.0.1:8333&" + keys:    "is not http://HOST[:PORT]",
		"s3://bkt?endpoint=ftp://h&" + keys:           "is not http://HOST[:PORT]",
		"s3://bkt?endpoint=http://h/path&" + keys:     "is not http://HOST[:PORT]",
		"s3://bkt?endpoint=http://h&access_key=a":     "access_key and secret_key go together",
		"s3://bkt/p?endpoint=http://h&secret_key=top": "access_key and secret_key go together",
		"s3://bkt?endpoint=http://h":                  "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
		"s3://key:topsecret@bkt?endpoint=http://h":    "not before the bucket",
		"s3://bkt?" + ep + "&region=a&region=b":       "region is given 2 times",
	} {
		_, err := s3blobs.Open(ctx, u)
		require.Error(t, err, u)
		assert.ErrorIs(t, err, s3blobs.ErrBadURL, u)
		assert.Contains(t, err.Error(), want, u)
		assert.Contains(t, err.Error(), "s3://BUCKET/PREFIX?endpoint=http://HOST:PORT&region=REGION", "%s: the error shows the form", u)
		assert.NotContains(t, err.Error(), "topsecret", "%s: no secret in the error", u)
	}
}

// TestCredentials: the store takes its credentials from the environment
// when the URL has none; wrong ones fail Open with the server's refusal.
func TestCredentials(t *testing.T) {
	srv := s3test.StartServer(t)
	access, secret := srv.Credentials()
	bare := "s3://" + newBucket() + "?endpoint=" + url.QueryEscape(srv.Endpoint())
	t.Setenv("AWS_ACCESS_KEY_ID", access)
	t.Setenv("AWS_SECRET_ACCESS_KEY", secret)
	s, err := s3blobs.Open(ctx, bare)
	require.NoError(t, err)
	_, added, err := s.Put(ctx, "s-1", strings.NewReader("hello"), 5)
	require.NoError(t, err)
	assert.EqualValues(t, 5, added)

	t.Setenv("AWS_SECRET_ACCESS_KEY", "wrong")
	_, err = s3blobs.Open(ctx, bare)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "AWS_ACCESS_KEY_ID", "the error says where the credentials came from")
}

// TestStoresShareBucket: two stores of one bucket and prefix (two servers
// of cellbox) see each other's blobs, and Puts of one content through both
// at once report it added once: the conditional PUT, not the lock of one
// Store, decides.
func TestStoresShareBucket(t *testing.T) {
	srv := s3test.StartServer(t)
	u := newBucket() + "/shared"
	const stores = 6
	var ss []*s3blobs.Store
	for range stores {
		ss = append(ss, open(t, srv, u))
	}
	for round := range 5 {
		content := random(200_000+round, uint64(round))
		var wg sync.WaitGroup
		var added atomic.Int64
		var adders atomic.Int32
		start := make(chan struct{})
		for _, s := range ss {
			wg.Go(func() {
				<-start
				_, n, err := s.Put(ctx, "s-1", bytes.NewReader(content), int64(len(content)))
				assert.NoError(t, err)
				added.Add(n)
				if n > 0 {
					adders.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		assert.EqualValues(t, 1, adders.Load(), "round %d: one of the stores added the content", round)
		assert.EqualValues(t, len(content), added.Load(), "round %d", round)
		size, err := ss[round%stores].Size(ctx, "s-1")
		require.NoError(t, err)
		assert.EqualValues(t, len(content), size, "round %d", round)
		_, err = ss[0].DeleteNamespace(ctx, "s-1")
		require.NoError(t, err)
	}
}

// TestMultipart: content larger than one PUT may carry (made small here)
// goes up in parts and reads back whole; a multipart Put whose reader
// fails leaves nothing, and one of content already there adds nothing.
func TestMultipart(t *testing.T) {
	restore := s3blobs.SetSizes(1<<20, 6<<20, 5<<20)
	defer restore()
	srv := s3test.StartServer(t)
	c := client(t, srv)
	bucket := newBucket()
	s := open(t, srv, bucket)
	content := random(13<<20, 5) // three parts: 5, 5 and 3 MiB
	hash, added, err := s.Put(ctx, "s-1", bytes.NewReader(content), int64(len(content)))
	require.NoError(t, err)
	assert.Equal(t, sum(content), hash)
	assert.EqualValues(t, len(content), added)
	rc, n, err := s.Open(ctx, "s-1", hash)
	require.NoError(t, err)
	got, err := io.ReadAll(rc)
	rc.Close()
	require.NoError(t, err)
	assert.EqualValues(t, len(content), n)
	assert.True(t, bytes.Equal(content, got), "the multipart blob reads back")
	_, added, err = s.Put(ctx, "s-1", bytes.NewReader(content), int64(len(content)))
	require.NoError(t, err)
	assert.Zero(t, added)
	assert.Equal(t, []string{"s-1/" + hash}, keys(t, c, bucket))
}

// TestMultipartFails: a multipart Put whose context ends after its first
// part aborts its upload: the bucket holds no object and no upload; and
// multipart Puts of one content through several stores at once report it
// added once (the condition is on the upload's completion).
func TestMultipartFails(t *testing.T) {
	restore := s3blobs.SetSizes(1<<20, 6<<20, 5<<20)
	defer restore()
	srv := s3test.StartServer(t)
	c := client(t, srv)
	bucket := newBucket()
	s := open(t, srv, bucket)
	content := random(11<<20, 6)

	mid, cancel := context.WithCancel(ctx)
	defer cancel()
	restoreHook := s3blobs.SetPartHook(func(int) { cancel() })
	_, _, err := s.Put(mid, "s-1", bytes.NewReader(content), int64(len(content)))
	restoreHook()
	require.ErrorIs(t, err, context.Canceled)
	assert.Empty(t, keys(t, c, bucket), "no object, no upload left")

	var ss []*s3blobs.Store
	for range 4 {
		ss = append(ss, open(t, srv, bucket))
	}
	var wg sync.WaitGroup
	var added atomic.Int64
	var adders atomic.Int32
	for _, s := range ss {
		wg.Go(func() {
			_, n, err := s.Put(ctx, "s-1", bytes.NewReader(content), int64(len(content)))
			assert.NoError(t, err)
			added.Add(n)
			if n > 0 {
				adders.Add(1)
			}
		})
	}
	wg.Wait()
	assert.EqualValues(t, 1, adders.Load(), "one store added the content")
	assert.EqualValues(t, len(content), added.Load())
	assert.Equal(t, []string{"s-1/" + sum(content)}, keys(t, c, bucket), "one object, no upload left")
}

// TestLostAnswer: a Put whose PUT the server stored but whose answer was
// lost (the client sends it again and the condition refuses it) still
// reports the bytes it added, as its own metadata on the object shows;
// another Put of the content then adds nothing.
func TestLostAnswer(t *testing.T) {
	srv := s3test.StartServer(t)
	target, err := url.Parse(srv.Endpoint())
	require.NoError(t, err)
	var lost atomic.Int32
	proxy := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Host = r.In.Host // signed by the client
		},
		ModifyResponse: func(resp *http.Response) error {
			req := resp.Request
			if req.Method == http.MethodPut && strings.Contains(req.URL.Path, "/s-1/") &&
				resp.StatusCode == http.StatusOK && lost.Add(1) == 1 {
				return errors.New("the answer is lost") // 502 to the client, which tries again
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, _ error) { w.WriteHeader(http.StatusBadGateway) },
	})
	defer proxy.Close()
	access, secret := srv.Credentials()
	q := url.Values{"endpoint": {proxy.URL}, "access_key": {access}, "secret_key": {secret}}
	s, err := s3blobs.Open(ctx, "s3://"+newBucket()+"?"+q.Encode())
	require.NoError(t, err)
	require.True(t, s.Conditional())

	content := random(10_000, 9)
	hash, added, err := s.Put(ctx, "s-1", bytes.NewReader(content), int64(len(content)))
	require.NoError(t, err)
	assert.EqualValues(t, 1, lost.Load(), "the first answer was lost, and the PUT not sent again after a 200")
	assert.Equal(t, sum(content), hash)
	assert.EqualValues(t, len(content), added, "the Put whose answer was lost added the content")
	_, added, err = s.Put(ctx, "s-1", bytes.NewReader(content), int64(len(content)))
	require.NoError(t, err)
	assert.Zero(t, added)
	size, err := s.Size(ctx, "s-1")
	require.NoError(t, err)
	assert.EqualValues(t, len(content), size)
}

// TestOpenSweeps: Open aborts the multipart uploads under its prefix and
// removes the probe objects that processes which died left, once they are
// old enough (here: at once), and leaves what is outside its prefix.
func TestOpenSweeps(t *testing.T) {
	srv := s3test.StartServer(t)
	c := client(t, srv)
	core := &minio.Core{Client: c}
	bucket := newBucket()
	open(t, srv, bucket+"/pre")
	_, err := core.NewMultipartUpload(ctx, bucket, "pre/s-1/"+sum([]byte("x")), minio.PutObjectOptions{})
	require.NoError(t, err)
	_, err = core.NewMultipartUpload(ctx, bucket, "other/file", minio.PutObjectOptions{})
	require.NoError(t, err)
	_, err = c.PutObject(ctx, bucket, "pre/.cellbox/probe-0123", bytes.NewReader(nil), 0, minio.PutObjectOptions{})
	require.NoError(t, err)
	open(t, srv, bucket+"/pre")
	assert.ElementsMatch(t, []string{"pre/.cellbox/probe-0123", "upload:pre/s-1/" + sum([]byte("x")), "upload:other/file"}, keys(t, c, bucket),
		"nothing is young enough to be a dead process's")

	defer s3blobs.SetStale(0, 0)()
	open(t, srv, bucket+"/pre")
	assert.Equal(t, []string{"upload:other/file"}, keys(t, c, bucket), "what is under the prefix is swept")
}
