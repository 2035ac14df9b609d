/*
Package snapshots is the sandbox service's snapshot store: workspaces
kept as content-addressed blobs (one per distinct content, named by its
SHA-256, in a blobs.Store namespace per session: by default blobs.OpenDir's
store over DataDir/snapshots, which keeps them under
DataDir/snapshots/blobs/SESSION) plus a manifest per snapshot (path,
type, mode, size, hash, link target) kept with the snapshot's metadata in
the state store (state.Snapshots and state.SnapshotManifests, like
sessions and boxes). Two snapshots of one workspace share every unchanged
file, so many snapshots cost little more than their differences. Blobs no
manifest names are removed when a snapshot is deleted, and by Sweep.

Content is shared within a session only: across sessions, "this
snapshot added no bytes" would tell one tenant that another holds a
file with exactly the content it guessed (a key, a password file).

A workspace reaches the store as the agent's tar stream (Capture; so it
works on every backend, also on remote engines) and leaves it as a tar
the agent extracts (WriteTar). The stream comes from a box and is
hostile: names are checked (no absolute names, no "..", nothing outside
the workspace, nothing under a symlink), hard links must name a file of
the stream, and the bytes and entries are capped. A symlink is kept
whatever it points to (a venv's bin/python -> /usr/bin/python3): it is
only a string here, never made or followed on the host, and a restore
makes it inside a box, where it resolves in that box's own filesystem;
the agent writes no entry through a link that leaves the workspace.

The package knows snapshots, their sessions (an id and a namespace) and
the tar streams of a workspace; it knows nothing of boxes beyond that:
a Record's Spec is the settings of the box it was taken of as the
sandbox service encodes them, kept and returned as they are. Snapshots
belong to the session that took them: Get and Delete answer any other
id as "no such snapshot" (api.CodeNotFound), whether another session
has it or not.
*/
package snapshots

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/blobs"
	"github.com/cellbox/cellbox/sandbox/state"
)

// Caps on what one snapshot may hold, beside the box's disk cap on bytes.
const (
	maxEntries = 200_000 // files, dirs and links
	maxPath    = 4096    // bytes of a tar entry's name or a symlink's target
)

// Record is a snapshot's metadata as stored (JSON under its ID in
// state.Snapshots).
type Record struct {
	ID      string `json:"id"`
	Label   string `json:"label,omitempty"`
	Session string `json:"session"`
	Sandbox string `json:"sandbox"` // the box's name in the session
	BoxID   string `json:"box_id"`  // the box it was taken of
	// Spec is the box's settings, for branch: JSON the sandbox service
	// encodes and decodes, kept here as it is.
	Spec    json.RawMessage `json:"spec"`
	Created time.Time       `json:"created"`        // UTC
	Size    int64           `json:"size"`           // bytes of the files, holes included
	Data    *int64          `json:"data,omitempty"` // bytes of the files' data, holes not counted (nil: Size, a snapshot taken before sparse files were)
	Files   int             `json:"files"`          // regular files
	Added   int64           `json:"added"`          // bytes of blobs this snapshot added to the store
	Entries int             `json:"entries"`        // files, dirs and links
}

// Entry is one entry of a manifest (a snapshot's manifest is a []Entry,
// stored as JSON under its ID in state.SnapshotManifests). Path is
// relative to the workspace, slash-separated and clean.
type Entry struct {
	Path string      `json:"p"`
	Type byte        `json:"t"`           // tar.TypeDir, tar.TypeReg, tar.TypeSymlink, tar.TypeLink or tar.TypeFifo
	Mode fs.FileMode `json:"m"`           // permission bits
	Size int64       `json:"s,omitempty"` // a file's size, holes included
	Hash string      `json:"h,omitempty"` // hex SHA-256 of a file's content (of its data, when Map is set); set for regular files only
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
func (e Entry) MarshalJSON() ([]byte, error) {
	type plain Entry // without this method
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

// UnmarshalJSON reads what MarshalJSON writes.
func (e *Entry) UnmarshalJSON(b []byte) error {
	type plain Entry
	var w struct {
		plain
		RawPath []byte `json:"pb,omitempty"`
		RawLink []byte `json:"lb,omitempty"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*e = Entry(w.plain)
	if w.RawPath != nil {
		e.Path = string(w.RawPath)
	}
	if w.RawLink != nil {
		e.Link = string(w.RawLink)
	}
	return nil
}

// Store is the blobs (a namespace per session) and the two kinds of
// records: state.Snapshots (id -> Record) and state.SnapshotManifests
// (id -> []Entry), written in one commit. It is safe for concurrent use.
type Store struct {
	st    state.Store
	blobs blobs.Store
	// gc is held for reading while blobs are written or a manifest not yet
	// stored is in use (capture, fork), and for writing while unreferenced
	// blobs are removed, so a collection never takes a blob about to be
	// referenced: the blob store leaves a delete racing a Put of the same
	// content to its caller.
	gc sync.RWMutex
	// shared: other servers hold and collect in the same stores; holds and
	// collections also meet in the state store (gc.go).
	shared bool
}

// Open returns the store of the snapshots in st, their content in b.
// With b nil it keeps the blobs in dataDir/snapshots (blobs.OpenDir),
// where every version has kept them. shared says that other servers use
// st and b too (each with a Store of its own).
func Open(st state.Store, b blobs.Store, dataDir string, shared bool) (*Store, error) {
	if b == nil {
		d, err := blobs.OpenDir(filepath.Join(dataDir, "snapshots"))
		if err != nil {
			return nil, fmt.Errorf("snapshot store: %w", err)
		}
		b = d
	}
	return &Store{st: st, blobs: b, shared: shared}, nil
}

// Hold keeps session's blobs from being collected (by Delete, FreeLater,
// Sweep) until release is called. Hold it across Capture and the Put of
// its manifest, and while a manifest is in use (WriteTar; a capture that
// is never Put, such as fork's transient copy): a collection would take
// blobs no stored manifest names yet. Delete waits for every hold of this
// Store to be released, so a goroutine that holds must not call it. In a
// shared store a hold also keeps other servers' collections of the session
// off (gc.go), and waits for one that runs (an error: ctx ended, or the
// state store failed).
func (s *Store) Hold(ctx context.Context, session string) (release func(), err error) {
	s.gc.RLock()
	if !s.shared {
		return s.gc.RUnlock, nil
	}
	key, err := s.holdShared(ctx, session)
	if err != nil {
		s.gc.RUnlock()
		return nil, err
	}
	return func() {
		s.releaseShared(key)
		s.gc.RUnlock()
	}, nil
}

// DataBytes is the bytes of a file entry's data: its blob's size.
func (e Entry) DataBytes() int64 {
	if e.Map != "" {
		return e.Data
	}
	return e.Size
}

// DataBytes is the bytes of data of the files of entries, holes not
// counted: what a copy of them moves.
func DataBytes(entries []Entry) (n int64) {
	for _, e := range entries {
		if e.Hash != "" {
			n += e.DataBytes()
		}
	}
	return n
}

// CountFiles counts the regular files of entries and their bytes, holes
// included.
func CountFiles(entries []Entry) (files int, size int64) {
	for _, e := range entries {
		if e.Hash != "" {
			files++
			size += e.Size
		}
	}
	return files, size
}

// Put records a snapshot and its manifest, in one commit. It is not
// cancelled with ctx: the blobs are stored, and a snapshot taken is kept.
func (s *Store) Put(ctx context.Context, rec Record, entries []Entry) error {
	files, err := json.Marshal(entries)
	if err != nil {
		return err
	}
	r, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	_, err = s.st.Commit(context.WithoutCancel(ctx), state.Put(state.Snapshots, rec.ID, r), state.Put(state.SnapshotManifests, rec.ID, files))
	return err
}

// Get returns snapshot id and its manifest if it belongs to session; any
// other id is "no such snapshot" (api.CodeNotFound), whether it exists in
// another session or not.
func (s *Store) Get(ctx context.Context, session, id string) (Record, []Entry, error) {
	rec, _, err := s.record(ctx, session, id)
	if err != nil {
		return rec, nil, err
	}
	entries, err := s.manifest(ctx, id)
	if err != nil {
		return rec, nil, err
	}
	return rec, entries, nil
}

// record returns snapshot id of session and its revision; any other id
// is errNoSnapshot.
func (s *Store) record(ctx context.Context, session, id string) (Record, uint64, error) {
	var rec Record
	r, err := s.st.Get(ctx, state.Snapshots, id)
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
		return Record{}, 0, errNoSnapshot(id)
	}
	return rec, r.Revision, nil
}

// manifest returns the manifest of snapshot id.
func (s *Store) manifest(ctx context.Context, id string) ([]Entry, error) {
	var entries []Entry
	r, err := s.st.Get(ctx, state.SnapshotManifests, id)
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", id, err)
	}
	if err := json.Unmarshal(r.Value, &entries); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", id, err)
	}
	return entries, nil
}

// errNoSnapshot is Get's and Delete's answer for an id that is not a
// snapshot of the session, whether another session has it or not.
func errNoSnapshot(id string) error {
	return api.WithCode(api.CodeNotFound, fmt.Errorf("no snapshot %q in this session (see snapshot_list)", id))
}

// List returns the session's snapshots, oldest first.
func (s *Store) List(ctx context.Context, session string) ([]Record, error) {
	all, err := s.all(ctx)
	out := slices.DeleteFunc(all, func(rec Record) bool { return rec.Session != session })
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, err
}

// all returns every snapshot of every session, in key order.
func (s *Store) all(ctx context.Context) ([]Record, error) {
	rs, err := s.st.List(ctx, state.Snapshots, "")
	if err != nil {
		return nil, err
	}
	out := make([]Record, 0, len(rs))
	for _, r := range rs {
		var rec Record
		if err := json.Unmarshal(r.Value, &rec); err != nil {
			return nil, fmt.Errorf("%s %s: %w", state.Snapshots, r.Key, err)
		}
		out = append(out, rec)
	}
	return out, nil
}

// Delete removes snapshots (of session) and then the session's blobs no
// remaining snapshot of it references; it returns the bytes freed. It is
// not cancelled with ctx once it has begun. It waits for every Hold of
// this Store to be released. In a shared store, while another server holds
// the session's blobs or collects them, it frees none (a later Sweep
// does).
func (s *Store) Delete(ctx context.Context, session string, ids ...string) (int64, error) {
	s.gc.Lock()
	defer s.gc.Unlock()
	ctx = context.WithoutCancel(ctx)
	// Without ids (FreeLater, Sweep) nothing is deleted: no commit, and
	// so no write and sync for nothing.
	if len(ids) > 0 {
		ops := make([]state.Op, 0, 2*len(ids))
		for _, id := range ids {
			_, rev, err := s.record(ctx, session, id)
			if err != nil {
				return 0, err
			}
			ops = append(ops, state.Delete(state.Snapshots, id).If(rev), state.Delete(state.SnapshotManifests, id))
		}
		if _, err := s.st.Commit(ctx, ops...); err != nil {
			return 0, err
		}
	}
	if s.shared {
		cctx, end, ok, err := s.beginCollect(ctx, session)
		if err != nil || !ok {
			return 0, err
		}
		defer end()
		ctx = cctx
	}
	// The blobs the session's remaining snapshots name: no capture adds a
	// snapshot while gc is held.
	live := map[string]bool{}
	recs, err := s.List(ctx, session)
	if err != nil {
		return 0, err
	}
	for _, rec := range recs {
		entries, err := s.manifest(ctx, rec.ID)
		if errors.Is(err, state.ErrNotFound) {
			continue // deleted since the list (by another server): it names nothing
		}
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
		return s.blobs.DeleteNamespace(ctx, session)
	}
	var dead []string
	if err := s.blobs.List(ctx, session, func(hash string) error {
		if !live[hash] {
			dead = append(dead, hash)
		}
		return nil
	}); err != nil {
		return 0, err
	}
	return s.blobs.Delete(ctx, session, dead...)
}

// FreeLater deletes the snapshots ids of session (restore's copy of the
// workspace) and frees the blobs of session that no snapshot names (what a
// refused snapshot stored, the transient copies of fork and restore) in
// the background, once every Hold, the caller's included, is released.
// A failure is logged to log.
func (s *Store) FreeLater(log *slog.Logger, session string, ids ...string) {
	go func() {
		if _, err := s.Delete(context.Background(), session, ids...); err != nil {
			log.Warn("free the snapshot blobs no snapshot names", "session", session, "snapshots", ids, "err", err)
		}
	}()
}

// Sweep frees the blobs no snapshot names in every session's store: what
// a process killed during a capture left (a capture's blobs are written
// before its manifest), and the stores of sessions that are gone. It
// logs to log what it freed and what it could not. Only one server of those
// sharing a store may sweep at a time (the service's reaper lease): the
// blobs another server's capture is writing are no orphans.
func (s *Store) Sweep(ctx context.Context, log *slog.Logger) {
	sessions, err := s.blobs.Namespaces(ctx)
	if err != nil {
		log.Warn("list the sessions of the snapshot blob store", "err", err)
		return
	}
	for _, session := range sessions {
		if ctx.Err() != nil {
			return
		}
		if freed, err := s.Delete(ctx, session); err != nil {
			log.Warn("free the snapshot blobs no snapshot names", "session", session, "err", err)
		} else if freed > 0 {
			log.Info("freed snapshot blobs no snapshot names", "session", session, "bytes", freed)
		}
	}
}

// SessionIDs returns the ids of session's snapshots, oldest first.
func (s *Store) SessionIDs(ctx context.Context, session string) ([]string, error) {
	recs, err := s.List(ctx, session)
	ids := make([]string, len(recs))
	for i, r := range recs {
		ids[i] = r.ID
	}
	return ids, err
}

// Bytes returns the bytes session's blobs take (blobs.Store.Size: holes
// not counted). As ever, a blob it cannot read counts nothing.
func (s *Store) Bytes(session string) int64 {
	n, _ := s.blobs.Size(context.Background(), session)
	return n
}
