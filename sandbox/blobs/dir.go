package blobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/cellbox/cellbox/internal/safe"
	"github.com/cellbox/cellbox/internal/sparse"
)

// Dir is the Store in a directory of this machine, in the layout the
// sandbox service has kept snapshot blobs in from the start (so a data
// dir keeps its snapshots across versions):
//
//	DIR/blobs/NS/hh/HASH   a blob: its content, each 4 KiB block of zeros a
//	                       hole (a sparse file); hh is the hash's first two digits
//	DIR/tmp/blob-*         Puts in progress
//
// A Put writes its content to a file of DIR/tmp while it hashes it, and
// renames it into place once it is whole, so a blob's name always holds
// its whole content. One Dir at a time may use a directory (the service
// holds its data dir alone): OpenDir removes what DIR/tmp holds, the Puts
// an earlier process did not finish, and the one-blob-per-content promise
// of Puts at once holds among the Puts of one Dir. Nothing is synced to
// disk: a blob outlives its process, not necessarily a crash of the
// machine just after it was put.
type Dir struct {
	root string
	// mu is held while a Put looks for its blob and renames its file into
	// place, so that of Puts of one content at once one adds it.
	mu sync.Mutex
}

var _ Store = (*Dir)(nil)

// OpenDir opens the store in directory root (DataDir/snapshots for the
// sandbox service), making it if need be, and removes the files of Puts an
// earlier process did not finish.
func OpenDir(root string) (*Dir, error) {
	d := &Dir{root: root}
	if err := os.MkdirAll(d.tmpDir(), 0o700); err != nil {
		return nil, fmt.Errorf("blob store: %w", err)
	}
	ents, err := os.ReadDir(d.tmpDir())
	if err != nil {
		return nil, fmt.Errorf("blob store: %w", err)
	}
	for _, e := range ents {
		os.Remove(filepath.Join(d.tmpDir(), e.Name()))
	}
	return d, nil
}

func (d *Dir) tmpDir() string { return filepath.Join(d.root, "tmp") }

func (d *Dir) nsDir(ns string) string { return filepath.Join(d.root, "blobs", ns) }

func (d *Dir) path(ns, hash string) string {
	return filepath.Join(d.nsDir(ns), hash[:2], hash)
}

// Put implements Store: the content goes to a file of DIR/tmp (zeros as
// holes) while it is hashed, and is renamed to its hash's name once it is
// whole, unless a blob has that name already.
func (d *Dir) Put(ctx context.Context, ns string, r io.Reader, size int64) (string, int64, error) {
	if err := CheckNamespace(ns); err != nil {
		return "", 0, err
	}
	if size < 0 {
		return "", 0, fmt.Errorf("blob of %d bytes: %w", size, ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return "", 0, err
	}
	f, err := os.CreateTemp(d.tmpDir(), "blob-")
	if err != nil {
		return "", 0, err
	}
	tmp, placed := f.Name(), false
	defer func() {
		if !placed {
			os.Remove(tmp)
		}
	}()
	h := sha256.New()
	r = safe.ContextReader(ctx, r)
	n, err := sparse.Copy(f, io.TeeReader(io.LimitReader(r, size), h)) // zeros as holes
	if err == nil && n < size {
		err = fmt.Errorf("the content ended after %d of %d bytes: %w", n, size, ErrSize)
	}
	if err == nil {
		err = atEnd(r, size)
	}
	var added int64
	if err == nil {
		added, err = taken(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", 0, err
	}
	hash := hex.EncodeToString(h.Sum(nil))
	dst := d.path(ns, hash)
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err := os.Lstat(dst); err == nil {
		return hash, 0, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", 0, err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return "", 0, err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return "", 0, err
	}
	placed = true
	return hash, added, nil
}

// atEnd checks that r, of which size bytes were read, holds no more.
func atEnd(r io.Reader, size int64) error {
	var b [1]byte
	for {
		k, err := r.Read(b[:])
		if k > 0 {
			return fmt.Errorf("the content holds more than %d bytes: %w", size, ErrSize)
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// taken returns the bytes f takes, holes not counted: its size, or the
// data lseek finds when it takes fewer blocks than its size needs.
func taken(f *os.File) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if !holey(fi) {
		return fi.Size(), nil
	}
	m, err := sparse.Of(f, fi.Size())
	if err != nil {
		return 0, err
	}
	return m.Data(), nil
}

// holey reports whether a file may have holes: it takes fewer blocks than
// its size needs (a filesystem that compresses says so too; taken then
// finds no hole and counts the size).
func holey(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Blocks*512 < fi.Size()
}

// takenAt is taken of the file p, whose Lstat is fi, opening it only if
// it may have holes.
func takenAt(p string, fi fs.FileInfo) (int64, error) {
	if !holey(fi) {
		return fi.Size(), nil
	}
	f, err := os.Open(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return taken(f)
}

// Open implements Store.
func (d *Dir) Open(ctx context.Context, ns, hash string) (io.ReadCloser, int64, error) {
	if err := check(ctx, ns, hash); err != nil {
		return nil, 0, err
	}
	f, err := os.Open(d.path(ns, hash))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, fmt.Errorf("blob %s of %s: %w", hash, ns, ErrNotFound)
	}
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("blob %s of %s is not a file", hash, ns)
	}
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, fi.Size(), nil
}

// check checks a call's context, namespace and hashes.
func check(ctx context.Context, ns string, hashes ...string) error {
	if err := CheckNamespace(ns); err != nil {
		return err
	}
	for _, h := range hashes {
		if err := CheckHash(h); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// Delete implements Store.
func (d *Dir) Delete(ctx context.Context, ns string, hashes ...string) (int64, error) {
	if err := check(ctx, ns, hashes...); err != nil {
		return 0, err
	}
	var freed int64
	for _, h := range hashes {
		if err := ctx.Err(); err != nil {
			return freed, err
		}
		p := d.path(ns, h)
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return freed, err
		}
		n, err := takenAt(p, fi)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return freed, err
		}
		if err := os.Remove(p); errors.Is(err, fs.ErrNotExist) {
			continue // another Delete took it
		} else if err != nil {
			return freed, err
		}
		freed += n
	}
	return freed, nil
}

// walk calls fn with each blob of ns: its hash, path and Lstat.
func (d *Dir) walk(ctx context.Context, ns string, fn func(hash, p string, fi fs.FileInfo) error) error {
	if err := check(ctx, ns); err != nil {
		return err
	}
	top := d.nsDir(ns)
	subs, err := os.ReadDir(top)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, sub := range subs {
		if !sub.IsDir() || len(sub.Name()) != 2 {
			continue
		}
		dir := filepath.Join(top, sub.Name())
		ents, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		for _, e := range ents {
			if err := ctx.Err(); err != nil {
				return err
			}
			name := e.Name()
			if !e.Type().IsRegular() || CheckHash(name) != nil || name[:2] != sub.Name() {
				continue // not a blob: left for DeleteNamespace
			}
			fi, err := e.Info()
			if errors.Is(err, fs.ErrNotExist) {
				continue // deleted meanwhile
			}
			if err != nil {
				return err
			}
			if err := fn(name, filepath.Join(dir, name), fi); err != nil {
				return err
			}
		}
	}
	return nil
}

// List implements Store.
func (d *Dir) List(ctx context.Context, ns string, fn func(hash string) error) error {
	return d.walk(ctx, ns, func(hash, _ string, _ fs.FileInfo) error { return fn(hash) })
}

// Size implements Store: each blob's size, or its data when it has holes
// (lseek's SEEK_DATA and SEEK_HOLE).
func (d *Dir) Size(ctx context.Context, ns string) (int64, error) {
	var total int64
	err := d.walk(ctx, ns, func(_, p string, fi fs.FileInfo) error {
		n, err := takenAt(p, fi)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		total += n
		return err
	})
	return total, err
}

// Namespaces implements Store: the directories of DIR/blobs.
func (d *Dir) Namespaces(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(filepath.Join(d.root, "blobs"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	out := []string{}
	for _, e := range ents { // sorted by name
		if e.IsDir() && CheckNamespace(e.Name()) == nil {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// DeleteNamespace implements Store: it removes DIR/blobs/NS whole.
func (d *Dir) DeleteNamespace(ctx context.Context, ns string) (int64, error) {
	freed, err := d.Size(ctx, ns)
	if err != nil {
		return 0, err
	}
	if err := os.RemoveAll(d.nsDir(ns)); err != nil {
		return 0, err
	}
	return freed, nil
}
