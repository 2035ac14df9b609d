package s3blobs

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/minio/minio-go/v7"

	"github.com/cellbox/cellbox/sandbox/blobs"
)

// keptPrefix is where Kept keeps its files, under the store's PREFIX: a
// name no namespace has (namespaces do not start with '.'), which Open's
// sweep of ".cellbox/" leaves alone.
const keptPrefix = ".kept/"

// Kept is a store of whole files by name beside the blobs: the workspaces
// a remote backend keeps of its stopped boxes (backend.Keeper), which
// every server sharing the bucket must reach. A Put replaces a file whole
// or not at all (an S3 object appears when its upload completes): a
// failed one leaves the last whole copy.
type Kept struct{ s *Store }

// Kept returns the store's files.
func (s *Store) Kept() *Kept { return &Kept{s: s} }

func (k *Kept) key(name string) (string, error) {
	if name == "" || strings.ContainsAny(name, "/\\") || strings.HasPrefix(name, ".") {
		return "", fmt.Errorf("s3blobs: kept file name %q: want a plain file name: %w", name, blobs.ErrInvalid)
	}
	return k.s.prefix + keptPrefix + name, nil
}

// Put stores r's content as name, replacing what was there. The length
// need not be known: it is uploaded in parts.
func (k *Kept) Put(ctx context.Context, name string, r io.Reader) error {
	key, err := k.key(name)
	if err != nil {
		return err
	}
	sr := &strictReader{r: r}
	if _, err = k.s.core.Client.PutObject(ctx, k.s.bucket, key, sr, -1, minio.PutObjectOptions{PartSize: 16 << 20}); err != nil {
		if sr.err != nil {
			err = sr.err
		}
		return k.s.wrap(ctx, "put", key, err)
	}
	return nil
}

// strictReader hides its reader's errors from minio-go, which reads parts
// with io.ReadFull and takes io.ErrUnexpectedEOF for the end of the
// stream: a tar stream cut off that way (a connection to a box that broke)
// would be stored, short, as a whole file. It fails the upload instead.
type strictReader struct {
	r   io.Reader
	err error // the reader's own error, other than io.EOF
}

func (s *strictReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		s.err = err
		return n, errReadFailed
	}
	return n, err
}

var errReadFailed = errorString("the content could not be read")

// errorString is an error that wraps nothing (errors.Is finds no
// io.ErrUnexpectedEOF behind it).
type errorString string

func (e errorString) Error() string { return string(e) }

// Get opens name; a missing one is an error wrapping blobs.ErrNotFound.
func (k *Kept) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	key, err := k.key(name)
	if err != nil {
		return nil, err
	}
	if _, err := k.s.core.StatObject(ctx, k.s.bucket, key, minio.StatObjectOptions{}); err != nil {
		return nil, k.s.wrap(ctx, "stat", key, err)
	}
	o, err := k.s.core.Client.GetObject(ctx, k.s.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, k.s.wrap(ctx, "get", key, err)
	}
	return o, nil
}

// Delete removes name; a missing one is not an error.
func (k *Kept) Delete(ctx context.Context, name string) error {
	key, err := k.key(name)
	if err != nil {
		return err
	}
	err = k.s.core.RemoveObject(ctx, k.s.bucket, key, minio.RemoveObjectOptions{})
	if err != nil && code(err) != "NoSuchKey" {
		return k.s.wrap(ctx, "delete", key, err)
	}
	return nil
}
