package s3test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var ctx = context.Background()

// client is an S3 client of the server at the blob store URL u, with the
// URL's credentials.
func client(t *testing.T, u string) *minio.Client {
	t.Helper()
	pu, err := url.Parse(u)
	require.NoError(t, err)
	q := pu.Query()
	ep, err := url.Parse(q.Get("endpoint"))
	require.NoError(t, err)
	c, err := minio.New(ep.Host, &minio.Options{
		Creds:  credentials.NewStaticV4(q.Get("access_key"), q.Get("secret_key"), ""),
		Region: q.Get("region"),
	})
	require.NoError(t, err)
	return c
}

// TestStart: Start gives a URL of a server that takes the URL's
// credentials (and no others), keeps objects across Restart, and is gone
// when the test that started it ends.
func TestStart(t *testing.T) {
	var endpoint string
	var first string
	t.Run("server", func(t *testing.T) {
		u := Start(t)
		first = u
		pu, err := url.Parse(u)
		require.NoError(t, err)
		assert.Equal(t, "s3", pu.Scheme)
		assert.Equal(t, "cellbox-test", pu.Host)
		endpoint = pu.Query().Get("endpoint")
		assert.True(t, strings.HasPrefix(endpoint, "http://127.0.0.1:"), endpoint)
		assert.Equal(t, Region, pu.Query().Get("region"))

		c := client(t, u)
		require.NoError(t, c.MakeBucket(ctx, "cellbox-test", minio.MakeBucketOptions{}))
		_, err = c.PutObject(ctx, "cellbox-test", "a/b", strings.NewReader("hello"), 5, minio.PutObjectOptions{})
		require.NoError(t, err)

		bad, err := minio.New(strings.TrimPrefix(endpoint, "http://"), &minio.Options{Creds: credentials.NewStaticV4("cellbox", "wrong", "")})
		require.NoError(t, err)
		_, err = bad.ListBuckets(ctx)
		assert.Error(t, err, "other credentials are refused")
	})
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(endpoint, "http://"), time.Second)
	if err == nil {
		conn.Close()
	}
	assert.Error(t, err, "the server is killed when its test ends")

	t.Run("restart", func(t *testing.T) {
		srv := StartServer(t)
		u := srv.URL("bkt/prefix")
		assert.NotEqual(t, first, u, "each server has credentials and a port of its own")
		c := client(t, u)
		require.NoError(t, c.MakeBucket(ctx, "bkt", minio.MakeBucketOptions{}))
		_, err := c.PutObject(ctx, "bkt", "k", bytes.NewReader([]byte("kept")), 4, minio.PutObjectOptions{})
		require.NoError(t, err)
		srv.Restart()
		assert.Equal(t, u, srv.URL("bkt/prefix"), "the same URL after a restart")
		o, err := c.GetObject(ctx, "bkt", "k", minio.GetObjectOptions{})
		require.NoError(t, err)
		b, err := io.ReadAll(o)
		o.Close()
		require.NoError(t, err)
		assert.Equal(t, "kept", string(b))
		assert.DirExists(t, srv.Dir()+"/bkt", "a bucket is a directory of the data")
	})
}

// fakeTB records a Fatal or Skip and ends the call as they would.
type fakeTB struct {
	testing.TB
	fatal, skip string
}

type ended struct{}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatal(args ...any) {
	f.fatal = fmt.Sprint(args...)
	panic(ended{})
}
func (f *fakeTB) Skip(args ...any) {
	f.skip = fmt.Sprint(args...)
	panic(ended{})
}

// startEnded runs StartServer on tb, which must end it.
func startEnded(t *testing.T, tb *fakeTB) {
	defer func() {
		r := recover()
		require.Equal(t, ended{}, r, "StartServer ends the test")
	}()
	StartServer(tb)
}

// TestMissingBinary: without the server binary a test is skipped, or fails
// when CI is set, saying how to build it.
func TestMissingBinary(t *testing.T) {
	t.Setenv("CELLBOX_S3_SERVER", "/nonexistent/versitygw")
	t.Setenv("CI", "")
	tb := &fakeTB{TB: t}
	startEnded(t, tb)
	assert.Empty(t, tb.fatal)
	assert.Contains(t, tb.skip, "bash scripts/s3-server.sh build")

	t.Setenv("CI", "1")
	tb = &fakeTB{TB: t}
	startEnded(t, tb)
	assert.Empty(t, tb.skip)
	assert.Contains(t, tb.fatal, "bash scripts/s3-server.sh build")
	assert.Contains(t, tb.fatal, "/nonexistent/versitygw")
}
