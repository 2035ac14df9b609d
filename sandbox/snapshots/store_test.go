package snapshots

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/blobs"
	"github.com/cellbox/cellbox/sandbox/state"
)

// TestSnapshotHostileTar feeds crafted tar streams (what a compromised
// agent could send) to Capture: each is refused, and nothing is written
// outside the store.
func TestSnapshotHostileTar(t *testing.T) {
	type ent struct {
		name, link string
		typ        byte
		body       string
		size       int64 // overrides len(body) in the header
	}
	cases := []struct {
		name    string
		entries []ent
		want    string
	}{
		{"dotdot", []ent{{name: "workspace/../../etc/x", typ: tar.TypeReg, body: "x"}}, "escapes the workspace"},
		{"absolute", []ent{{name: "/etc/x", typ: tar.TypeReg, body: "x"}}, "absolute name"},
		{"outside workspace", []ent{{name: "etc/passwd", typ: tar.TypeReg, body: "x"}}, "is not in /workspace"},
		{"prefix lookalike", []ent{{name: "workspace2/x", typ: tar.TypeReg, body: "x"}}, "is not in /workspace"},
		{"entry under a symlink", []ent{{name: "workspace/l", typ: tar.TypeSymlink, link: "/etc"}, {name: "workspace/l/x", typ: tar.TypeReg, body: "x"}}, `"l/x" goes through the symlink l`},
		{"entry under a symlink, link last", []ent{{name: "workspace/l/d/", typ: tar.TypeDir}, {name: "workspace/l", typ: tar.TypeSymlink, link: "/etc"}}, `"l/d" goes through the symlink l`},
		{"symlink to nothing", []ent{{name: "workspace/l", typ: tar.TypeSymlink, link: ""}}, "empty, over-long or NUL-holding target"},
		{"hardlink out", []ent{{name: "workspace/h", typ: tar.TypeLink, link: "etc/shadow"}}, "is not in /workspace"},
		{"hardlink to nothing", []ent{{name: "workspace/h", typ: tar.TypeLink, link: "workspace/none"}}, "not a file earlier"},
		{"over the cap", []ent{{name: "workspace/a", typ: tar.TypeReg, body: strings.Repeat("a", 600)}, {name: "workspace/b", typ: tar.TypeReg, body: strings.Repeat("b", 600)}}, "more than 1000 bytes"},
		{"cut short", []ent{{name: "workspace/a", typ: tar.TypeReg, body: "abc", size: 10}}, "from the tar stream: unexpected EOF"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			ss, err := Open(state.NewMemory(), nil, dir, false)
			require.NoError(t, err)
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, e := range tc.entries {
				hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: 0o644}
				if e.typ == tar.TypeReg {
					hdr.Size = int64(len(e.body))
				}
				if e.size > 0 {
					hdr.Size = e.size // a header promising more than the stream holds
				}
				require.NoError(t, tw.WriteHeader(hdr))
				io.WriteString(tw, e.body)
			}
			tw.Flush() // no Close: a cut stream has no end marker
			_, _, err = ss.Capture("s-test", &buf, 1000, math.MaxInt64)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.NoFileExists(t, filepath.Join(dir, "etc", "x"))
		})
	}
}

// TestSnapshotCaptureKeepsLinks: the links a real workspace has (relative,
// absolute into /workspace, hard links, and symlinks out of it such as a
// venv's bin/python) are kept.
func TestSnapshotCaptureKeepsLinks(t *testing.T) {
	dir := t.TempDir()
	ss, err := Open(state.NewMemory(), nil, dir, false)
	require.NoError(t, err)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "workspace/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "workspace/d/", Typeflag: tar.TypeDir, Mode: 0o700},
		{Name: "workspace/d/f", Typeflag: tar.TypeReg, Mode: 0o600, Size: 2},
		{Name: "workspace/d/rel", Typeflag: tar.TypeSymlink, Linkname: "../d/f"},
		{Name: "workspace/abs", Typeflag: tar.TypeSymlink, Linkname: "/workspace/d/f"},
		{Name: "workspace/hard", Typeflag: tar.TypeLink, Linkname: "workspace/d/f"},
		{Name: "workspace/py", Typeflag: tar.TypeSymlink, Linkname: "/usr/bin/python3"},
		{Name: "workspace/d/up", Typeflag: tar.TypeSymlink, Linkname: "../../etc"},
	} {
		require.NoError(t, tw.WriteHeader(h))
		if h.Size > 0 {
			io.WriteString(tw, "hi")
		}
	}
	require.NoError(t, tw.Close())
	entries, added, err := ss.Capture("s-test", &buf, 1000, math.MaxInt64)
	require.NoError(t, err)
	assert.EqualValues(t, 2, added)
	var paths []string
	for _, e := range entries {
		paths = append(paths, e.Path)
	}
	assert.Equal(t, []string{"abs", "d", "d/f", "d/rel", "d/up", "hard", "py"}, paths)
	assert.Equal(t, Entry{Path: "hard", Type: tar.TypeLink, Link: "d/f", Time: entries[5].Time}, entries[5], "a hard link names its file")
	assert.Equal(t, "/usr/bin/python3", entries[6].Link)
	assert.Equal(t, "../../etc", entries[4].Link)
}

// TestRecordLayout: a snapshot's record and manifest are stored as they
// were before the store was a package of its own (the JSON below is what
// sandbox/snapstore.go wrote), so data dirs keep their snapshots; a spec
// is kept byte for byte.
func TestRecordLayout(t *testing.T) {
	const (
		spec     = `{"Image":"img","Env":{"A":"\u003cb\u003e"},"Limits":{"disk_bytes":1073741824},"Network":false,"Egress":{"allow":["example.com"]},"SleepAfterMs":5,"ID":"","Shared":false,"WorkspaceDir":"/workspace/app","DestroyOnClose":true,"OneShot":false}`
		record   = `{"id":"snap-0123456789abcdef","label":"\u003cv1\u003e \u0026 more","session":"s-1","sandbox":"default","box_id":"cb-1","spec":{"Image":"img","Env":{"A":"\u003cb\u003e"},"Limits":{"disk_bytes":1073741824},"Network":false,"Egress":{"allow":["example.com"]},"SleepAfterMs":5,"ID":"","Shared":false,"WorkspaceDir":"/workspace/app","DestroyOnClose":true,"OneShot":false},"created":"2024-01-02T03:04:05.000000006Z","size":10,"data":7,"files":1,"added":3,"entries":2}`
		manifest = `[{"p":"","t":48,"m":420,"s":10,"h":"ab","sp":"x","d":7,"mt":"2024-01-02T03:04:05Z","pb":"YmFk/w=="},{"p":"l","t":50,"m":511,"mt":"0001-01-01T00:00:00Z","lb":"dG/+"}]`
	)
	data := int64(7)
	rec := Record{ID: "snap-0123456789abcdef", Label: "<v1> & more", Session: "s-1", Sandbox: "default", BoxID: "cb-1",
		Spec:    json.RawMessage(spec),
		Created: time.Date(2024, 1, 2, 3, 4, 5, 6, time.UTC), Size: 10, Data: &data, Files: 1, Added: 3, Entries: 2}
	entries := []Entry{
		{Path: "bad\xff", Type: tar.TypeReg, Mode: 0o644, Size: 10, Hash: "ab", Map: "x", Data: 7, Time: time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)},
		{Path: "l", Type: tar.TypeSymlink, Mode: 0o777, Link: "to\xfe"},
	}
	st := state.NewMemory()
	ss, err := Open(st, nil, t.TempDir(), false)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, ss.Put(ctx, rec, entries))
	r, err := st.Get(ctx, state.Snapshots, rec.ID)
	require.NoError(t, err)
	assert.Equal(t, record, string(r.Value))
	m, err := st.Get(ctx, state.SnapshotManifests, rec.ID)
	require.NoError(t, err)
	assert.Equal(t, manifest, string(m.Value))

	got, gotEntries, err := ss.Get(ctx, "s-1", rec.ID)
	require.NoError(t, err)
	assert.Equal(t, spec, string(got.Spec))
	assert.True(t, got.Created.Equal(rec.Created))
	got.Created, got.Spec = rec.Created, rec.Spec
	assert.Equal(t, rec, got)
	assert.Equal(t, entries, gotEntries)
}

// capture stores a workspace of files (name -> content) for session.
func capture(t *testing.T, ss *Store, session string, files map[string]string) ([]Entry, int64) {
	t.Helper()
	release, err := ss.Hold(context.Background(), session)
	require.NoError(t, err)
	defer release()
	return captureHeld(t, ss, session, files)
}

// captureHeld is capture for a caller that holds the store.
func captureHeld(t *testing.T, ss *Store, session string, files map[string]string) ([]Entry, int64) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "workspace/", Typeflag: tar.TypeDir, Mode: 0o755}))
	for name, body := range files {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: "workspace/" + name, Typeflag: tar.TypeReg, Mode: 0o640, Size: int64(len(body))}))
		io.WriteString(tw, body)
	}
	require.NoError(t, tw.Close())
	entries, added, err := ss.Capture(session, &buf, math.MaxInt64, math.MaxInt64)
	require.NoError(t, err)
	return entries, added
}

// TestStoreLifecycle: snapshots are put, got, listed and deleted per
// session; content is shared within a session only; deleting frees the
// blobs no remaining snapshot names; WriteTar gives the workspace back;
// another session's id is not found.
func TestStoreLifecycle(t *testing.T) {
	ctx := context.Background()
	ss, err := Open(state.NewMemory(), nil, t.TempDir(), false)
	require.NoError(t, err)
	put := func(session, id string, created time.Time, files map[string]string) ([]Entry, int64) {
		entries, added := capture(t, ss, session, files)
		rec := Record{ID: id, Session: session, Spec: json.RawMessage(`{}`), Created: created, Entries: len(entries)}
		rec.Files, rec.Size = CountFiles(entries)
		require.NoError(t, ss.Put(ctx, rec, entries))
		return entries, added
	}
	t0 := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	e1, added := put("s-a", "snap-2", t0, map[string]string{"a.txt": "aaaa", "b.txt": "bb"})
	assert.EqualValues(t, 6, added)
	files, size := CountFiles(e1)
	assert.Equal(t, 2, files)
	assert.EqualValues(t, 6, size)
	assert.EqualValues(t, 6, DataBytes(e1))
	_, added = put("s-a", "snap-1", t0.Add(time.Hour), map[string]string{"a.txt": "aaaa", "c.txt": "ccc"})
	assert.EqualValues(t, 3, added, "a.txt is there already")
	_, added = put("s-b", "snap-3", t0, map[string]string{"a.txt": "aaaa"})
	assert.EqualValues(t, 4, added, "content is not shared across sessions")
	assert.EqualValues(t, 9, ss.Bytes("s-a"))

	ids, err := ss.SessionIDs(ctx, "s-a")
	require.NoError(t, err)
	assert.Equal(t, []string{"snap-2", "snap-1"}, ids, "oldest first")
	recs, err := ss.List(ctx, "s-b")
	require.NoError(t, err)
	require.Len(t, recs, 1)
	assert.Equal(t, "snap-3", recs[0].ID)

	for _, call := range []func() error{
		func() error { _, _, err := ss.Get(ctx, "s-b", "snap-2"); return err },
		func() error { _, err := ss.Delete(ctx, "s-b", "snap-2"); return err },
		func() error { _, _, err := ss.Get(ctx, "s-a", ""); return err },
	} {
		err := call()
		require.Error(t, err)
		assert.Equal(t, api.CodeNotFound, api.CodeOf(err))
		assert.Contains(t, err.Error(), "in this session (see snapshot_list)")
	}

	_, entries, err := ss.Get(ctx, "s-a", "snap-2")
	require.NoError(t, err)
	var buf bytes.Buffer
	require.NoError(t, ss.WriteTar(ctx, &buf, "s-a", entries))
	tr := tar.NewReader(&buf)
	got := map[string]string{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		body, err := io.ReadAll(tr)
		require.NoError(t, err)
		got[hdr.Name] = string(body)
	}
	assert.Equal(t, map[string]string{"a.txt": "aaaa", "b.txt": "bb"}, got)

	freed, err := ss.Delete(ctx, "s-a", "snap-2")
	require.NoError(t, err)
	assert.EqualValues(t, 2, freed, "b.txt only: snap-1 names a.txt")
	freed, err = ss.Delete(ctx, "s-a", "snap-1")
	require.NoError(t, err)
	assert.EqualValues(t, 7, freed)
	assert.EqualValues(t, 0, ss.Bytes("s-a"))
	assert.EqualValues(t, 4, ss.Bytes("s-b"))
}

// TestStoreSweep: Sweep frees the blobs no snapshot names (a capture
// never put, a session that is gone) and keeps the others; FreeLater
// frees them once the holds are released.
func TestStoreSweep(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	ss, err := Open(state.NewMemory(), nil, dir, false)
	require.NoError(t, err)
	entries, _ := capture(t, ss, "s-a", map[string]string{"kept": "kept"})
	require.NoError(t, ss.Put(ctx, Record{ID: "snap-1", Session: "s-a", Spec: json.RawMessage(`{}`)}, entries))
	capture(t, ss, "s-a", map[string]string{"orphan": "left by a killed capture"})
	capture(t, ss, "s-gone", map[string]string{"x": "of a session that is gone"})
	ss.Sweep(ctx, slog.New(slog.DiscardHandler))
	assert.EqualValues(t, 4, ss.Bytes("s-a"))
	assert.NoDirExists(t, filepath.Join(dir, "blobs", "s-gone"))

	release, err := ss.Hold(ctx, "s-a")
	require.NoError(t, err)
	captureHeld(t, ss, "s-a", map[string]string{"transient": "a fork's copy"})
	ss.FreeLater(slog.New(slog.DiscardHandler), "s-a")
	time.Sleep(50 * time.Millisecond)
	assert.EqualValues(t, 4+len("a fork's copy"), ss.Bytes("s-a"), "not while held")
	release()
	require.Eventually(t, func() bool { return ss.Bytes("s-a") == 4 }, 10*time.Second, 10*time.Millisecond)
}

// TestOpenGivenBlobs: with a blobs.Store given, the content goes there and
// nothing to the data dir.
func TestOpenGivenBlobs(t *testing.T) {
	b, err := blobs.OpenDir(t.TempDir())
	require.NoError(t, err)
	dataDir := t.TempDir()
	ss, err := Open(state.NewMemory(), b, dataDir, false)
	require.NoError(t, err)
	capture(t, ss, "s-a", map[string]string{"f": "in the given store"})
	n, err := b.Size(context.Background(), "s-a")
	require.NoError(t, err)
	assert.EqualValues(t, len("in the given store"), n)
	assert.NoDirExists(t, filepath.Join(dataDir, "snapshots"))
}
