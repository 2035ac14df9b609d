/*
Package blobs is the contract of the sandbox service's snapshot content:
blobs of bytes, each named by the SHA-256 of its content, kept in
namespaces (the service makes one per session, so that content is never
shared across tenants). One server keeps them in a directory of its data
dir (OpenDir); several servers share them in an object store (S3, in a
later step), and this contract is what every implementation promises.
Package blobstest is its conformance suite: every implementation runs it
and passes all of it, so a caller never needs to know which store it holds.

# Basics

Put stores the bytes of a reader and returns their hash: the store hashes
what it stores, so a blob's name is always the hash of its content and a
caller never names content it did not hand over. The caller says the size
up front (an object store's upload wants a length), and a reader that holds
fewer or more bytes than that is refused. Putting content a namespace holds
already stores nothing more: Put returns the same hash and 0 bytes added.

Open reads a blob back; Delete removes blobs; List walks the hashes of a
namespace, so that a caller who knows which hashes its own records name can
delete the others (the store knows nothing of what refers to a blob);
DeleteNamespace removes a namespace whole; Namespaces lists them.

# Size

Size is the bytes a namespace's blobs take in the store: each blob's size,
less the runs of zeros the store keeps as holes (the directory store writes
a block of zeros as a hole, as a sparse file; an object store keeps every
byte and counts every byte). Only zeros go uncounted: a blob with no zero
byte counts its size exactly, and no blob counts more than its size. Put's
added and Delete's freed are the same measure: what Size grew or shrank by,
so a caller can cap a namespace's bytes by adding up Puts.

# Atomicity and concurrency

A blob is visible whole or not at all. A Put that does not succeed — its
reader fails, its context ends, its size does not match, or its process
dies part way — leaves nothing that Open, List or Size see, and takes no
room for good: when what it had written is removed is the
implementation's to say (OpenDir's store: when the Put returns, or when
the directory is opened again after the process died).

Every method may be called from many goroutines at once. Puts of the same
content into one namespace at once all succeed with the same hash and leave
one blob, and only one of them reports the bytes added (the others 0), so
the added of all Puts sum to the growth of Size. Puts of different content
read, hash and write in parallel.

The store does not order a Delete against a Put of the same content in
the same namespace, nor a DeleteNamespace against any Put into that
namespace: the Put may find the blob there (and return its hash with 0
added) just before the Delete removes it, leaving the caller with a hash
of no blob, or fail. Guarding against that is the caller's
part: one that deletes the blobs its records do not name must keep Puts
whose hashes are not yet in its records from running meanwhile (the
snapshot store, sandbox/snapshots, holds its gc lock: for reading while
it stores blobs and until their manifest is recorded, for writing while
it collects).
A Delete concurrent with an Open of the same blob may let the reader go on
reading the whole content or make it fail; it never reads other content.
*/
package blobs

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// Store keeps content-addressed blobs in namespaces. The package comment
// states the contract in full; package blobstest checks it.
//
// A namespace is 1 to 128 bytes of letters, digits, '-', '_' and '.', not
// starting with '.' (a session id); a hash is 64 lowercase hex digits. A
// call given any other fails with an error wrapping ErrInvalid and does
// nothing. Every call whose context is done returns the context's error.
type Store interface {
	// Put stores the content of r, exactly size bytes, as a blob of ns and
	// returns its hash (hex SHA-256 of the content) and the bytes it added
	// to Size(ns): 0 if ns held the content already.
	//
	// Put reads r to its end: a reader that ends before size bytes or holds
	// more fails with an error wrapping ErrSize (a negative size wraps
	// ErrInvalid); an error of r itself comes back so that errors.Is finds
	// it (OpenDir's store returns it as it is). A Put that fails, for
	// whatever reason, stores nothing visible.
	Put(ctx context.Context, ns string, r io.Reader, size int64) (hash string, added int64, err error)

	// Open returns a reader of blob hash of ns and its size in bytes (the
	// content's, holes included), or an error wrapping ErrNotFound if ns
	// has no such blob (the blob of another namespace is not found). The
	// caller closes the reader. The content is not checked against its
	// hash on the way out.
	Open(ctx context.Context, ns, hash string) (io.ReadCloser, int64, error)

	// Delete removes the blobs hashes of ns and returns what Size(ns) shrank
	// by. A hash ns does not hold is skipped, not an error. If one hash is
	// invalid nothing is deleted; if the store fails part way, the blobs
	// removed before stay removed, and freed counts them.
	Delete(ctx context.Context, ns string, hashes ...string) (freed int64, err error)

	// List calls fn with the hash of each blob of ns, in no particular
	// order, and stops at the first error fn returns, returning it. A blob
	// present for the whole walk is passed exactly once; one put or
	// deleted during it may be passed or not. fn may call the store's
	// other methods (Delete among them). A namespace with no blobs, or
	// none at all, is an empty walk.
	List(ctx context.Context, ns string, fn func(hash string) error) error

	// Size returns the bytes the blobs of ns take in the store, holes not
	// counted (see the package comment); 0 for an empty or unknown
	// namespace.
	Size(ctx context.Context, ns string) (int64, error)

	// Namespaces returns the namespaces that hold blobs, sorted (none: an
	// empty slice). It may
	// also return one that holds none (its blobs deleted one by one, or a
	// Put into it failed), until DeleteNamespace removes it.
	Namespaces(ctx context.Context) ([]string, error)

	// DeleteNamespace removes every blob of ns, and ns from Namespaces, and
	// returns what Size(ns) was. An unknown namespace is no error.
	DeleteNamespace(ctx context.Context, ns string) (freed int64, err error)
}

// Errors a Store's calls wrap.
var (
	// ErrNotFound: Open of a blob the namespace does not hold.
	ErrNotFound = errors.New("no such blob")
	// ErrSize: a Put whose reader held fewer or more bytes than its size.
	ErrSize = errors.New("content of another size than said")
	// ErrInvalid: a namespace, hash or size no blob can have.
	ErrInvalid = errors.New("invalid blob namespace, hash or size")
)

// maxNamespace is the longest namespace, in bytes.
const maxNamespace = 128

// CheckNamespace returns an error wrapping ErrInvalid unless ns is a valid
// namespace (see Store).
func CheckNamespace(ns string) error {
	ok := ns != "" && len(ns) <= maxNamespace && ns[0] != '.'
	for i := 0; ok && i < len(ns); i++ {
		c := ns[i]
		ok = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.'
	}
	if !ok {
		return fmt.Errorf("blob namespace %q: %w", ns, ErrInvalid)
	}
	return nil
}

// CheckHash returns an error wrapping ErrInvalid unless hash is 64
// lowercase hex digits.
func CheckHash(hash string) error {
	ok := len(hash) == 64
	for i := 0; ok && i < len(hash); i++ {
		c := hash[i]
		ok = '0' <= c && c <= '9' || 'a' <= c && c <= 'f'
	}
	if !ok {
		return fmt.Errorf("blob hash %q: %w", hash, ErrInvalid)
	}
	return nil
}
