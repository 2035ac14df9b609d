package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/blobs"
	"github.com/cellbox/cellbox/sandbox/snapshots"
)

// sh runs a shell command in box that must exit 0 and returns its stdout.
func (rb *realBox) sh(box, command string) string {
	rb.t.Helper()
	m := rb.ok("shell", map[string]any{"sandbox": box, "command": command})
	require.EqualValues(rb.t, 0, m["exit_code"], "%s in %s: %v", command, box, m["stderr"])
	return m["stdout"].(string)
}

// fail runs a tool that must fail and returns its message.
func (rb *realBox) fail(name string, input any) string {
	rb.t.Helper()
	m := rb.call(name, input)
	require.Equal(rb.t, true, m["is_error"], "%s should fail: %v", name, m)
	return m["error"].(string)
}

// restart closes the service and starts a new one over the same data dir
// and backend (the boxes keep running and are reattached).
func (rb *realBox) restart() {
	rb.t.Helper()
	cfg := rb.s.cfg
	require.NoError(rb.t, rb.s.Close())
	s, err := New(context.Background(), cfg)
	require.NoError(rb.t, err)
	rb.t.Cleanup(func() { s.Close() })
	rb.s = s
}

// blobDir is where the service keeps session's snapshot blobs: the layout
// of blobs.OpenDir over DATA/snapshots, which data dirs keep.
func (rb *realBox) blobDir(session string) string {
	return filepath.Join(rb.s.cfg.DataDir, "snapshots", "blobs", session)
}

// blobPath is where the blob hash of session is.
func (rb *realBox) blobPath(session, hash string) string {
	return filepath.Join(rb.blobDir(session), hash[:2], hash)
}

// TestSnapshots drives snapshot, restore, branch, fork, snapshot_list and
// snapshot_delete through the tool API on both real backends.
func TestSnapshots(t *testing.T) {
	for _, kind := range []string{"local", "docker"} {
		t.Run(kind, func(t *testing.T) {
			rb := newRealService(t, kind, func(cfg *Config) { cfg.MaxBoxesPerSession = 8 })
			const tree = "mkdir -p src/sub && echo v1 > src/a.txt && echo deep > src/sub/b.txt && ln -s a.txt src/link && chmod 751 src/sub"
			rb.sh("default", tree)
			const show = "cat src/a.txt src/sub/b.txt src/link && stat -c %a src/sub && readlink src/link"
			want := "v1\ndeep\nv1\n751\na.txt\n"
			require.Equal(t, want, rb.sh("default", show))

			// snapshot, modify, restore: the old content is back, the new
			// file is gone.
			snap := rb.ok("snapshot", map[string]any{"label": "v1"})
			id := snap["id"].(string)
			assert.EqualValues(t, 2, snap["files"])
			rb.sh("default", "echo v2 > src/a.txt && rm src/sub/b.txt && echo new > added.txt")
			rb.ok("restore", map[string]any{"snapshot": id})
			assert.Equal(t, want, rb.sh("default", show))
			assert.Equal(t, "gone\n", rb.sh("default", "test -e added.txt || echo gone"))

			// branch: a new box with the content; the original unchanged.
			rb.sh("default", "echo changed > src/a.txt")
			br := rb.ok("branch", map[string]any{"snapshot": id, "name": "b1"})
			assert.Equal(t, "b1", br["sandbox"])
			assert.Equal(t, want, rb.sh("b1", show))
			assert.Equal(t, "changed\n", rb.sh("default", "cat src/a.txt"))
			assert.Contains(t, rb.fail("branch", map[string]any{"snapshot": id, "name": "b1"}), "already has sandboxes named b1")

			// fork: N boxes with the running box's files, independent after.
			rb.checkFork("clone")

			// dedup: two snapshots of one 10 MiB tree cost one tree.
			rb.sh("default", "mkdir big && for i in 1 2 3 4 5 6 7 8 9 10; do head -c 1048576 /dev/urandom > big/f$i; done")
			s1 := rb.ok("snapshot", map[string]any{"label": "big1"})
			before := rb.ok("snapshot_list", nil)["store_bytes"].(float64)
			s2 := rb.ok("snapshot", map[string]any{"label": "big2"})
			assert.Greater(t, s1["added_bytes"].(float64), float64(10<<20)-1)
			assert.EqualValues(t, 0, s2["added_bytes"], "an unchanged tree adds nothing")
			list := rb.ok("snapshot_list", nil)
			assert.Equal(t, before, list["store_bytes"].(float64))
			assert.Len(t, list["snapshots"], 3)

			// deleting one of two sharing snapshots frees nothing; the
			// last one frees the tree.
			assert.EqualValues(t, 0, rb.ok("snapshot_delete", map[string]any{"snapshot": s1["id"]})["freed_bytes"])
			assert.Greater(t, rb.ok("snapshot_delete", map[string]any{"snapshot": s2["id"]})["freed_bytes"].(float64), float64(10<<20)-1)
			assert.Less(t, rb.ok("snapshot_list", nil)["store_bytes"].(float64), float64(1<<20))

			// survives a restart: restore after the service came back.
			rb.restart()
			rb.sh("default", "rm -rf src big")
			rb.ok("restore", map[string]any{"snapshot": id})
			assert.Equal(t, want, rb.sh("default", show))

			// another session cannot see, restore, branch from or delete it.
			other, _, err := rb.s.NewSession(context.Background())
			require.NoError(t, err)
			own := rb.sess
			rb.sess = other
			assert.Empty(t, rb.ok("snapshot_list", nil)["snapshots"])
			for _, tc := range []struct {
				tool  string
				input map[string]any
			}{
				{"restore", map[string]any{"snapshot": id}},
				{"branch", map[string]any{"snapshot": id, "name": "stolen"}},
				{"snapshot_delete", map[string]any{"snapshot": id}},
			} {
				m := rb.call(tc.tool, tc.input)
				assert.Equal(t, true, m["is_error"], tc.tool)
				assert.Equal(t, api.CodeNotFound, m["code"], tc.tool)
				assert.Contains(t, m["error"], "no snapshot", tc.tool)
			}
			// Content is not shared across sessions: the same bytes cost
			// again, so added_bytes tells nothing of other sessions' files.
			rb.sh("default", "echo v1 > guess.txt")
			assert.EqualValues(t, 3, rb.ok("snapshot", nil)["added_bytes"])
			rb.sess = own
			assert.Len(t, rb.ok("snapshot_list", nil)["snapshots"], 1)

			// A deleted session's snapshots and content go with it.
			require.NoError(t, rb.s.DeleteSession(context.Background(), own))
			assert.NoDirExists(t, rb.blobDir(own))
			ids, err := rb.s.snaps.SessionIDs(context.Background(), own)
			require.NoError(t, err)
			assert.Empty(t, ids)
			rb.sess = other
		})
	}
}

// checkFork forks box default (whose src/a.txt says "changed") into three
// and checks that each has its files and is independent, and that the fork
// copied by method.
func (rb *realBox) checkFork(method string) {
	t := rb.t
	t.Helper()
	fk := rb.ok("fork", map[string]any{"count": 3})
	assert.Equal(t, method, fk["method"])
	names := fk["sandboxes"].([]any)
	require.Len(t, names, 3)
	for i, n := range names {
		name := n.(string)
		assert.Equal(t, "changed\ndeep\n751\n", rb.sh(name, "cat src/a.txt src/sub/b.txt && stat -c %a src/sub"), name)
		rb.sh(name, fmt.Sprintf("echo fork%d > src/a.txt && touch src/new%d", i, i))
	}
	for i, n := range names {
		assert.Equal(t, fmt.Sprintf("fork%d\n", i), rb.sh(n.(string), "cat src/a.txt"))
		assert.Equal(t, "src/a.txt\nsrc/link\nsrc/new"+fmt.Sprint(i)+"\n", rb.sh(n.(string), "ls -d src/*[!b]"), "each fork sees only its own new file")
	}
	assert.Equal(t, "changed\n", rb.sh("default", "cat src/a.txt"), "the forked box is unchanged")
	assert.Contains(t, rb.fail("fork", map[string]any{"count": 17}), "count")
	assert.Contains(t, rb.fail("fork", map[string]any{"count": 2, "names": []string{names[0].(string), "x"}}), "already has sandboxes named")
	for _, n := range names {
		rb.ok("sandbox_destroy", map[string]any{"sandbox": n})
	}

	// All or nothing: a fork beyond the session's cap (8) makes no box.
	before := len(rb.ok("sandbox_list", nil)["sandboxes"].([]any))
	m := rb.call("fork", map[string]any{"count": 8})
	assert.Equal(t, true, m["is_error"])
	assert.Equal(t, api.CodeLimit, m["code"], "%v", m["error"])
	assert.Len(t, rb.ok("sandbox_list", nil)["sandboxes"], before)
}

// noClone hides a backend's backend.Cloner, so that fork takes the
// portable path through the agents.
type noClone struct{ backend.Backend }

// Capabilities says it does not clone.
func (n noClone) Capabilities() backend.Capabilities {
	c := n.Backend.Capabilities()
	c.Clone = false
	return c
}

// TestForkThroughAgents: fork without a copy-on-write backend copies the
// files through the agents' tar streams, on both backends.
func TestForkThroughAgents(t *testing.T) {
	for _, kind := range []string{"local", "docker"} {
		t.Run(kind, func(t *testing.T) {
			rb := newRealService(t, kind, func(cfg *Config) {
				cfg.Backend = noClone{cfg.Backend}
				cfg.MaxBoxesPerSession = 8
			})
			rb.sh("default", "mkdir -p src/sub && echo changed > src/a.txt && echo deep > src/sub/b.txt && ln -s a.txt src/link && chmod 751 src/sub")
			rb.checkFork("tar")
		})
	}
}

// TestRestoreTooLargeKeepsWorkspace: restoring a snapshot larger than the
// box's disk cap is refused before the workspace is cleared (it used to
// delete the workspace, then run out of space part way).
func TestRestoreTooLargeKeepsWorkspace(t *testing.T) {
	rb := newRealService(t, "local", nil)
	rb.sh("default", "head -c 70000000 /dev/zero > r.bin")
	id := rb.ok("snapshot", nil)["id"]
	rb.ok("sandbox_create", map[string]any{"sandbox": "small", "limits": map[string]any{"disk_bytes": backend.MinDiskBytes}})
	rb.sh("small", "echo keep > precious.txt")
	m := rb.call("restore", map[string]any{"sandbox": "small", "snapshot": id})
	require.Equal(t, true, m["is_error"], "%v", m)
	assert.Equal(t, api.CodeTooLarge, m["code"])
	assert.Contains(t, m["error"], "70000000 bytes, more than the sandbox's disk cap of 67108864 bytes")
	assert.Equal(t, "keep\n", rb.sh("small", "cat precious.txt"))
	assert.Equal(t, "gone\n", rb.sh("small", "test -e r.bin || echo gone"))
}

// TestRestoreStoppedPartWayPutsWorkspaceBack: a restore whose copy fails
// part way (here the box's disk fills: 66 MB of random bytes pass the
// size check of a 64 MiB disk, not ext4's overhead) puts the earlier
// workspace back. It used to delete the workspace first and leave it
// gone. The transient copy of the workspace is freed afterwards.
func TestRestoreStoppedPartWayPutsWorkspaceBack(t *testing.T) {
	rb := newRealService(t, "local", nil)
	rb.sh("default", "head -c 66000000 /dev/urandom > r.bin")
	id := rb.ok("snapshot", nil)["id"]
	rb.ok("sandbox_create", map[string]any{"sandbox": "small", "limits": map[string]any{"disk_bytes": backend.MinDiskBytes}})
	rb.sh("small", "echo keep > precious.txt && mkdir -p d && echo two > d/also.txt")
	m := rb.call("restore", map[string]any{"sandbox": "small", "snapshot": id})
	require.Equal(t, true, m["is_error"], "%v", m)
	assert.Equal(t, api.CodeTooLarge, m["code"], "a full disk is too_large, not internal")
	msg := m["error"].(string)
	assert.Contains(t, msg, "stopped part way")
	assert.Contains(t, msg, "the workspace is back as it was before the restore")
	assert.Equal(t, "keep\ntwo\n", rb.sh("small", "cat precious.txt d/also.txt"))
	assert.Equal(t, "gone\n", rb.sh("small", "test -e r.bin || echo gone"))
	require.Eventually(t, func() bool { return rb.s.snaps.Bytes(rb.sess) == 66000000 }, 10*time.Second, 10*time.Millisecond,
		"the copy of the workspace taken first is freed")
	require.Eventually(t, func() bool { return len(rb.ok("snapshot_list", nil)["snapshots"].([]any)) == 1 }, 10*time.Second, 10*time.Millisecond,
		"and its snapshot deleted")
}

// TestSnapshotForkNeedExistingBox: a snapshot or fork of a sandbox the
// session does not have is no_box, and makes none (it made an empty one,
// and a snapshot racing sandbox_destroy brought the box back).
func TestSnapshotForkNeedExistingBox(t *testing.T) {
	rb := newRealService(t, "local", nil)
	rb.sh("default", "true")
	for _, tool := range []string{"snapshot", "fork"} {
		in := map[string]any{"sandbox": "nosuch"}
		if tool == "fork" {
			in["count"] = 1
		}
		m := rb.call(tool, in)
		require.Equal(t, true, m["is_error"], "%s: %v", tool, m)
		assert.Equal(t, api.CodeNoBox, m["code"], tool)
		assert.Contains(t, m["error"], `no sandbox "nosuch" in this session`)
	}
	assert.Len(t, rb.ok("sandbox_list", nil)["sandboxes"], 1, "no sandbox was made")
}

// TestParallelRestores: two restores of one box at once (a model's
// parallel tool calls) leave exactly one snapshot's files, and a snapshot
// taken meanwhile holds one whole state. Each cleared and filled the
// workspace at the same time: it ended empty, or with 13 of 200 files, or
// 198 of 200 after a success.
func TestParallelRestores(t *testing.T) {
	rb := newRealService(t, "local", nil)
	rb.sh("default", "mkdir A && for i in $(seq 200); do echo a$i > A/$i; done")
	a := rb.ok("snapshot", nil)["id"]
	rb.sh("default", "rm -rf A && mkdir B && for i in $(seq 200); do echo b$i > B/$i; done")
	b := rb.ok("snapshot", nil)["id"]
	rb.sh("default", "rm -rf B && echo mine > mine.txt")
	results := make(chan map[string]any, 3)
	for _, id := range []any{a, b} {
		go func() { results <- rb.call("restore", map[string]any{"snapshot": id}) }()
	}
	go func() { results <- rb.call("snapshot", map[string]any{"label": "meanwhile"}) }()
	var during any
	for range 3 {
		m := <-results
		require.Equal(t, false, m["is_error"], "%v", m)
		if m["label"] == "meanwhile" {
			during = m["id"]
		}
	}
	ls := rb.sh("default", "ls; find . -type f | wc -l")
	assert.Contains(t, []string{"A\n200\n", "B\n200\n"}, ls, "one snapshot's files, whole")
	rb.ok("restore", map[string]any{"snapshot": during})
	assert.Contains(t, []string{"mine.txt\n1\n", "A\n200\n", "B\n200\n"}, rb.sh("default", "ls; find . -type f | wc -l"), "the snapshot taken meanwhile holds one whole state")
}

// TestSnapshotOrphanBlobsSwept: blobs no snapshot names (a process killed
// during a capture leaves them: blobs are written before the manifest)
// and the blob store of a session that is gone are freed when a service
// starts; a snapshot's own blobs stay. They used to stay for good.
func TestSnapshotOrphanBlobsSwept(t *testing.T) {
	rb := newRealService(t, "local", nil)
	rb.sh("default", "echo kept > a.txt")
	id := rb.ok("snapshot", nil)["id"]
	orphan := rb.blobPath(rb.sess, strings.Repeat("ab", 32))
	gone := rb.blobPath("sess-gone", strings.Repeat("cd", 32))
	for _, p := range []string{orphan, gone} {
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o700))
		require.NoError(t, os.WriteFile(p, []byte("left by a killed capture"), 0o600))
	}
	rb.restart()
	require.Eventually(t, func() bool {
		_, err1 := os.Stat(orphan)
		_, err2 := os.Stat(rb.blobDir("sess-gone"))
		return os.IsNotExist(err1) && os.IsNotExist(err2)
	}, 10*time.Second, 10*time.Millisecond, "orphan blobs are freed at start")
	rb.sh("default", "rm a.txt")
	rb.ok("restore", map[string]any{"snapshot": id})
	assert.Equal(t, "kept\n", rb.sh("default", "cat a.txt"))
}

// TestForkOverCapCount: a fork past the session's cap says how many
// sandboxes the session has and how many the fork asked for (it used to
// count the fork's own boxes as already there).
func TestForkOverCapCount(t *testing.T) {
	rb := newRealService(t, "local", func(cfg *Config) { cfg.MaxBoxesPerSession = 4 })
	rb.sh("default", "true")
	rb.ok("sandbox_create", map[string]any{"sandbox": "other"})
	m := rb.call("fork", map[string]any{"count": 3})
	require.Equal(t, true, m["is_error"], "%v", m)
	assert.Equal(t, api.CodeLimit, m["code"])
	assert.Contains(t, m["error"], "has 2 sandboxes; 3 more would pass 4, the most")
	assert.Len(t, rb.ok("sandbox_list", nil)["sandboxes"], 2, "a refused fork leaves no names behind")
}

// TestSnapshotLinksOutAndUnreadable: a workspace with symlinks out of it
// (a venv's bin/python) is snapshotted and restored with its links, which
// resolve in the new box's own filesystem; an unreadable file fails the
// snapshot with its name and what to do (before: "tar /workspace:
// permission denied", and links out failed every snapshot).
func TestSnapshotLinksOutAndUnreadable(t *testing.T) {
	rb := newRealService(t, "local", nil)
	rb.sh("default", "mkdir -p venv/bin && ln -s /etc/hostname venv/bin/python && ln -s ../../../etc venv/up && echo hi > a.txt")
	id := rb.ok("snapshot", nil)["id"]
	rb.ok("branch", map[string]any{"snapshot": id, "name": "b"})
	assert.Equal(t, "/etc/hostname\n../../../etc\nhi\n", rb.sh("b", "readlink venv/bin/python venv/up && cat a.txt"))
	assert.Equal(t, rb.sh("b", "cat /etc/hostname"), rb.sh("b", "cat venv/bin/python"), "the link resolves in the new box")
	rb.sh("default", "rm -rf venv a.txt")
	rb.ok("restore", map[string]any{"snapshot": id})
	assert.Equal(t, "/etc/hostname\n", rb.sh("default", "readlink venv/bin/python"))

	rb.sh("default", "mkdir -p sub && echo x > sub/priv && chmod 000 sub/priv")
	m := rb.call("snapshot", nil)
	require.Equal(t, true, m["is_error"], "%v", m)
	assert.Equal(t, api.CodeInvalidInput, m["code"])
	assert.Contains(t, m["error"], "/workspace/sub/priv cannot be read (permission denied); make it readable")
}

// TestSnapshotKeepsOddEntries: a file name and a link target that are
// not UTF-8 come back byte for byte (the manifest's JSON used to turn
// them into U+FFFD), a FIFO comes back as a FIFO (it was left out), and
// hard links as hard links (they became copies).
func TestSnapshotKeepsOddEntries(t *testing.T) {
	rb := newRealService(t, "local", nil)
	rb.sh("default", `echo x > "$(printf 'bad\377\376')" && ln -s "$(printf 'to\377')" "$(printf 'ln\376')" && mkfifo -m 640 pipe && echo h > h1 && mkdir d && ln h1 d/h2`)
	id := rb.ok("snapshot", nil)["id"]
	rb.ok("branch", map[string]any{"snapshot": id, "name": "b"})
	const show = `ls | od -An -c | tr -s ' ' && readlink "$(printf 'ln\376')" | od -An -c | tr -s ' ' && stat -c '%F %a' pipe && stat -c %h h1 d/h2`
	assert.Equal(t, rb.sh("default", show), rb.sh("b", show))
	assert.Contains(t, rb.sh("b", show), `b a d 377 376`)
	assert.Contains(t, rb.sh("b", show), "fifo 640\n2\n2\n", "a hard link stays one")
	assert.Equal(t, rb.sh("b", "stat -c %i h1"), rb.sh("b", "stat -c %i d/h2"))
}

// TestSnapshotStoreCap: a session's snapshots stop at MaxSnapshotBytes
// (the store used to have no byte cap beyond 256 snapshots of a disk
// cap each); the refused snapshot's blobs are freed.
func TestSnapshotStoreCap(t *testing.T) {
	rb := newRealService(t, "local", func(cfg *Config) { cfg.MaxSnapshotBytes = 3 << 20 })
	rb.sh("default", "head -c 2000000 /dev/urandom > a.bin")
	rb.ok("snapshot", nil)
	rb.ok("snapshot", nil) // unchanged: adds nothing
	rb.sh("default", "head -c 2000000 /dev/urandom > b.bin")
	m := rb.call("snapshot", nil)
	require.Equal(t, true, m["is_error"], "%v", m)
	assert.Equal(t, api.CodeLimit, m["code"])
	assert.Contains(t, m["error"], "more than 3145728 bytes (2000000 in use), the most a session may store: delete some with snapshot_delete, or raise the limit (cellbox serve --max-snapshot-bytes)")
	list := rb.ok("snapshot_list", nil)
	assert.Len(t, list["snapshots"], 2)
	require.Eventually(t, func() bool { return rb.s.snaps.Bytes(rb.sess) == 2000000 }, 10*time.Second, 10*time.Millisecond, "the refused snapshot's blobs are freed")

	// A label is a label: a megabyte of one is refused (it was kept, and
	// shown by every snapshot_list).
	m = rb.call("snapshot", map[string]any{"label": strings.Repeat("x", 1<<20)})
	require.Equal(t, true, m["is_error"], "%v", m)
	assert.Equal(t, api.CodeInvalidInput, m["code"])
	assert.Contains(t, m["error"], "snapshot label of 1048576 bytes: at most 256")
}

// A sparse file (a box's `truncate -s 1G`) costs neither the snapshot
// store nor a restored, branched or transferred-to box the gigabyte of
// zeros (it was stored in full, 3 GB of host disk for a box using none,
// and written back in full), and the snapshot tells its size and its data
// apart. The holes never cross a tar stream (agent.TestTarSparseFile).
func TestSnapshotSparseFile(t *testing.T) {
	for _, kind := range []string{"local", "docker"} {
		t.Run(kind, func(t *testing.T) { snapshotSparseFile(t, kind) })
	}
}

func snapshotSparseFile(t *testing.T, kind string) {
	rb := newRealService(t, kind, nil)
	rb.sh("default", "truncate -s 1G sparse && printf x >> sparse")
	snap := rb.ok("snapshot", nil)
	id := snap["id"]
	assert.EqualValues(t, 1<<30+1, snap["size"], "size: as ls shows it")
	assert.Less(t, snap["data_bytes"], float64(1<<20), "data_bytes: the holes are not data")
	assert.Less(t, snap["added_bytes"], float64(1<<20), "added_bytes: what the store took")
	var stored int64
	require.NoError(t, filepath.WalkDir(rb.blobDir(rb.sess), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			var st syscall.Stat_t
			if syscall.Stat(p, &st) == nil {
				stored += st.Blocks * 512
			}
		}
		return err
	}))
	assert.Less(t, stored, int64(1<<20), "host disk the snapshot's blobs take")

	tr := rb.ok("transfer", map[string]any{"from_sandbox": "default", "from_path": "sparse", "to_sandbox": "other", "to_path": "sparse"})
	assert.EqualValues(t, 1<<30+1, tr["bytes"], "transfer: %v", tr)
	rb.sh("default", "rm sparse")
	rb.ok("restore", map[string]any{"snapshot": id})
	rb.ok("branch", map[string]any{"snapshot": id, "name": "copy"})
	for _, box := range []string{"default", "copy", "other"} {
		out := rb.sh(box, "stat -c '%s %b %B' sparse && tail -c 1 sparse")
		var size, blocks, unit int64
		var last string
		_, err := fmt.Sscanf(out, "%d %d %d\n%s", &size, &blocks, &unit, &last)
		require.NoError(t, err, out)
		assert.EqualValues(t, 1<<30+1, size, box)
		assert.Equal(t, "x", last, box)
		assert.Less(t, blocks*unit, int64(1<<20), "disk the file takes in %s", box)
	}
}

// A workspace holding a path longer than the system's (30 nested folders
// of 200 characters: 6,000 bytes) fails a snapshot with an error that says
// so; it failed with "suspiciously long trailer after chunked body", the
// agent's error being too long to arrive.
func TestSnapshotDeepPath(t *testing.T) {
	rb := newRealService(t, "local", nil)
	rb.sh("default", `mkdir -p d && cd d && n=$(printf 'c%.0s' $(seq 200)) && for i in $(seq 30); do mkdir $n && cd $n; done && echo x > f.txt`)
	msg := rb.fail("snapshot", nil)
	assert.Contains(t, msg, "file name too long")
	assert.NotContains(t, msg, "trailer")
	assert.Less(t, len(msg), 4096)
}

// grep says what it could not search (a path longer than the system
// allows, an unreadable file) instead of returning fewer hits as if
// complete.
func TestGrepSaysWhatItSkipped(t *testing.T) {
	rb := newRealService(t, "local", nil)
	rb.sh("default", `echo needle > top.txt && echo needle > secret.txt && chmod 000 secret.txt && mkdir -p d && cd d && n=$(printf 'c%.0s' $(seq 200)) && for i in $(seq 30); do mkdir $n && cd $n; done && echo needle > f.txt`)
	out := rb.ok("grep", map[string]any{"pattern": "needle"})
	require.Len(t, out["hits"], 1, "%v", out)
	skipped := fmt.Sprint(out["skipped"])
	assert.Contains(t, skipped, "secret.txt: permission denied")
	assert.Contains(t, skipped, "longer than the system allows")
}

// TestForkBranchKeepSettings: the boxes fork and branch make work where
// their source did (workspace_dir), with its env, and go with the session
// as it did (destroy_on_close); before, they worked in /workspace.
func TestForkBranchKeepSettings(t *testing.T) {
	for _, kind := range []string{"local", "docker"} {
		t.Run(kind, func(t *testing.T) {
			rb := newRealService(t, kind, func(cfg *Config) { cfg.MaxBoxesPerSession = 8 })
			rb.ok("sandbox_create", map[string]any{"sandbox": "src", "workspace_dir": "/workspace/app",
				"env": map[string]string{"E1": "v1"}, "destroy_on_close": true})
			rb.sh("src", "echo built > out.txt")
			rb.ok("fork", map[string]any{"sandbox": "src", "count": 1, "names": []string{"f"}})
			snap := rb.ok("snapshot", map[string]any{"sandbox": "src"})
			rb.ok("branch", map[string]any{"snapshot": snap["id"], "name": "b"})
			list := map[string]map[string]any{}
			for _, s := range rb.ok("sandbox_list", nil)["sandboxes"].([]any) {
				list[s.(map[string]any)["name"].(string)] = s.(map[string]any)
			}
			for _, box := range []string{"f", "b"} {
				assert.Equal(t, "/workspace/app\nv1\nbuilt\n", rb.sh(box, "pwd; echo $E1; cat out.txt"), box)
				require.Contains(t, list, box)
				assert.Equal(t, "/workspace/app", list[box]["workspace_dir"], box)
				assert.Equal(t, true, list[box]["destroy_on_close"], box)
			}

			// A box working under /tmp: a snapshot or fork keeps none of
			// its working directory, and says so.
			rb.ok("sandbox_create", map[string]any{"sandbox": "tw", "workspace_dir": "/tmp/w"})
			rb.sh("tw", "echo important > main.py")
			for tool, in := range map[string]map[string]any{
				"snapshot": {"sandbox": "tw"},
				"fork":     {"sandbox": "tw", "count": 1, "names": []string{"twf"}},
			} {
				assert.Contains(t, rb.ok(tool, in)["notice"], `"tw" works in /tmp/w, outside /workspace`, tool)
			}
		})
	}
}

// TestConfigBlobs: snapshot content goes to the blob store the service is
// given (Config.Blobs: S3 for several servers), not to the data dir.
func TestConfigBlobs(t *testing.T) {
	other := t.TempDir()
	store, err := blobs.OpenDir(other)
	require.NoError(t, err)
	rb := newRealService(t, "local", func(c *Config) { c.Blobs = store })
	rb.sh("default", "printf 'in the given store' > kept.txt")
	rb.ok("snapshot", nil)
	size, err := store.Size(context.Background(), rb.sess)
	require.NoError(t, err)
	assert.Equal(t, int64(len("in the given store")), size, "the blob is in the given store")
	_, err = os.Stat(filepath.Join(rb.s.cfg.DataDir, "snapshots", "blobs"))
	assert.ErrorIs(t, err, os.ErrNotExist, "and none in the data dir")
}

// TestSnapshotSpecRoundTrip: the settings stored with a snapshot (a
// record as every version has written it) come back for branch, and a
// new record stores them the same way.
func TestSnapshotSpecRoundTrip(t *testing.T) {
	const stored = `{"id":"snap-0123456789abcdef","label":"\u003cv1\u003e \u0026 more","session":"s-1","sandbox":"default","box_id":"cb-1","spec":{"Image":"img","Env":{"A":"\u003cb\u003e"},"Limits":{"disk_bytes":1073741824},"Network":false,"Egress":{"allow":["example.com"]},"SleepAfterMs":5,"ID":"","Shared":false,"WorkspaceDir":"/workspace/app","DestroyOnClose":true,"OneShot":false},"created":"2024-01-02T03:04:05.000000006Z","size":10,"data":7,"files":1,"added":3,"entries":2}`
	var rec snapshots.Record
	require.NoError(t, json.Unmarshal([]byte(stored), &rec))
	spec, err := specOfSnapshot(rec)
	require.NoError(t, err)
	yes := true
	want := boxSpec{Image: "img", Env: map[string]string{"A": "<b>"}, Limits: api.Limits{DiskBytes: 1 << 30},
		Egress: &api.NetworkRules{Allow: []string{"example.com"}}, SleepAfterMs: 5, WorkspaceDir: "/workspace/app", DestroyOnClose: &yes}
	assert.Equal(t, want, spec)
	again, err := json.Marshal(specOf(boxRecord{Image: "img", Env: map[string]string{"A": "<b>"}, Limits: api.Limits{DiskBytes: 1 << 30},
		Egress: &api.NetworkRules{Allow: []string{"example.com"}}, SleepAfterMs: 5, WorkspaceDir: "/workspace/app", DestroyOnClose: true}))
	require.NoError(t, err)
	assert.Equal(t, string(rec.Spec), string(again))

	rec.Spec = nil // none stored: the defaults
	spec, err = specOfSnapshot(rec)
	require.NoError(t, err)
	assert.Equal(t, boxSpec{}, spec)
}
