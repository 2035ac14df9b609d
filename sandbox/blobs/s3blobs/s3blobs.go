/*
Package s3blobs is the blob store (package blobs' contract) in a bucket of
an object store that speaks the S3 API (AWS S3, MinIO, Ceph, SeaweedFS,
versitygw…), so that every cellbox server sharing the bucket can restore a
snapshot any of them took. It speaks S3 through github.com/minio/minio-go/v7,
a maintained client in one module (aws-sdk-go-v2 takes several), whose Core
API gives the single PUT, the multipart calls and the headers Put needs.

	s, err := s3blobs.Open(ctx, "s3://BUCKET/PREFIX?endpoint=http://127.0.0.1:7070&region=us-east-1")

A blob is the object PREFIX/NAMESPACE/HASH; a namespace exists while it
holds objects (S3 has no directories). Credentials come from
AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), or
from the URL's access_key and secret_key. Open creates the bucket if it is
missing.

# Put

The store names a blob by the hash of what it stored, so Put must know the
hash before the object gets its name, and S3 has no rename: a copy of an
object is a new write of all its bytes on most servers, and no common
server takes a condition on a copy's destination (If-None-Match), which is
what makes Puts of one content at once add it once (below). So Put spools
the content to this machine, hashing and counting it as it comes: in
memory up to 1 MiB, else in a file of the temp dir (the URL's tmpdir, or
$TMPDIR), written sparse (zeros as holes) and unlinked as soon as it is
made, so that a process that dies leaves nothing. Only once the size and
the reader are good does it upload the content, to its final key, in one
PUT (a multipart upload beyond 5 GiB) that states its SHA-256
(x-amz-checksum-sha256, which the server checks, and x-amz-content-sha256),
so the server too refuses bytes that are not the named content. A failed
Put has sent nothing, or a PUT the server drops whole: it leaves no
object. Content the namespace holds already is found by a HEAD before the
upload and is not sent again, which saves the upload a streaming Put would
have made before it knew the hash (snapshots of one session share most of
their files). The price: local disk for the largest blobs being put at
once (their data, not their holes), and a blob is read, then sent.

Puts of the same content at once: within one Store a lock per key
serialises them, so one uploads and the others find its blob. Across
processes (servers sharing the bucket), the PUT carries If-None-Match: *,
so the server stores the first and refuses the others with 412, and they
report 0 added. A PUT that the client sent again after a lost answer may
find its own first attempt stored: each Put writes a random id in the
object's metadata (x-amz-meta-cellbox-put), and a 412 whose object holds
its own id counts as added. Open checks that the server honours the
condition (a probe object put twice); on one that does not (Conditional
reports false), two processes putting one content at the same moment may
both report it added, though Size counts it once.

# Size

Size is the sum of the blobs' object sizes: an object store keeps and
bills every byte, zeros too, so added, freed and Size count every byte of
the content. Deletes of one blob at once report it freed once within a
Store (the lock per key); two processes deleting it at the same moment may
both count it.

# Leftovers

A multipart upload (blobs over 5 GiB) that its process did not finish
takes room until it is aborted: Open aborts those under PREFIX started
more than a day before, and removes probe objects older than an hour
(PREFIX/.cellbox/, a name no namespace can have).
*/
package s3blobs

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/minio/minio-go/v7/pkg/s3utils"

	"github.com/cellbox/cellbox/internal/safe"
	"github.com/cellbox/cellbox/internal/sparse"
	"github.com/cellbox/cellbox/sandbox/blobs"
)

// urlForm is what an Open URL looks like, for errors.
const urlForm = "s3://BUCKET/PREFIX?endpoint=http://HOST:PORT&region=REGION " +
	"(credentials from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or &access_key=…&secret_key=…; " +
	"optional &tmpdir=DIR for Puts' spool files)"

// Sizes of Put's ways, variables so that tests can make them small.
var (
	// memSpool is the largest content Put keeps in memory; larger content
	// is spooled to a file.
	memSpool int64 = 1 << 20
	// maxSinglePut is the largest object one PUT may carry (S3's limit);
	// larger content goes up in a multipart upload.
	maxSinglePut int64 = 5 << 30
	// minPartSize is the size of a multipart upload's parts, unless the
	// content needs larger ones to fit S3's 10,000 parts.
	minPartSize int64 = 512 << 20
)

// partHook, if set (by tests), is called after each part multipart
// uploaded.
var partHook func(part int)

// putIDMeta is user metadata naming the Put that wrote an object, so that
// a conditional PUT that was retried by the client after the server had
// stored it (the answer lost) and then refused with 412 still knows it
// was the one that added the blob.
const putIDMeta = "Cellbox-Put"

// ErrBadURL is wrapped by Open's errors about its URL, which say what was
// wrong and the form to write.
var ErrBadURL = errors.New("s3blobs: bad blob store URL")

// Ages past which Open removes leftovers (variables for tests).
var (
	staleUpload = 24 * time.Hour
	staleProbe  = time.Hour
)

// Store is the blob store in a bucket of an S3 server. Open makes one.
type Store struct {
	core        *minio.Core
	bucket      string
	prefix      string // "" or "PREFIX/"
	tmpDir      string // "" for os.TempDir
	conditional bool   // the server honours If-None-Match: * on PUT
	locks       keyLocks
}

var _ blobs.Store = (*Store)(nil)

// config is an Open URL, parsed.
type config struct {
	bucket, prefix   string
	endpoint         string // host:port
	secure           bool
	region           string
	access, secret   string
	sessionToken     string
	tmpDir           string
	credentialsWhere string // for errors
}

// Open opens the store of URL u (see the package comment), creating the
// bucket if it is missing, and checks that the server answers and
// whether it honours conditional PUTs.
func Open(ctx context.Context, u string) (*Store, error) {
	cfg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	creds := credentials.NewStaticV4(cfg.access, cfg.secret, cfg.sessionToken)
	core, err := minio.NewCore(cfg.endpoint, &minio.Options{
		Creds:  creds,
		Secure: cfg.secure,
		Region: cfg.region,
	})
	if err != nil {
		return nil, fmt.Errorf("s3blobs: %s: %w", redact(u), err)
	}
	s := &Store{core: core, bucket: cfg.bucket, prefix: cfg.prefix, tmpDir: cfg.tmpDir}
	if err := s.makeBucket(ctx, cfg.region); err != nil {
		return nil, fmt.Errorf("s3blobs: %s (credentials from %s): %w", redact(u), cfg.credentialsWhere, err)
	}
	if s.conditional, err = s.probeConditional(ctx); err != nil {
		return nil, fmt.Errorf("s3blobs: %s: %w", redact(u), err)
	}
	s.sweep(ctx)
	return s, nil
}

// parseURL reads an Open URL; its errors say what to write.
func parseURL(raw string) (config, error) {
	var cfg config
	bad := func(format string, args ...any) (config, error) {
		return config{}, fmt.Errorf("%w %q: %s; want %s",
			ErrBadURL, redact(raw), fmt.Sprintf(format, args...), urlForm)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return bad("%v", errors.Unwrap(err))
	}
	if u.Scheme != "s3" {
		return bad("the scheme is %q, not s3", u.Scheme)
	}
	if u.User != nil {
		return bad("credentials go in access_key= and secret_key= or the environment, not before the bucket")
	}
	if u.Opaque != "" || u.Host == "" {
		return bad("no bucket")
	}
	cfg.bucket = u.Host
	if err := s3utils.CheckValidBucketNameStrict(cfg.bucket); err != nil {
		return bad("bucket %q: %v", cfg.bucket, err)
	}
	if p := strings.TrimSuffix(strings.TrimPrefix(u.Path, "/"), "/"); p != "" {
		for seg := range strings.SplitSeq(p, "/") {
			if seg == "" || seg == "." || seg == ".." {
				return bad("prefix %q has an empty, . or .. segment", p)
			}
		}
		cfg.prefix = p + "/"
	}
	q := u.Query()
	for k, v := range q {
		switch k {
		case "endpoint", "region", "access_key", "secret_key", "session_token", "tmpdir":
			if len(v) != 1 {
				return bad("%s is given %d times", k, len(v))
			}
		default:
			return bad("unknown parameter %q", k)
		}
	}
	cfg.region = q.Get("region")
	if cfg.region == "" {
		cfg.region = "us-east-1"
	}
	ep := q.Get("endpoint")
	if ep == "" {
		ep = "https://s3.amazonaws.com"
	}
	e, err := url.Parse(ep)
	if err != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" ||
		strings.Trim(e.Path, "/") != "" || e.RawQuery != "" || e.User != nil {
		return bad("endpoint %q is not http://HOST[:PORT] or https://HOST[:PORT]", ep)
	}
	cfg.endpoint, cfg.secure = e.Host, e.Scheme == "https"
	cfg.tmpDir = q.Get("tmpdir")

	ak, sk := q.Get("access_key"), q.Get("secret_key")
	switch {
	case ak != "" && sk != "":
		cfg.access, cfg.secret, cfg.sessionToken = ak, sk, q.Get("session_token")
		cfg.credentialsWhere = "the URL"
	case ak != "" || sk != "":
		return bad("access_key and secret_key go together")
	default:
		cfg.access, cfg.secret = os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY")
		cfg.sessionToken = os.Getenv("AWS_SESSION_TOKEN")
		cfg.credentialsWhere = "AWS_ACCESS_KEY_ID"
		if cfg.access == "" || cfg.secret == "" {
			return bad("no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or access_key= and secret_key= in the URL")
		}
	}
	return cfg, nil
}

// redact is an Open URL with its secret key and session token hidden.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(an unparsable URL)"
	}
	q := u.Query()
	if !q.Has("secret_key") && !q.Has("session_token") && u.User == nil {
		return raw
	}
	for _, k := range []string{"secret_key", "session_token"} {
		if q.Has(k) {
			q.Set(k, "REDACTED")
		}
	}
	u.RawQuery = q.Encode()
	u.User = nil
	return u.String()
}

// makeBucket creates the bucket unless it exists.
func (s *Store) makeBucket(ctx context.Context, region string) error {
	ok, err := s.core.BucketExists(ctx, s.bucket)
	if err != nil {
		return ctxErr(ctx, err)
	}
	if ok {
		return nil
	}
	err = s.core.MakeBucket(ctx, s.bucket, minio.MakeBucketOptions{Region: region})
	switch code(err) {
	case "", "BucketAlreadyOwnedByYou":
		return nil
	case "BucketAlreadyExists": // made meanwhile: ours if we can see it
		if ok, err2 := s.core.BucketExists(ctx, s.bucket); err2 == nil && ok {
			return nil
		}
	}
	return ctxErr(ctx, err)
}

// probeConditional reports whether the server honours If-None-Match: * on
// PUT: an empty probe object put twice with it must be refused the second
// time. A server that does not know the header and says so (501) gets none.
func (s *Store) probeConditional(ctx context.Context) (bool, error) {
	key := s.prefix + ".cellbox/probe-" + randomHex()
	put := func(conditional bool) error {
		opts := minio.PutObjectOptions{}
		if conditional {
			opts.SetMatchETagExcept("*")
		}
		_, err := s.core.PutObject(ctx, s.bucket, key, bytes.NewReader(nil), 0, "", "", opts)
		return err
	}
	defer s.core.RemoveObject(context.WithoutCancel(ctx), s.bucket, key, minio.RemoveObjectOptions{})
	err := put(true)
	if code(err) == "NotImplemented" {
		return false, ctxErr(ctx, put(false))
	}
	if err != nil {
		return false, ctxErr(ctx, err)
	}
	switch err := put(true); code(err) {
	case "PreconditionFailed":
		return true, nil
	case "":
		return false, nil
	default:
		return false, ctxErr(ctx, err)
	}
}

// sweep removes what Puts and probes of processes that died left: their
// multipart uploads and probe objects, once old enough that no live
// process can be using them. It is housekeeping: what fails is left for
// the next Open.
func (s *Store) sweep(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for up := range s.core.ListIncompleteUploads(ctx, s.bucket, s.prefix, true) {
		if up.Err != nil {
			break
		}
		if time.Since(up.Initiated) > staleUpload {
			s.core.AbortMultipartUpload(ctx, s.bucket, up.Key, up.UploadID)
		}
	}
	for o := range s.core.ListObjectsIter(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + ".cellbox/", Recursive: true}) {
		if o.Err != nil {
			break
		}
		if time.Since(o.LastModified) > staleProbe {
			s.core.RemoveObject(ctx, s.bucket, o.Key, minio.RemoveObjectOptions{})
		}
	}
}

// Conditional reports whether the server honours If-None-Match: * on PUT,
// which makes Puts of one content by several processes at once report it
// added once (see the package comment).
func (s *Store) Conditional() bool { return s.conditional }

// nsPrefix is the key prefix of namespace ns's blobs.
func (s *Store) nsPrefix(ns string) string { return s.prefix + ns + "/" }

// key is the key of blob hash of ns.
func (s *Store) key(ns, hash string) string { return s.nsPrefix(ns) + hash }

// Put implements blobs.Store (see the package comment for how).
func (s *Store) Put(ctx context.Context, ns string, r io.Reader, size int64) (string, int64, error) {
	if err := blobs.CheckNamespace(ns); err != nil {
		return "", 0, err
	}
	if size < 0 {
		return "", 0, fmt.Errorf("blob of %d bytes: %w", size, blobs.ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return "", 0, err
	}
	sp, hash, err := s.spool(ctx, r, size)
	if err != nil {
		return "", 0, err
	}
	defer sp.Close()
	key := s.key(ns, hash)
	unlock, err := s.locks.lock(ctx, key)
	if err != nil {
		return "", 0, err
	}
	defer unlock()
	// AWS S3 answers a conditional PUT racing another write of its key
	// with 409 ConditionalRequestConflict, to be tried again; by then the
	// key may exist.
	for attempt := 1; ; attempt++ {
		if _, err := s.core.StatObject(ctx, s.bucket, key, minio.StatObjectOptions{}); err == nil {
			return hash, 0, nil
		} else if code(err) != "NoSuchKey" {
			return "", 0, s.wrap(ctx, "put", key, err)
		}
		added, err := s.upload(ctx, key, sp, size, hash)
		if code(err) == "ConditionalRequestConflict" && attempt < 5 {
			select {
			case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
				continue
			case <-ctx.Done():
				return "", 0, ctx.Err()
			}
		}
		if err != nil {
			return "", 0, s.wrap(ctx, "put", key, err)
		}
		return hash, added, nil
	}
}

// spooled is the content of a Put, held until it is uploaded: in memory,
// or in an unlinked file.
type spooled struct {
	io.ReaderAt
	f *os.File
}

func (sp spooled) Close() error {
	if sp.f != nil {
		return sp.f.Close()
	}
	return nil
}

// spool reads exactly size bytes of r (else an error wrapping
// blobs.ErrSize, or r's or ctx's error) into memory or a file, and returns
// them with their hash.
func (s *Store) spool(ctx context.Context, r io.Reader, size int64) (spooled, string, error) {
	h := sha256.New()
	r = safe.ContextReader(ctx, r)
	in := io.TeeReader(io.LimitReader(r, size), h)
	var sp spooled
	var n int64
	var err error
	if size <= memSpool {
		buf := bytes.NewBuffer(make([]byte, 0, size))
		n, err = io.Copy(buf, in)
		sp.ReaderAt = bytes.NewReader(buf.Bytes())
	} else {
		var f *os.File
		if f, err = os.CreateTemp(s.tmpDir, "cellbox-s3blob-"); err != nil {
			return spooled{}, "", fmt.Errorf("s3blobs: spool: %w", err)
		}
		os.Remove(f.Name()) // the open file keeps it until Close, and no longer
		sp = spooled{ReaderAt: f, f: f}
		n, err = sparse.Copy(f, in) // zeros as holes: 64 MiB of zeros take no disk
	}
	if err == nil && n < size {
		err = fmt.Errorf("the content ended after %d of %d bytes: %w", n, size, blobs.ErrSize)
	}
	if err == nil {
		err = atEnd(r, size)
	}
	if err != nil {
		sp.Close()
		return spooled{}, "", err
	}
	return sp, hex.EncodeToString(h.Sum(nil)), nil
}

// atEnd checks that r, of which size bytes were read, holds no more.
func atEnd(r io.Reader, size int64) error {
	var b [1]byte
	for {
		k, err := r.Read(b[:])
		if k > 0 {
			return fmt.Errorf("the content holds more than %d bytes: %w", size, blobs.ErrSize)
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// upload writes the spooled content to key unless the key exists (with
// If-None-Match: * when the server honours it), and returns the bytes
// added: size, or 0 if another Put stored the key first.
func (s *Store) upload(ctx context.Context, key string, sp spooled, size int64, hash string) (int64, error) {
	sum, _ := hex.DecodeString(hash)
	id := randomHex()
	opts := minio.PutObjectOptions{
		ContentType: "application/octet-stream",
		UserMetadata: map[string]string{
			putIDMeta: id,
		},
	}
	if s.conditional {
		opts.SetMatchETagExcept("*")
	}
	var err error
	if size <= maxSinglePut {
		opts.UserMetadata["X-Amz-Checksum-Sha256"] = base64.StdEncoding.EncodeToString(sum)
		_, err = s.core.PutObject(ctx, s.bucket, key, io.NewSectionReader(sp, 0, size), size, "", hash, opts)
	} else {
		err = s.multipart(ctx, key, sp, size, id)
	}
	if code(err) == "PreconditionFailed" {
		// Stored by another Put; or by this one, if the client sent the
		// request again after the server had stored it.
		info, serr := s.core.StatObject(ctx, s.bucket, key, minio.StatObjectOptions{})
		if serr == nil && info.UserMetadata[putIDMeta] == id {
			return size, nil
		}
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return size, nil
}

// multipart uploads content larger than one PUT may carry, each part with
// its SHA-256, the condition on the completion, putID in the metadata; it
// aborts the upload if it fails. Hand-written rather than minio-go's PutObject, which
// would also send the condition on the upload's creation and cannot be
// given each part's hash.
func (s *Store) multipart(ctx context.Context, key string, sp spooled, size int64, putID string) (err error) {
	create := minio.PutObjectOptions{ContentType: "application/octet-stream", UserMetadata: map[string]string{putIDMeta: putID}}
	id, err := s.core.NewMultipartUpload(ctx, s.bucket, key, create)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			s.core.AbortMultipartUpload(actx, s.bucket, key, id)
		}
	}()
	partSize := max(minPartSize, (size+9999)/10000)
	var parts []minio.CompletePart
	for n, off := 1, int64(0); off < size; n, off = n+1, off+partSize {
		l := min(partSize, size-off)
		h := sha256.New()
		if _, err := io.Copy(h, io.NewSectionReader(sp, off, l)); err != nil {
			return err
		}
		p, err := s.core.PutObjectPart(ctx, s.bucket, key, id, n, io.NewSectionReader(sp, off, l), l,
			minio.PutObjectPartOptions{Sha256Hex: hex.EncodeToString(h.Sum(nil))})
		if err != nil {
			return err
		}
		parts = append(parts, minio.CompletePart{PartNumber: n, ETag: p.ETag})
		if partHook != nil {
			partHook(n)
		}
	}
	done := minio.PutObjectOptions{}
	if s.conditional {
		done.SetMatchETagExcept("*")
	}
	_, err = s.core.CompleteMultipartUpload(ctx, s.bucket, key, id, parts, done)
	return err
}

// Open implements blobs.Store.
func (s *Store) Open(ctx context.Context, ns, hash string) (io.ReadCloser, int64, error) {
	if err := check(ctx, ns, hash); err != nil {
		return nil, 0, err
	}
	key := s.key(ns, hash)
	rc, info, _, err := s.core.GetObject(ctx, s.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, 0, s.wrap(ctx, "open", key, err)
	}
	return rc, info.Size, nil
}

// check checks a call's context, namespace and hashes.
func check(ctx context.Context, ns string, hashes ...string) error {
	if err := blobs.CheckNamespace(ns); err != nil {
		return err
	}
	for _, h := range hashes {
		if err := blobs.CheckHash(h); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// Delete implements blobs.Store.
func (s *Store) Delete(ctx context.Context, ns string, hashes ...string) (int64, error) {
	if err := check(ctx, ns, hashes...); err != nil {
		return 0, err
	}
	var freed int64
	for _, h := range hashes {
		n, err := s.delete(ctx, s.key(ns, h))
		freed += n
		if err != nil {
			return freed, err
		}
	}
	return freed, nil
}

// delete removes the blob at key and returns its size (0 if there was
// none).
func (s *Store) delete(ctx context.Context, key string) (int64, error) {
	unlock, err := s.locks.lock(ctx, key)
	if err != nil {
		return 0, err
	}
	defer unlock()
	info, err := s.core.StatObject(ctx, s.bucket, key, minio.StatObjectOptions{})
	if code(err) == "NoSuchKey" {
		return 0, nil
	}
	if err != nil {
		return 0, s.wrap(ctx, "delete", key, err)
	}
	if err := s.core.RemoveObject(ctx, s.bucket, key, minio.RemoveObjectOptions{}); err != nil {
		return 0, s.wrap(ctx, "delete", key, err)
	}
	return info.Size, nil
}

// walk calls fn with the hash and size of each blob of ns; keys under the
// namespace that are not blobs are skipped.
func (s *Store) walk(ctx context.Context, ns string, fn func(hash string, size int64) error) error {
	if err := check(ctx, ns); err != nil {
		return err
	}
	lctx, cancel := context.WithCancel(ctx) // ends the listing when fn stops the walk
	defer cancel()
	pre := s.nsPrefix(ns)
	for o := range s.core.ListObjectsIter(lctx, s.bucket, minio.ListObjectsOptions{Prefix: pre}) {
		if o.Err != nil {
			return s.wrap(ctx, "list", pre, o.Err)
		}
		hash := strings.TrimPrefix(o.Key, pre)
		if blobs.CheckHash(hash) != nil {
			continue
		}
		if err := fn(hash, o.Size); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// List implements blobs.Store.
func (s *Store) List(ctx context.Context, ns string, fn func(hash string) error) error {
	return s.walk(ctx, ns, func(hash string, _ int64) error { return fn(hash) })
}

// Size implements blobs.Store: the sum of the blobs' sizes.
func (s *Store) Size(ctx context.Context, ns string) (int64, error) {
	var total int64
	err := s.walk(ctx, ns, func(_ string, size int64) error {
		total += size
		return nil
	})
	if err != nil {
		return 0, err
	}
	return total, nil
}

// Namespaces implements blobs.Store: the "directories" under PREFIX.
func (s *Store) Namespaces(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := []string{}
	for o := range s.core.ListObjectsIter(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix}) {
		if o.Err != nil {
			return nil, s.wrap(ctx, "list", s.prefix, o.Err)
		}
		ns, ok := strings.CutSuffix(strings.TrimPrefix(o.Key, s.prefix), "/")
		if ok && blobs.CheckNamespace(ns) == nil {
			out = append(out, ns)
		}
	}
	slices.Sort(out)
	return out, ctx.Err()
}

// DeleteNamespace implements blobs.Store: it removes every object under
// PREFIX/NS/, and returns the sizes of the blobs among them.
func (s *Store) DeleteNamespace(ctx context.Context, ns string) (int64, error) {
	if err := check(ctx, ns); err != nil {
		return 0, err
	}
	pre := s.nsPrefix(ns)
	var freed int64
	var listErr error
	objects := func(yield func(minio.ObjectInfo) bool) {
		for o := range s.core.ListObjectsIter(ctx, s.bucket, minio.ListObjectsOptions{Prefix: pre, Recursive: true}) {
			if o.Err != nil {
				listErr = o.Err
				return
			}
			if blobs.CheckHash(strings.TrimPrefix(o.Key, pre)) == nil {
				freed += o.Size
			}
			if !yield(o) {
				return
			}
		}
	}
	results, err := s.core.RemoveObjectsWithIter(ctx, s.bucket, objects, minio.RemoveObjectsOptions{})
	if err != nil {
		return 0, s.wrap(ctx, "delete namespace", pre, err)
	}
	for r := range results {
		if r.Err != nil && code(r.Err) != "NoSuchKey" && err == nil {
			err = r.Err
		}
	}
	if err == nil {
		err = listErr
	}
	if err != nil {
		return 0, s.wrap(ctx, "delete namespace", pre, err)
	}
	return freed, ctx.Err()
}

// wrap makes an error of the server's about key: ctx's error if it is
// done, blobs.ErrNotFound for a missing key.
func (s *Store) wrap(ctx context.Context, op, key string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	if code(err) == "NoSuchKey" {
		return fmt.Errorf("s3blobs: %s s3://%s/%s: %w", op, s.bucket, key, blobs.ErrNotFound)
	}
	return fmt.Errorf("s3blobs: %s s3://%s/%s: %w", op, s.bucket, key, err)
}

// ctxErr is ctx's error if it is done, else err.
func ctxErr(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	return err
}

// code is the S3 error code of err ("" if it is none).
func code(err error) string {
	var e minio.ErrorResponse
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// randomHex is 16 random hex digits.
func randomHex() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// keyLocks is a mutex per object key, for the Puts and Deletes of one
// Store: S3 has no lock of its own, and it makes Puts of one content at
// once upload it once and report it added once, and Deletes of one blob
// at once report it freed once. Hand-written: a sync.Mutex per key kept
// forever would grow with every blob, so an entry lives while it is held
// or waited for; and a wait ends with its context.
type keyLocks struct {
	mu sync.Mutex
	m  map[string]*keyLock
}

type keyLock struct {
	sem   chan struct{} // holds a token while the lock is held
	users int           // holders and waiters; the entry goes at 0
}

// lock takes the lock of key, or fails with ctx's error, and returns its
// unlock.
func (l *keyLocks) lock(ctx context.Context, key string) (func(), error) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*keyLock{}
	}
	e := l.m[key]
	if e == nil {
		e = &keyLock{sem: make(chan struct{}, 1)}
		l.m[key] = e
	}
	e.users++
	l.mu.Unlock()
	leave := func() {
		l.mu.Lock()
		if e.users--; e.users == 0 {
			delete(l.m, key)
		}
		l.mu.Unlock()
	}
	select {
	case e.sem <- struct{}{}:
		return func() { <-e.sem; leave() }, nil
	case <-ctx.Done():
		leave()
		return nil, ctx.Err()
	}
}
