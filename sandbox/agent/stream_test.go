package agent

import (
	"archive/tar"
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTarRoundTrip(t *testing.T) {
	a := startAgent(t)
	ctx := ctxT(t)
	src := a.path("proj")
	require.NoError(t, os.MkdirAll(filepath.Join(src, "bin"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(src, "empty"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(src, "bin", "run"), []byte("#!/bin/sh\necho hi\n"), 0o755))
	blob := bytes.Repeat([]byte{0, 1, 2, 0xff}, 1<<18)
	require.NoError(t, os.WriteFile(filepath.Join(src, "blob"), blob, 0o600))
	require.NoError(t, os.Symlink("bin/run", filepath.Join(src, "link")))
	// A time with a fraction comes back cut to the second, never rounded
	// up into the future (a restored file looked newer than it was).
	late := time.Date(2026, 1, 2, 3, 4, 5, 900_000_000, time.UTC)
	require.NoError(t, os.Chtimes(filepath.Join(src, "blob"), late, late))

	var buf bytes.Buffer
	n, err := a.c.TarOut(ctx, "proj", &buf)
	require.NoError(t, err)
	assert.Equal(t, int64(buf.Len()), n)

	var names []string
	tr := tar.NewReader(bytes.NewReader(buf.Bytes()))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		names = append(names, h.Name)
	}
	assert.Equal(t, []string{"proj/", "proj/bin/", "proj/bin/run", "proj/blob", "proj/empty/", "proj/link"}, names)

	in, err := a.c.TarIn(ctx, filepath.Join(a.tmp, "copy"), bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	assert.Equal(t, n, in)
	dst := filepath.Join(a.tmp, "copy", "proj")
	got, err := os.ReadFile(filepath.Join(dst, "blob"))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(blob, got))
	fi, err := os.Stat(filepath.Join(dst, "blob"))
	require.NoError(t, err)
	assert.Equal(t, late.Truncate(time.Second), fi.ModTime().UTC())
	for p, mode := range map[string]os.FileMode{"bin/run": 0o755, "blob": 0o600, "empty": 0o700 | os.ModeDir} {
		fi, err := os.Stat(filepath.Join(dst, p))
		require.NoError(t, err)
		assert.Equal(t, mode, fi.Mode()&(os.ModeDir|os.ModePerm), p)
	}
	link, err := os.Readlink(filepath.Join(dst, "link"))
	require.NoError(t, err)
	assert.Equal(t, "bin/run", link)

	// a single file
	buf.Reset()
	_, err = a.c.TarOut(ctx, "proj/blob", &buf)
	require.NoError(t, err)
	h, err := tar.NewReader(&buf).Next()
	require.NoError(t, err)
	assert.Equal(t, "blob", h.Name)
}

func TestTarInRejectsEscapes(t *testing.T) {
	a := startAgent(t)
	ctx := ctxT(t)
	type entry struct {
		name, link string
		typ        byte
	}
	tests := []struct {
		name    string
		entries []entry
	}{
		{"dotdot", []entry{{name: "../evil", typ: tar.TypeReg}}},
		{"nested dotdot", []entry{{name: "a/../../evil", typ: tar.TypeReg}}},
		{"absolute", []entry{{name: filepath.Join(a.outside, "evil"), typ: tar.TypeReg}}},
		{"through a symlink of the stream", []entry{{name: "l", link: a.outside, typ: tar.TypeSymlink}, {name: "l/evil", typ: tar.TypeReg}}},
		{"hardlink through a symlink of the stream", []entry{{name: "l", link: a.outside, typ: tar.TypeSymlink}, {name: "h", link: "l/secret", typ: tar.TypeLink}}},
		{"hardlink out", []entry{{name: "h", link: "../../outside/secret", typ: tar.TypeLink}}},
		{"hardlink absolute", []entry{{name: "h", link: filepath.Join(a.outside, "secret"), typ: tar.TypeLink}}},
		{"through a symlink already there", []entry{{name: "planted/evil", typ: tar.TypeReg}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, e := range tt.entries {
				h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o644}
				if e.typ == tar.TypeReg {
					h.Size = 5
				}
				require.NoError(t, tw.WriteHeader(h))
				if e.typ == tar.TypeReg {
					tw.Write([]byte("pwned"))
				}
			}
			require.NoError(t, tw.Close())
			dir := filepath.Join("x", tt.name)
			require.NoError(t, os.MkdirAll(a.path(dir), 0o755))
			require.NoError(t, os.Symlink(a.outside, a.path(filepath.Join(dir, "planted"))))
			_, err := a.c.TarIn(ctx, dir, &buf)
			e := requireCode(t, err, CodeOutsideWorkspace)
			assert.Contains(t, e.Message, "nothing after it was extracted")
			ents, _ := os.ReadDir(a.outside)
			assert.Len(t, ents, 1, "only the secret is outside")
			_, err = os.Stat(a.path("x/evil"))
			assert.True(t, os.IsNotExist(err))
		})
	}
	_, err := a.c.TarIn(ctx, "garbage", bytes.NewReader([]byte("this is not a tar stream, not at all, no.................................")))
	requireCode(t, err, CodeInvalid)
}

// TestTarInKeepsLinksOut: symlinks are made as they are, wherever they
// point (a venv's bin/python -> /usr/bin/python3), and never followed: a
// directory entry over one replaces it instead of chmodding its target.
func TestTarInKeepsLinksOut(t *testing.T) {
	a := startAgent(t)
	before, err := os.Stat(a.outside)
	require.NoError(t, err)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "py", Linkname: "/usr/bin/python3", Typeflag: tar.TypeSymlink},
		{Name: "up", Linkname: "../../outside", Typeflag: tar.TypeSymlink},
		{Name: "d", Linkname: a.outside, Typeflag: tar.TypeSymlink},
		{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o777},
	} {
		require.NoError(t, tw.WriteHeader(h))
	}
	require.NoError(t, tw.Close())
	_, err = a.c.TarIn(ctxT(t), "links", &buf)
	require.NoError(t, err)
	for name, want := range map[string]string{"py": "/usr/bin/python3", "up": "../../outside"} {
		got, err := os.Readlink(a.path("links/" + name))
		require.NoError(t, err)
		assert.Equal(t, want, got)
	}
	fi, err := os.Lstat(a.path("links/d"))
	require.NoError(t, err)
	assert.True(t, fi.IsDir(), "the directory replaced the link")
	after, err := os.Stat(a.outside)
	require.NoError(t, err)
	assert.Equal(t, before.Mode(), after.Mode(), "the link's target was not chmodded")
}

// watching starts an agent whose root holds the directory w (and dirs, of
// it) and watches w with debounce.
func watching(t *testing.T, debounce time.Duration, dirs ...string) (*testAgent, <-chan []Event) {
	t.Helper()
	a := startAgent(t)
	for _, d := range append([]string{"w"}, dirs...) {
		require.NoError(t, os.MkdirAll(a.path(d), 0o755))
	}
	events, err := a.c.Watch(ctxT(t), "w", debounce)
	require.NoError(t, err)
	return a, events
}

func TestWatch(t *testing.T) {
	a, events := watching(t, 20*time.Millisecond, "w/sub")
	ctx := ctxT(t)

	collect := func(until func(map[string]string) bool) map[string]string {
		seen := map[string]string{}
		timeout := time.After(5 * time.Second)
		for !until(seen) {
			select {
			case batch, ok := <-events:
				require.True(t, ok, "watch stream closed")
				for _, e := range batch {
					seen[e.Path] = e.Op
					assert.False(t, e.Time.IsZero())
				}
			case <-timeout:
				t.Fatalf("watch: saw only %v", seen)
			}
		}
		return seen
	}

	require.NoError(t, os.WriteFile(a.path("w/a.txt"), []byte("1"), 0o644))
	seen := collect(func(m map[string]string) bool { return m[a.path("w/a.txt")] != "" })
	assert.Equal(t, "create", seen[a.path("w/a.txt")], "create then write coalesce into create")

	time.Sleep(50 * time.Millisecond)
	require.NoError(t, os.WriteFile(a.path("w/sub/a.txt"), []byte("2"), 0o644))
	require.NoError(t, os.WriteFile(a.path("w/a.txt"), []byte("3"), 0o644))
	seen = collect(func(m map[string]string) bool { return m[a.path("w/a.txt")] != "" && m[a.path("w/sub/a.txt")] != "" })
	assert.Equal(t, "write", seen[a.path("w/a.txt")])

	// a new directory is watched, and what was made in it before is reported
	require.NoError(t, os.MkdirAll(a.path("w/new/deeper"), 0o755))
	require.NoError(t, os.WriteFile(a.path("w/new/deeper/f"), []byte("x"), 0o644))
	collect(func(m map[string]string) bool { return m[a.path("w/new/deeper/f")] == "create" })
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, os.WriteFile(a.path("w/new/deeper/g"), []byte("x"), 0o644))
	collect(func(m map[string]string) bool { return m[a.path("w/new/deeper/g")] == "create" })

	// git's churn is not reported
	require.NoError(t, os.MkdirAll(a.path("w/.git/objects"), 0o755))
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, os.WriteFile(a.path("w/.git/objects/x"), []byte("x"), 0o644))
	require.NoError(t, os.Remove(a.path("w/a.txt")))
	seen = collect(func(m map[string]string) bool { return m[a.path("w/a.txt")] != "" })
	assert.Equal(t, "remove", seen[a.path("w/a.txt")])
	assert.NotContains(t, seen, a.path("w/.git/objects/x"))
	assert.NotContains(t, seen, a.path("w/.git"))

	_, err := a.c.Watch(ctx, "w/sub/a.txt", 0)
	requireCode(t, err, CodeNotDir)
}

// TestWatchWaitsForAWholeFile: a file written in pieces, each soon after
// the one before, is reported once its writer is done — a reader of the
// event (a sandbox node's output) reads it whole, not its first piece.
// Without a quiet tree the batch went one debounce after the first piece.
func TestWatchWaitsForAWholeFile(t *testing.T) {
	// A debounce far longer than the pauses between pieces, even on a
	// loaded machine, and shorter than the whole write.
	const debounce = 200 * time.Millisecond
	a, events := watching(t, debounce)

	var done atomic.Bool
	go func() {
		f, err := os.Create(a.path("w/out.json"))
		if !assert.NoError(t, err) {
			return
		}
		for i := range 60 {
			fmt.Fprintf(f, "%q,", strconv.Itoa(i))
			time.Sleep(5 * time.Millisecond)
		}
		f.Close()
		done.Store(true)
	}()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case batch, ok := <-events:
			require.True(t, ok, "watch stream closed")
			for _, e := range batch {
				if e.Path == a.path("w/out.json") {
					assert.True(t, done.Load(), "the file was reported while it was being written")
					return
				}
			}
		case <-timeout:
			t.Fatal("the file was never reported")
		}
	}
}

// TestWatchReportsAFileWrittenWithoutPause: a tree that is never still
// (a log written without pause) is still reported, ten debounces after the
// batch's first event at most — not once the writer stops.
func TestWatchReportsAFileWrittenWithoutPause(t *testing.T) {
	a, events := watching(t, 100*time.Millisecond)

	var stop, stopped atomic.Bool
	go func() {
		defer stopped.Store(true)
		f, err := os.Create(a.path("w/log"))
		if !assert.NoError(t, err) {
			return
		}
		defer f.Close()
		for deadline := time.Now().Add(10 * time.Second); !stop.Load() && time.Now().Before(deadline); {
			f.WriteString("x\n")
			time.Sleep(time.Millisecond)
		}
	}()
	defer stop.Store(true)
	select {
	case batch, ok := <-events:
		require.True(t, ok, "watch stream closed")
		require.NotEmpty(t, batch)
		assert.False(t, stopped.Load(), "reported only once the writer stopped")
	case <-time.After(30 * time.Second):
		t.Fatal("nothing reported")
	}
}

func TestWatchEndsWithContext(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := cancelCtx(t)
	events, err := a.c.Watch(ctx, "", 0)
	require.NoError(t, err)
	cancel()
	select {
	case _, ok := <-events:
		for ok {
			_, ok = <-events
		}
	case <-time.After(5 * time.Second):
		t.Fatal("watch channel not closed after cancel")
	}
}

func TestDialPort(t *testing.T) {
	a := startAgent(t)
	ctx := ctxT(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c) // echo until the client half-closes
			}()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port

	conn, err := a.c.DialPort(ctx, port)
	require.NoError(t, err)
	defer conn.Close()
	payload := bytes.Repeat([]byte("echo! "), 100000)
	go func() {
		conn.Write(payload)
		conn.(interface{ CloseWrite() error }).CloseWrite()
	}()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(conn)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(payload, got), "echoed %d of %d bytes", len(got), len(payload))

	// an HTTP server through the tunnel, as the preview proxy uses it
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello from the box") })}
	hln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go hs.Serve(hln)
	defer hs.Close()
	conn2, err := a.c.DialPort(ctx, hln.Addr().(*net.TCPAddr).Port)
	require.NoError(t, err)
	defer conn2.Close()
	io.WriteString(conn2, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn2), nil)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	assert.Equal(t, "hello from the box", string(body))

	// nothing listening
	ln2, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := ln2.Addr().(*net.TCPAddr).Port
	ln2.Close()
	_, err = a.c.DialPort(ctx, closed)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "connection refused")
	_, err = a.c.DialPort(ctx, 70000)
	requireCode(t, err, CodeInvalid)
}

func TestProtocolMismatch(t *testing.T) {
	dir, err := os.MkdirTemp("", "cbag")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	for _, tt := range []struct {
		header string
		got    int
		msg    string
	}{
		{"1", 1, fmt.Sprintf("agent speaks protocol 1, host expects %d: restart the box to run this host's agent", ProtocolVersion)},
		{"", 0, fmt.Sprintf("agent sent no valid Cellbox-Agent-Protocol header: not a cellbox agent or too old (host expects protocol %d): restart the box to run this host's agent", ProtocolVersion)},
	} {
		sock := filepath.Join(dir, "s"+tt.header+".sock")
		ln, err := net.Listen("unix", sock)
		require.NoError(t, err)
		hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if tt.header != "" {
				w.Header().Set(ProtocolHeader, tt.header)
			}
			fmt.Fprintf(w, `{"protocol":%d}`, ProtocolVersion)
		})}
		go hs.Serve(ln)
		c := Dial(sock)
		_, err = c.Version(ctxT(t))
		var pe *ProtocolError
		require.True(t, errors.As(err, &pe), "%v", err)
		assert.Equal(t, tt.got, pe.Got)
		assert.EqualError(t, err, tt.msg)
		require.ErrorAs(t, c.WaitReady(ctxT(t)), &pe, "WaitReady gives up at once")
		_, err = c.DialPort(ctxT(t), 80)
		require.ErrorAs(t, err, &pe)
		c.Close()
		hs.Close()
	}
}

func TestSocketMustBeASocket(t *testing.T) {
	a := startAgent(t)
	dir, err := os.MkdirTemp("", "cbag")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	link := filepath.Join(dir, "agent.sock")
	require.NoError(t, os.Symlink(a.socket, link))
	_, err = Dial(link).Version(ctxT(t))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is not a unix socket")

	_, err = Dial(filepath.Join(dir, "missing.sock")).Version(ctxT(t))
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestStaleSocketIsReplaced(t *testing.T) {
	a := startAgent(t)
	// A second agent on the same socket path replaces the first's socket.
	ctx, cancel := cancelCtx(t)
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, Options{Socket: a.socket, Workspace: a.workspace, AllowedRoots: []string{a.workspace}})
	}()
	require.NoError(t, Dial(a.socket).WaitReady(ctxT(t)))
	cancel()
	require.NoError(t, <-done)

	// a regular file in the way is not removed
	f := filepath.Join(filepath.Dir(a.socket), "file.sock")
	require.NoError(t, os.WriteFile(f, []byte("x"), 0o644))
	err := Serve(ctxT(t), Options{Socket: f, Workspace: a.workspace})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is not a socket")
}

// A sparse file goes through a tar stream as its data only (the stream
// is as small as the data, not the file: a 1 GiB file of holes took 6-8 s
// to snapshot) and comes out with the same size, bytes and holes.
func TestTarSparseFile(t *testing.T) {
	a := startAgent(t)
	ctx := ctxT(t)
	const size = 1 << 30
	f, err := os.Create(a.path("disk.img"))
	require.NoError(t, err)
	data := bytes.Repeat([]byte("cellbox"), 1000)
	for _, off := range []int64{4096, 512 << 20, size - int64(len(data))} {
		_, err := f.WriteAt(data, off)
		require.NoError(t, err)
	}
	require.NoError(t, f.Close())

	var buf bytes.Buffer
	_, err = a.c.TarOut(ctx, "disk.img", &buf)
	require.NoError(t, err)
	assert.Less(t, buf.Len(), 1<<20, "the stream holds the data, not the holes")
	h, err := tar.NewReader(bytes.NewReader(buf.Bytes())).Next()
	require.NoError(t, err)
	m, ok, err := SparseOf(h)
	require.NoError(t, err)
	require.True(t, ok, "a sparse entry")
	assert.EqualValues(t, size, m.Size)

	_, err = a.c.TarIn(ctx, filepath.Join(a.tmp, "copy"), bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	got := filepath.Join(a.tmp, "copy", "disk.img")
	fi, err := os.Stat(got)
	require.NoError(t, err)
	assert.EqualValues(t, size, fi.Size())
	assert.Less(t, fi.Sys().(*syscall.Stat_t).Blocks*512, int64(1<<20), "the holes are holes again")
	g, err := os.Open(got)
	require.NoError(t, err)
	defer g.Close()
	for _, off := range []int64{4096, 512 << 20, size - int64(len(data)), 100 << 20} {
		want := data
		if off == 100<<20 {
			want = make([]byte, len(data))
		}
		b := make([]byte, len(data))
		_, err := g.ReadAt(b, off)
		require.NoError(t, err)
		assert.True(t, bytes.Equal(want, b), "the bytes at %d", off)
	}

	// A hostile map (a box's tar stream) is refused, not followed.
	var bad bytes.Buffer
	tw := tar.NewWriter(&bad)
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "evil", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4,
		PAXRecords: map[string]string{PAXSparseSize: "100", PAXSparseMap: "98+4"}}))
	tw.Write([]byte("evil"))
	require.NoError(t, tw.Close())
	_, err = a.c.TarIn(ctx, filepath.Join(a.tmp, "evil"), &bad)
	e := requireCode(t, err, CodeInvalid)
	assert.Contains(t, e.Message, "sparse map")
}
