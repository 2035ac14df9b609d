package snapshots

// The tar side of the store: Capture reads a box's workspace tar into
// blobs and a manifest, WriteTar writes a manifest back out as a tar; the
// names and link targets of both are checked here (snapPath, checkLink).

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"

	"github.com/cellbox/cellbox/internal/sparse"
	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/backend"
)

// Capture reads a tar of the workspace (entries named workspace/...) from
// r, storing each file's content as a blob, and returns the manifest,
// sorted by path, and the bytes of blobs it added to session's. maxBytes
// caps the content, maxAdded the bytes it may add to the store (past it,
// ErrStoreFull; what it added before failing stays until the next
// collection). The caller holds the store (Hold).
func (s *Store) Capture(session string, r io.Reader, maxBytes, maxAdded int64) ([]Entry, int64, error) {
	top := strings.TrimPrefix(backend.Workspace, "/")
	tr := tar.NewReader(r)
	byPath := map[string]Entry{}
	var total, added int64
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, 0, fmt.Errorf("read the workspace's tar stream: %w", err)
		}
		rel, err := snapPath(hdr.Name, top)
		if err != nil {
			return nil, 0, err
		}
		if rel == "" {
			continue // the workspace itself
		}
		if len(byPath) >= maxEntries {
			return nil, 0, api.WithCode(api.CodeTooLarge, fmt.Errorf("the workspace has more than %d entries, the most a snapshot holds; remove build outputs or caches first", maxEntries))
		}
		e := Entry{Path: rel, Type: hdr.Typeflag, Mode: fs.FileMode(hdr.Mode).Perm(), Time: hdr.ModTime.UTC()}
		switch hdr.Typeflag {
		case tar.TypeDir, tar.TypeFifo:
		case tar.TypeReg, tar.TypeRegA:
			e.Type = tar.TypeReg
			// A sparse file comes as its data (agent.SparseOf), kept so.
			e.Size = hdr.Size
			m, isSparse, err := agent.SparseOf(hdr)
			if err != nil {
				return nil, 0, api.WithCode(api.CodeInvalidInput, fmt.Errorf("snapshot: %w", err))
			}
			if isSparse {
				e.Size, e.Data, e.Map = m.Size, hdr.Size, m.Encode()
			}
			if total += hdr.Size; hdr.Size < 0 || total > maxBytes {
				return nil, 0, api.WithCode(api.CodeTooLarge, fmt.Errorf("the workspace holds more than %d bytes, the most a snapshot of this box holds (its disk cap)", maxBytes))
			}
			// No context: the stream comes from the box and ends with the call.
			hash, n, err := s.blobs.Put(context.Background(), session, tr, hdr.Size)
			if err != nil {
				return nil, 0, fmt.Errorf("snapshot: store %s from the tar stream: %w", rel, err)
			}
			e.Hash, added = hash, added+n
			if added > maxAdded {
				return nil, 0, ErrStoreFull
			}
		case tar.TypeSymlink:
			if err := checkLink(rel, hdr.Linkname); err != nil {
				return nil, 0, err
			}
			e.Link = hdr.Linkname
		case tar.TypeLink:
			// Another name of a file earlier in the stream: no content
			// of its own, made as a hard link again on restore.
			src, err := snapPath(hdr.Linkname, top)
			if err != nil {
				return nil, 0, err
			}
			if f, ok := byPath[src]; !ok || f.Type != tar.TypeReg {
				return nil, 0, api.WithCode(api.CodeInvalidInput, fmt.Errorf("snapshot: entry %q is a hard link to %q, which is not a file earlier in the stream", hdr.Name, hdr.Linkname))
			}
			e.Link = src
		default:
			continue // devices: not kept
		}
		byPath[rel] = e
	}
	out := make([]Entry, 0, len(byPath))
	for _, e := range byPath {
		// A real tree has nothing under a symlink (the agent does not
		// descend into links); a restore would write it through the link.
		for dir := path.Dir(e.Path); dir != "."; dir = path.Dir(dir) {
			if byPath[dir].Type == tar.TypeSymlink {
				return nil, 0, api.WithCode(api.CodeOutsideWorkspace, fmt.Errorf("snapshot: tar entry %q goes through the symlink %s; the snapshot was not taken", e.Path, dir))
			}
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, added, nil
}

// ErrStoreFull is Capture's error past maxAdded; the caller says which
// cap it was.
var ErrStoreFull = errors.New("the snapshot store of this session is full")

// snapPath checks a tar entry name of the workspace's stream and returns
// it relative to the workspace ("" for the workspace itself).
func snapPath(name, top string) (string, error) {
	bad := func(why string) error {
		return api.WithCode(api.CodeOutsideWorkspace, fmt.Errorf("snapshot: tar entry %q %s; the snapshot was not taken", name, why))
	}
	if len(name) > maxPath || strings.IndexByte(name, 0) >= 0 {
		return "", bad("is too long or holds a NUL byte")
	}
	if strings.HasPrefix(name, "/") {
		return "", bad("has an absolute name")
	}
	clean := path.Clean(name)
	if clean == ".." || strings.HasPrefix(clean, "../") {
		return "", bad("escapes the workspace")
	}
	rel, ok := strings.CutPrefix(clean, top)
	if !ok || (rel != "" && rel[0] != '/') {
		return "", bad("is not in " + backend.Workspace)
	}
	return strings.TrimPrefix(rel, "/"), nil
}

// checkLink refuses a symlink target that no real workspace has (empty,
// over-long, with a NUL byte). Where it points is not checked: see the
// package comment.
func checkLink(rel, target string) error {
	if target == "" || len(target) > maxPath || strings.IndexByte(target, 0) >= 0 {
		return api.WithCode(api.CodeInvalidInput, fmt.Errorf("snapshot: %s/%s is a symlink with an empty, over-long or NUL-holding target; the snapshot was not taken", backend.Workspace, rel))
	}
	return nil
}

// WriteTar writes the manifest (of a snapshot of session) as a tar with
// names relative to the workspace, for the agent to extract there:
// directories, files and FIFOs in path order, then the hard links (their
// files are there), then the symlinks (so no file is written through one).
// The caller holds the store (Hold).
func (s *Store) WriteTar(ctx context.Context, w io.Writer, session string, entries []Entry) error {
	tw := tar.NewWriter(w)
	passOf := map[byte]int{tar.TypeLink: 1, tar.TypeSymlink: 2}
	for pass := 0; pass < 3; pass++ {
		for _, e := range entries {
			if err := ctx.Err(); err != nil {
				return err
			}
			if passOf[e.Type] != pass {
				continue
			}
			hdr := &tar.Header{Name: e.Path, Typeflag: e.Type, Mode: int64(e.Mode), ModTime: e.Time, Linkname: e.Link}
			if e.Type == tar.TypeDir {
				hdr.Name += "/"
			}
			if e.Type == tar.TypeReg {
				hdr.Size = e.Size
				if e.Map != "" {
					m, err := sparse.Parse(e.Size, e.Data, e.Map)
					if err != nil {
						return fmt.Errorf("snapshot entry %s: %w (the snapshot store is damaged)", e.Path, err)
					}
					agent.SetSparse(hdr, m)
				}
			}
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if e.Type != tar.TypeReg {
				continue
			}
			if err := s.copyBlob(ctx, tw, session, e); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// copyBlob writes the data of file entry e (of a snapshot of session) to w.
func (s *Store) copyBlob(ctx context.Context, w io.Writer, session string, e Entry) error {
	r, size, err := s.blobs.Open(ctx, session, e.Hash)
	if err == nil && size != e.DataBytes() {
		r.Close()
		err = fmt.Errorf("blob of %d bytes for %d", size, e.DataBytes())
	}
	if err != nil {
		return fmt.Errorf("snapshot blob of %s: %w (the snapshot store is damaged)", e.Path, err)
	}
	defer r.Close()
	_, err = io.CopyN(w, r, size)
	return err
}
