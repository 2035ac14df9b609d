package sandbox

// The snapshot store: workspaces kept as content-addressed blobs (one per
// distinct content, named by its SHA-256, in a blobs.Store namespace per
// session: blobs.OpenDir's store over DataDir/snapshots, which keeps them
// under DataDir/snapshots/blobs/SESSION) plus a manifest per snapshot
// (path, type, mode, size, hash, link target) kept with the snapshot's
// metadata in the state store (state.Snapshots and
// state.SnapshotManifests, like sessions and boxes). Two snapshots of one
// workspace share every unchanged file, so many snapshots cost little more
// than their differences. Blobs no manifest names are removed when a
// snapshot is deleted.
//
// Content is shared within a session only: across sessions, "this
// snapshot added no bytes" would tell one tenant that another holds a
// file with exactly the content it guessed (a key, a password file).
//
// A workspace reaches the store as the agent's tar stream (so it works on
// every backend, also on remote engines) and leaves it as a tar the agent
// extracts. The stream comes from a box and is hostile: names are checked
// (no absolute names, no "..", nothing outside the workspace, nothing
// under a symlink), hard links must name a file of the stream, and the
// bytes and entries are capped. A symlink is kept whatever it points to
// (a venv's bin/python -> /usr/bin/python3): it is only a string here,
// never made or followed on the host, and a restore makes it inside a
// box, where it resolves in that box's own filesystem; the agent writes
// no entry through a link that leaves the workspace.

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/cellbox/cellbox/internal/sparse"
	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/blobs"
	"github.com/cellbox/cellbox/sandbox/state"
)

// Caps on what one snapshot may hold, beside the box's disk cap on bytes.
const (
	maxSnapshotEntries = 200_000
	maxSnapshotPath    = 4096
)

// snapshotRecord is a snapshot's metadata as stored.
type snapshotRecord struct {
	ID      string    `json:"id"`
	Label   string    `json:"label,omitempty"`
	Session string    `json:"session"`
	Sandbox string    `json:"sandbox"`        // the box's name in the session
	BoxID   string    `json:"box_id"`         // the box it was taken of
	Spec    boxSpec   `json:"spec"`           // the box's settings, for branch
	Created time.Time `json:"created"`        // UTC
	Size    int64     `json:"size"`           // bytes of the files, holes included
	Data    *int64    `json:"data,omitempty"` // bytes of the files' data, holes not counted (nil: Size, a snapshot taken before sparse files were)
	Files   int       `json:"files"`          // regular files
	Added   int64     `json:"added"`          // bytes of blobs this snapshot added to the store
	Entries int       `json:"entries"`        // files, dirs and links
}

// snapEntry is one entry of a manifest. Path is relative to the workspace,
// slash-separated and clean.
type snapEntry struct {
	Path string      `json:"p"`
	Type byte        `json:"t"`           // tar.TypeDir, tar.TypeReg, tar.TypeSymlink, tar.TypeLink or tar.TypeFifo
	Mode fs.FileMode `json:"m"`           // permission bits
	Size int64       `json:"s,omitempty"` // a file's size, holes included
	Hash string      `json:"h,omitempty"` // hex SHA-256 of a file's content (of its data, when Map is set)
	// Map is where a sparse file's data lies (sparse.Map.Encode), Data
	// its bytes: the blob holds the data only. Unset for other files.
	Map  string    `json:"sp,omitempty"`
	Data int64     `json:"d,omitempty"`
	Link string    `json:"l,omitempty"` // a symlink's target; a hard link's file (a Path of the manifest)
	Time time.Time `json:"mt"`
}

// MarshalJSON keeps a name or link target that is not UTF-8 (a file named
// in Latin-1, say) byte for byte: JSON strings would turn its bytes into
// U+FFFD, so such a one is stored as bytes (base64) beside an empty string.
func (e snapEntry) MarshalJSON() ([]byte, error) {
	type plain snapEntry // without this method
	w := struct {
		plain
		RawPath []byte `json:"pb,omitempty"`
		RawLink []byte `json:"lb,omitempty"`
	}{plain: plain(e)}
	if !utf8.ValidString(e.Path) {
		w.RawPath, w.plain.Path = []byte(e.Path), ""
	}
	if !utf8.ValidString(e.Link) {
		w.RawLink, w.plain.Link = []byte(e.Link), ""
	}
	return json.Marshal(w)
}

func (e *snapEntry) UnmarshalJSON(b []byte) error {
	type plain snapEntry
	var w struct {
		plain
		RawPath []byte `json:"pb,omitempty"`
		RawLink []byte `json:"lb,omitempty"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*e = snapEntry(w.plain)
	if w.RawPath != nil {
		e.Path = string(w.RawPath)
	}
	if w.RawLink != nil {
		e.Link = string(w.RawLink)
	}
	return nil
}

// snapStore is the blobs (a namespace per session) and the two kinds of
// records: state.Snapshots (id -> snapshotRecord) and
// state.SnapshotManifests (id -> []snapEntry), written in one commit.
type snapStore struct {
	st    state.Store
	blobs blobs.Store
	// gc is held for reading while blobs are written or a manifest not yet
	// stored is in use (capture, fork), and for writing while unreferenced
	// blobs are removed, so a collection never takes a blob about to be
	// referenced: the blob store leaves a delete racing a Put of the same
	// content to its caller.
	gc sync.RWMutex
}

// openSnapStore keeps the blobs in DataDir/snapshots (blobs.OpenDir),
// where every version has kept them.
func openSnapStore(st state.Store, b blobs.Store, dataDir string) (*snapStore, error) {
	if b == nil {
		d, err := blobs.OpenDir(filepath.Join(dataDir, "snapshots"))
		if err != nil {
			return nil, fmt.Errorf("snapshot store: %w", err)
		}
		b = d
	}
	return &snapStore{st: st, blobs: b}, nil
}

// capture reads a tar of the workspace (entries named workspace/...) from
// r, storing each file's content as a blob, and returns the manifest,
// sorted by path, and the bytes of blobs it added to session's. maxBytes
// caps the content, maxAdded the bytes it may add to the store (what it
// added before failing stays until the next collection). The caller holds
// ss.gc for reading.
func (ss *snapStore) capture(session string, r io.Reader, maxBytes, maxAdded int64) ([]snapEntry, int64, error) {
	top := strings.TrimPrefix(backend.Workspace, "/")
	tr := tar.NewReader(r)
	byPath := map[string]snapEntry{}
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
		if len(byPath) >= maxSnapshotEntries {
			return nil, 0, api.WithCode(api.CodeTooLarge, fmt.Errorf("the workspace has more than %d entries, the most a snapshot holds; remove build outputs or caches first", maxSnapshotEntries))
		}
		e := snapEntry{Path: rel, Type: hdr.Typeflag, Mode: fs.FileMode(hdr.Mode).Perm(), Time: hdr.ModTime.UTC()}
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
			hash, n, err := ss.blobs.Put(context.Background(), session, tr, hdr.Size)
			if err != nil {
				return nil, 0, fmt.Errorf("snapshot: store %s from the tar stream: %w", rel, err)
			}
			e.Hash, added = hash, added+n
			if added > maxAdded {
				return nil, 0, errStoreFull
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
			if s, ok := byPath[src]; !ok || s.Type != tar.TypeReg {
				return nil, 0, api.WithCode(api.CodeInvalidInput, fmt.Errorf("snapshot: entry %q is a hard link to %q, which is not a file earlier in the stream", hdr.Name, hdr.Linkname))
			}
			e.Link = src
		default:
			continue // devices: not kept
		}
		byPath[rel] = e
	}
	out := make([]snapEntry, 0, len(byPath))
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

// errStoreFull is capture's error past maxAdded; the caller says which
// cap it was.
var errStoreFull = errors.New("the snapshot store of this session is full")

// snapPath checks a tar entry name of the workspace's stream and returns
// it relative to the workspace ("" for the workspace itself).
func snapPath(name, top string) (string, error) {
	bad := func(why string) error {
		return api.WithCode(api.CodeOutsideWorkspace, fmt.Errorf("snapshot: tar entry %q %s; the snapshot was not taken", name, why))
	}
	if len(name) > maxSnapshotPath || strings.IndexByte(name, 0) >= 0 {
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
// file comment.
func checkLink(rel, target string) error {
	if target == "" || len(target) > maxSnapshotPath || strings.IndexByte(target, 0) >= 0 {
		return api.WithCode(api.CodeInvalidInput, fmt.Errorf("snapshot: %s/%s is a symlink with an empty, over-long or NUL-holding target; the snapshot was not taken", backend.Workspace, rel))
	}
	return nil
}

// writeTar writes the manifest (of a snapshot of session) as a tar with
// names relative to the workspace, for the agent to extract there:
// directories, files and FIFOs in path order, then the hard links (their
// files are there), then the symlinks (so no file is written through one).
func (ss *snapStore) writeTar(ctx context.Context, w io.Writer, session string, entries []snapEntry) error {
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
			if err := ss.copyBlob(ctx, tw, session, e); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// copyBlob writes the data of file entry e (of a snapshot of session) to w.
func (ss *snapStore) copyBlob(ctx context.Context, w io.Writer, session string, e snapEntry) error {
	r, size, err := ss.blobs.Open(ctx, session, e.Hash)
	if err == nil && size != e.dataBytes() {
		r.Close()
		err = fmt.Errorf("blob of %d bytes for %d", size, e.dataBytes())
	}
	if err != nil {
		return fmt.Errorf("snapshot blob of %s: %w (the snapshot store is damaged)", e.Path, err)
	}
	defer r.Close()
	_, err = io.CopyN(w, r, size)
	return err
}

// dataBytes is the bytes of a file entry's data: its blob's size.
func (e snapEntry) dataBytes() int64 {
	if e.Map != "" {
		return e.Data
	}
	return e.Size
}

// put records a snapshot and its manifest, in one commit. It is not
// cancelled with ctx: the blobs are stored, and a snapshot taken is kept.
func (ss *snapStore) put(ctx context.Context, rec snapshotRecord, entries []snapEntry) error {
	files, err := json.Marshal(entries)
	if err != nil {
		return err
	}
	r, err := putJSON(state.Snapshots, rec.ID, rec)
	if err != nil {
		return err
	}
	_, err = ss.st.Commit(context.WithoutCancel(ctx), r, state.Put(state.SnapshotManifests, rec.ID, files))
	return err
}

// get returns snapshot id if it belongs to session; any other id is "no
// such snapshot", whether it exists in another session or not.
func (ss *snapStore) get(ctx context.Context, session, id string) (snapshotRecord, []snapEntry, error) {
	rec, _, err := ss.record(ctx, session, id)
	if err != nil {
		return rec, nil, err
	}
	entries, err := ss.manifest(ctx, id)
	if err != nil {
		return rec, nil, err
	}
	return rec, entries, nil
}

// record returns snapshot id of session and its revision; any other id
// is errNoSnapshot.
func (ss *snapStore) record(ctx context.Context, session, id string) (snapshotRecord, uint64, error) {
	var rec snapshotRecord
	r, err := ss.st.Get(ctx, state.Snapshots, id)
	if errors.Is(err, state.ErrNotFound) || errors.Is(err, state.ErrInvalid) { // invalid: an empty or over-long id
		return rec, 0, errNoSnapshot(id)
	}
	if err != nil {
		return rec, 0, err
	}
	if err := json.Unmarshal(r.Value, &rec); err != nil {
		return rec, 0, fmt.Errorf("snapshot %s: %w", id, err)
	}
	if rec.Session != session {
		return snapshotRecord{}, 0, errNoSnapshot(id)
	}
	return rec, r.Revision, nil
}

// manifest returns the manifest of snapshot id.
func (ss *snapStore) manifest(ctx context.Context, id string) ([]snapEntry, error) {
	var entries []snapEntry
	r, err := ss.st.Get(ctx, state.SnapshotManifests, id)
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", id, err)
	}
	if err := json.Unmarshal(r.Value, &entries); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", id, err)
	}
	return entries, nil
}

// errNoSnapshot is get's and delete's answer for an id that is not a
// snapshot of the session, whether another session has it or not.
func errNoSnapshot(id string) error {
	return api.WithCode(api.CodeNotFound, fmt.Errorf("no snapshot %q in this session (see snapshot_list)", id))
}

// list returns the session's snapshots, oldest first.
func (ss *snapStore) list(ctx context.Context, session string) ([]snapshotRecord, error) {
	all, err := loadJSON[snapshotRecord](ctx, ss.st, state.Snapshots)
	out := slices.DeleteFunc(all, func(rec snapshotRecord) bool { return rec.Session != session })
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, err
}

// delete removes snapshots (of session) and then the session's blobs no
// remaining snapshot of it references; it returns the bytes freed. It is
// not cancelled with ctx once it has begun.
func (ss *snapStore) delete(ctx context.Context, session string, ids ...string) (int64, error) {
	ss.gc.Lock()
	defer ss.gc.Unlock()
	ctx = context.WithoutCancel(ctx)
	// Without ids (freeLater, sweep) nothing is deleted: no commit, and
	// so no write and sync for nothing.
	if len(ids) > 0 {
		ops := make([]state.Op, 0, 2*len(ids))
		for _, id := range ids {
			_, rev, err := ss.record(ctx, session, id)
			if err != nil {
				return 0, err
			}
			ops = append(ops, state.Delete(state.Snapshots, id).If(rev), state.Delete(state.SnapshotManifests, id))
		}
		if _, err := ss.st.Commit(ctx, ops...); err != nil {
			return 0, err
		}
	}
	// The blobs the session's remaining snapshots name: no capture adds a
	// snapshot while gc is held.
	live := map[string]bool{}
	recs, err := ss.list(ctx, session)
	if err != nil {
		return 0, err
	}
	for _, rec := range recs {
		entries, err := ss.manifest(ctx, rec.ID)
		if err != nil {
			return 0, err
		}
		for _, e := range entries {
			if e.Hash != "" {
				live[e.Hash] = true
			}
		}
	}
	if len(live) == 0 {
		return ss.blobs.DeleteNamespace(ctx, session)
	}
	var dead []string
	if err := ss.blobs.List(ctx, session, func(hash string) error {
		if !live[hash] {
			dead = append(dead, hash)
		}
		return nil
	}); err != nil {
		return 0, err
	}
	return ss.blobs.Delete(ctx, session, dead...)
}

// freeLater deletes the snapshots ids of session (restore's copy of the
// workspace) and frees the blobs of session that no snapshot names (what a
// refused snapshot stored, the transient copies of fork and restore) in
// the background, once every hold on gc, the caller's included, is gone.
func (ss *snapStore) freeLater(log *slog.Logger, session string, ids ...string) {
	go func() {
		if _, err := ss.delete(context.Background(), session, ids...); err != nil {
			log.Warn("free the snapshot blobs no snapshot names", "session", session, "snapshots", ids, "err", err)
		}
	}()
}

// sweep frees the blobs no snapshot names in every session's store: what
// a process killed during a capture left (a capture's blobs are written
// before its manifest), and the stores of sessions that are gone.
func (ss *snapStore) sweep(ctx context.Context, log *slog.Logger) {
	sessions, err := ss.blobs.Namespaces(ctx)
	if err != nil {
		log.Warn("list the sessions of the snapshot blob store", "err", err)
		return
	}
	for _, session := range sessions {
		if ctx.Err() != nil {
			return
		}
		if freed, err := ss.delete(ctx, session); err != nil {
			log.Warn("free the snapshot blobs no snapshot names", "session", session, "err", err)
		} else if freed > 0 {
			log.Info("freed snapshot blobs no snapshot names", "session", session, "bytes", freed)
		}
	}
}

// sessionIDs returns the ids of session's snapshots.
func (ss *snapStore) sessionIDs(ctx context.Context, session string) ([]string, error) {
	recs, err := ss.list(ctx, session)
	ids := make([]string, len(recs))
	for i, r := range recs {
		ids[i] = r.ID
	}
	return ids, err
}

// bytes returns the bytes session's blobs take (blobs.Store.Size: holes
// not counted). As ever, a blob it cannot read counts nothing.
func (ss *snapStore) bytes(session string) int64 {
	n, _ := ss.blobs.Size(context.Background(), session)
	return n
}
