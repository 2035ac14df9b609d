package agent

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func numbered(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	return b.String()
}

func TestReadFile(t *testing.T) {
	a := startAgent(t)
	write := func(name, content string) {
		require.NoError(t, os.WriteFile(a.path(name), []byte(content), 0o644))
	}
	write("ten.txt", numbered(10))
	write("big.txt", numbered(5000))
	write("nonl.txt", "a\nb")
	write("crlf.txt", "a\r\nb\r\n")
	write("empty.txt", "")
	long := strings.Repeat("é", MaxReadLineChars+10)
	write("longline.txt", "short\n"+long+"\nend\n")

	tests := []struct {
		name string
		req  ReadRequest
		want ReadResult
	}{
		{"whole", ReadRequest{Path: "ten.txt"},
			ReadResult{Content: numbered(10), Encoding: "utf-8", Size: int64(len(numbered(10))), TotalLines: 10, StartLine: 1, EndLine: 10}},
		{"window", ReadRequest{Path: "ten.txt", Offset: 3, Limit: 2},
			ReadResult{Content: "line 3\nline 4\n", Encoding: "utf-8", Size: int64(len(numbered(10))), TotalLines: 10, StartLine: 3, EndLine: 4, NextOffset: 5}},
		{"window to the end", ReadRequest{Path: "ten.txt", Offset: 9, Limit: 5},
			ReadResult{Content: "line 9\nline 10\n", Encoding: "utf-8", Size: int64(len(numbered(10))), TotalLines: 10, StartLine: 9, EndLine: 10}},
		{"absolute path", ReadRequest{Path: a.path("ten.txt"), Offset: 10},
			ReadResult{Content: "line 10\n", Encoding: "utf-8", Size: int64(len(numbered(10))), TotalLines: 10, StartLine: 10, EndLine: 10}},
		{"line cap", ReadRequest{Path: "big.txt"},
			ReadResult{Content: numbered(2000), Encoding: "utf-8", Size: int64(len(numbered(5000))), TotalLines: 5000, StartLine: 1, EndLine: 2000, NextOffset: 2001, Truncated: true}},
		{"byte cap", ReadRequest{Path: "big.txt", MaxBytes: 20},
			ReadResult{Content: "line 1\nline 2\n", Encoding: "utf-8", Size: int64(len(numbered(5000))), TotalLines: 5000, StartLine: 1, EndLine: 2, NextOffset: 3, Truncated: true}},
		{"no final newline", ReadRequest{Path: "nonl.txt"},
			ReadResult{Content: "a\nb", Encoding: "utf-8", Size: 3, TotalLines: 2, StartLine: 1, EndLine: 2}},
		{"crlf kept", ReadRequest{Path: "crlf.txt", Offset: 2},
			ReadResult{Content: "b\r\n", Encoding: "utf-8", Size: 6, TotalLines: 2, StartLine: 2, EndLine: 2}},
		{"empty", ReadRequest{Path: "empty.txt"},
			ReadResult{Content: "", Encoding: "utf-8"}},
		{"long line cut", ReadRequest{Path: "longline.txt"},
			ReadResult{Content: "short\n" + strings.Repeat("é", MaxReadLineChars) + LineCutMarker + "\nend\n", Encoding: "utf-8", Size: int64(len(long) + 11), TotalLines: 3, StartLine: 1, EndLine: 3, Truncated: true}},
		{"byte range", ReadRequest{Path: "ten.txt", ByteOffset: 7, ByteLimit: 6},
			ReadResult{Content: "line 2", Encoding: "utf-8", Size: int64(len(numbered(10)))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := a.c.ReadFile(ctxT(t), tt.req)
			require.NoError(t, err)
			assert.Equal(t, tt.want, res)
		})
	}

	t.Run("past the end", func(t *testing.T) {
		_, err := a.c.ReadFile(ctxT(t), ReadRequest{Path: "ten.txt", Offset: 11})
		e := requireCode(t, err, CodeInvalid)
		assert.Contains(t, e.Message, "offset 11 is past the end of the file (10 lines)")
	})
	t.Run("directory", func(t *testing.T) {
		_, err := a.c.ReadFile(ctxT(t), ReadRequest{Path: "."})
		requireCode(t, err, CodeIsDir)
	})
	t.Run("missing", func(t *testing.T) {
		_, err := a.c.ReadFile(ctxT(t), ReadRequest{Path: "missing.txt"})
		e := requireCode(t, err, CodeNotFound)
		assert.Equal(t, "read "+a.path("missing.txt")+": no such file or directory", e.Message)
	})
}

func TestReadBinary(t *testing.T) {
	a := startAgent(t)
	bin := []byte{0x7f, 'E', 'L', 'F', 0, 1, 2, 0xff, '\n', 3}
	require.NoError(t, os.WriteFile(a.path("bin"), bin, 0o755))
	latin1 := []byte("caf\xe9\n")
	require.NoError(t, os.WriteFile(a.path("latin1"), latin1, 0o644))
	big := bytes.Repeat([]byte{0}, 300<<10)
	require.NoError(t, os.WriteFile(a.path("zeros"), big, 0o644))

	res, err := a.c.ReadFile(ctxT(t), ReadRequest{Path: "bin"})
	require.NoError(t, err)
	assert.Equal(t, "base64", res.Encoding)
	got, err := base64.StdEncoding.DecodeString(res.Content)
	require.NoError(t, err)
	assert.Equal(t, bin, got)
	assert.False(t, res.Truncated)

	res, err = a.c.ReadFile(ctxT(t), ReadRequest{Path: "latin1"})
	require.NoError(t, err)
	assert.Equal(t, "base64", res.Encoding, "invalid UTF-8 is binary")

	res, err = a.c.ReadFile(ctxT(t), ReadRequest{Path: "zeros"})
	require.NoError(t, err)
	assert.Equal(t, "base64", res.Encoding)
	assert.True(t, res.Truncated)
	got, _ = base64.StdEncoding.DecodeString(res.Content)
	assert.Len(t, got, DefaultReadBytes)

	res, err = a.c.ReadFile(ctxT(t), ReadRequest{Path: "zeros", ByteOffset: 300<<10 - 10, ByteLimit: 100})
	require.NoError(t, err)
	got, _ = base64.StdEncoding.DecodeString(res.Content)
	assert.Len(t, got, 10)
	assert.False(t, res.Truncated)
}

func TestWriteFile(t *testing.T) {
	a := startAgent(t)
	ctx := ctxT(t)
	res, err := a.c.WriteFile(ctx, WriteRequest{Path: "deep/new/file.txt", Data: []byte("one\n")})
	require.NoError(t, err)
	assert.Equal(t, WriteResult{Path: a.path("deep/new/file.txt"), Size: 4, Created: true}, res)
	fi, err := os.Stat(a.path("deep/new/file.txt"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o644), fi.Mode().Perm())

	// an existing file keeps its mode
	require.NoError(t, os.Chmod(a.path("deep/new/file.txt"), 0o750))
	res, err = a.c.WriteFile(ctx, WriteRequest{Path: "deep/new/file.txt", Data: []byte("two\n"), Mode: 0o600})
	require.NoError(t, err)
	assert.False(t, res.Created)
	fi, err = os.Stat(a.path("deep/new/file.txt"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o750), fi.Mode().Perm())

	res, err = a.c.WriteFile(ctx, WriteRequest{Path: "deep/new/file.txt", Data: []byte("three\n"), Append: true})
	require.NoError(t, err)
	assert.Equal(t, int64(10), res.Size)
	b, _ := os.ReadFile(a.path("deep/new/file.txt"))
	assert.Equal(t, "two\nthree\n", string(b))

	res, err = a.c.WriteFile(ctx, WriteRequest{Path: "script.sh", Data: []byte("#!/bin/sh\n"), Mode: 0o755})
	require.NoError(t, err)
	fi, _ = os.Stat(a.path("script.sh"))
	assert.Equal(t, os.FileMode(0o755), fi.Mode().Perm())

	// no temp files left behind
	ents, _ := os.ReadDir(a.path("deep/new"))
	assert.Len(t, ents, 1)

	_, err = a.c.WriteFile(ctx, WriteRequest{Path: "huge", Data: make([]byte, DefaultWriteBytes+1)})
	e := requireCode(t, err, CodeTooLarge)
	assert.Contains(t, e.Message, "write it in chunks with append, or upload it")
	_, err = os.Stat(a.path("huge"))
	assert.True(t, os.IsNotExist(err), "a rejected write creates nothing")

	_, err = a.c.WriteFile(ctx, WriteRequest{Path: "deep", Data: []byte("x")})
	requireCode(t, err, CodeIsDir)

	// writing through a symlink that stays inside writes the target
	require.NoError(t, os.Symlink("script.sh", a.path("link.sh")))
	_, err = a.c.WriteFile(ctx, WriteRequest{Path: "link.sh", Data: []byte("#!/bin/bash\n")})
	require.NoError(t, err)
	b, _ = os.ReadFile(a.path("script.sh"))
	assert.Equal(t, "#!/bin/bash\n", string(b))
	fi, _ = os.Lstat(a.path("link.sh"))
	assert.NotZero(t, fi.Mode()&os.ModeSymlink, "the symlink stays a symlink")

	// the second allowed root works
	_, err = a.c.WriteFile(ctx, WriteRequest{Path: filepath.Join(a.tmp, "x"), Data: []byte("x")})
	require.NoError(t, err)
}

func TestScope(t *testing.T) {
	a := startAgent(t)
	ctx := ctxT(t)
	secret := filepath.Join(a.outside, "secret")
	require.NoError(t, os.Symlink(secret, a.path("link-file")))
	require.NoError(t, os.Symlink(a.outside, a.path("link-dir")))
	require.NoError(t, os.Symlink("../outside/nope", a.path("dangling")))
	escapes := []string{
		"../outside/secret",
		a.path("../outside/secret"),
		"sub/../../outside/secret",
		secret,
		"/etc/passwd",
		"link-file",
		"link-dir/secret",
		"link-dir/new-file",
		"dangling",
	}
	for _, p := range escapes {
		t.Run(p, func(t *testing.T) {
			_, err := a.c.ReadFile(ctx, ReadRequest{Path: p})
			e := requireCode(t, err, CodeOutsideWorkspace)
			assert.Contains(t, e.Message, "outside the workspace")
			_, err = a.c.WriteFile(ctx, WriteRequest{Path: p, Data: []byte("pwned")})
			requireCode(t, err, CodeOutsideWorkspace)
			_, err = a.c.WriteFile(ctx, WriteRequest{Path: p, Data: []byte("pwned"), Append: true})
			requireCode(t, err, CodeOutsideWorkspace)
			_, err = a.c.Upload(ctx, p, strings.NewReader("pwned"), 0)
			requireCode(t, err, CodeOutsideWorkspace)
			_, err = a.c.Download(ctx, p, &bytes.Buffer{})
			requireCode(t, err, CodeOutsideWorkspace)
			_, err = a.c.TarOut(ctx, p, &bytes.Buffer{})
			requireCode(t, err, CodeOutsideWorkspace)
			_, _, err = a.c.Tree(ctx, p, 1, 0)
			requireCode(t, err, CodeOutsideWorkspace)
		})
	}
	b, _ := os.ReadFile(secret)
	assert.Equal(t, "top secret\n", string(b))
	_, err := os.Stat(filepath.Join(a.outside, "new-file"))
	assert.True(t, os.IsNotExist(err))

	e := requireCode(t, func() error { _, err := a.c.ReadFile(ctx, ReadRequest{Path: "link-file"}); return err }(), CodeOutsideWorkspace)
	assert.Equal(t, fmt.Sprintf("read %s: resolves to %s, outside the workspace; file tools may only use %s and %s", a.path("link-file"), secret, a.workspace, a.tmp), e.Message)

	// Removing the symlink itself is fine and leaves the target alone.
	require.NoError(t, a.c.Remove(ctx, "link-file", false))
	_, err = os.Stat(secret)
	require.NoError(t, err)
	// Stat describes the link, not the target.
	fi, err := a.c.Stat(ctx, "link-dir")
	require.NoError(t, err)
	assert.Equal(t, "symlink", fi.Type)

	// Grep and glob over the workspace do not follow the links out.
	gr, err := a.c.Grep(ctx, GrepRequest{Pattern: "secret"})
	require.NoError(t, err)
	assert.Empty(t, gr.Hits)
	_, err = a.c.Grep(ctx, GrepRequest{Pattern: "secret", Path: "link-dir"})
	requireCode(t, err, CodeOutsideWorkspace)
	// A link is listed as itself, never walked into, whichever way the
	// pattern reaches it (a wildcard, an alternative, a literal after one).
	for _, p := range []string{"**/secret", "*/secret", "{link-dir,x}/*", "l*/secret", "*/../link-dir/secret", "**"} {
		paths, _, err := a.c.Glob(ctx, p, "", 0)
		require.NoError(t, err, p)
		assert.NotContains(t, paths, a.path("link-dir/secret"), p)
		for _, q := range paths {
			assert.NotContains(t, q, "secret", p)
		}
	}
	paths, _, err := a.c.Glob(ctx, "{link-*,dangling}", "", 0)
	require.NoError(t, err)
	assert.Equal(t, []string{a.path("dangling"), a.path("link-dir")}, paths)
	_, _, err = a.c.Glob(ctx, "link-dir/*", "", 0)
	requireCode(t, err, CodeOutsideWorkspace)
	_, _, err = a.c.Glob(ctx, "../outside/*", "", 0)
	requireCode(t, err, CodeOutsideWorkspace)
	require.Error(t, a.c.Mkdir(ctx, "link-dir/sub"))
	requireCode(t, a.c.Remove(ctx, "link-dir/secret", false), CodeOutsideWorkspace)
	requireCode(t, a.c.Remove(ctx, a.workspace, true), CodeInvalid)
	_, err = a.c.Watch(ctx, a.outside, 0)
	requireCode(t, err, CodeOutsideWorkspace)
}

func TestStatMkdirRemove(t *testing.T) {
	a := startAgent(t)
	ctx := ctxT(t)
	require.NoError(t, a.c.Mkdir(ctx, "a/b/c"))
	require.NoError(t, a.c.Mkdir(ctx, "a/b/c"), "mkdir -p of an existing dir is fine")
	fi, err := a.c.Stat(ctx, "a/b")
	require.NoError(t, err)
	assert.Equal(t, "dir", fi.Type)
	assert.Equal(t, a.path("a/b"), fi.Path)
	_, err = a.c.WriteFile(ctx, WriteRequest{Path: "a/f", Data: []byte("hello")})
	require.NoError(t, err)
	fi, err = a.c.Stat(ctx, "a/f")
	require.NoError(t, err)
	assert.Equal(t, "file", fi.Type)
	assert.Equal(t, int64(5), fi.Size)
	assert.Equal(t, uint32(0o644), fi.Mode)

	requireCode(t, a.c.Mkdir(ctx, "a/f"), CodeExists)
	requireCode(t, a.c.Mkdir(ctx, "a/f/g"), CodeNotDir)
	e := requireCode(t, a.c.Remove(ctx, "a", false), CodeInvalid)
	assert.Contains(t, e.Message, "not empty")
	require.NoError(t, a.c.Remove(ctx, "a", true))
	_, err = a.c.Stat(ctx, "a")
	requireCode(t, err, CodeNotFound)
	requireCode(t, a.c.Remove(ctx, "a", true), CodeNotFound)
}

func TestUploadDownload(t *testing.T) {
	a := startAgent(t)
	ctx := ctxT(t)
	data := bytes.Repeat([]byte("0123456789abcdef\x00\xff"), 1<<18) // 4.5 MiB, binary
	n, err := a.c.Upload(ctx, "up/data.bin", bytes.NewReader(data), 0o600)
	require.NoError(t, err)
	assert.Equal(t, int64(len(data)), n)
	fi, err := os.Stat(a.path("up/data.bin"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	var buf bytes.Buffer
	n, err = a.c.Download(ctx, "up/data.bin", &buf)
	require.NoError(t, err)
	assert.Equal(t, int64(len(data)), n)
	assert.True(t, bytes.Equal(data, buf.Bytes()))

	_, err = a.c.Download(ctx, "up", &buf)
	requireCode(t, err, CodeIsDir)
	_, err = a.c.Download(ctx, "missing", &buf)
	requireCode(t, err, CodeNotFound)
}

func TestTree(t *testing.T) {
	a := startAgent(t)
	ctx := ctxT(t)
	for _, f := range []string{"src/main.go", "src/lib/util.go", "src/lib/deep/x.go", "README.md", "b/c.txt"} {
		_, err := a.c.WriteFile(ctx, WriteRequest{Path: f, Data: []byte("x")})
		require.NoError(t, err)
	}
	root, truncated, err := a.c.Tree(ctx, "", 2, 0)
	require.NoError(t, err)
	assert.False(t, truncated)
	want := TreeEntry{Path: a.workspace, Type: "dir", Children: []TreeEntry{
		{Path: a.path("README.md"), Type: "file", Size: 1},
		{Path: a.path("b"), Type: "dir", Children: []TreeEntry{{Path: a.path("b/c.txt"), Type: "file", Size: 1}}},
		{Path: a.path("src"), Type: "dir", Children: []TreeEntry{
			{Path: a.path("src/lib"), Type: "dir"},
			{Path: a.path("src/main.go"), Type: "file", Size: 1},
		}},
	}}
	assert.Equal(t, want, root)

	root, truncated, err = a.c.Tree(ctx, "", 5, 4)
	require.NoError(t, err)
	assert.True(t, truncated)
	assert.Len(t, root.Children, 3)

	_, _, err = a.c.Tree(ctx, "nope", 2, 0)
	requireCode(t, err, CodeNotFound)
}

func TestGlob(t *testing.T) {
	a := startAgent(t)
	ctx := ctxT(t)
	for _, f := range []string{"main.go", "src/a.go", "src/a_test.go", "src/lib/b.go", "src/lib/c.ts", "web/x.tsx", "web/y.ts", ".git/config.go", ".hidden.go"} {
		_, err := a.c.WriteFile(ctx, WriteRequest{Path: f, Data: []byte("x")})
		require.NoError(t, err)
	}
	abs := func(ps ...string) []string {
		for i := range ps {
			ps[i] = a.path(ps[i])
		}
		return ps
	}
	tests := []struct {
		pattern, cwd string
		want         []string
	}{
		{"*.go", "", abs(".hidden.go", "main.go")},
		{"**/*.go", "", abs(".hidden.go", "main.go", "src/a.go", "src/a_test.go", "src/lib/b.go")},
		{"src/**/*.go", "", abs("src/a.go", "src/a_test.go", "src/lib/b.go")},
		{"src/*.go", "", abs("src/a.go", "src/a_test.go")},
		{"**/*_test.go", "", abs("src/a_test.go")},
		{"**/*.{ts,tsx}", "", abs("src/lib/c.ts", "web/x.tsx", "web/y.ts")},
		{"*.ts", "web", abs("web/y.ts")},
		{a.path("src/lib/?.go"), "", abs("src/lib/b.go")},
		{"src/a.go", "", abs("src/a.go")},
		{"**/nothing", "", []string{}},
		{".git/*", "", abs(".git/config.go")},
	}
	for _, tt := range tests {
		t.Run(tt.pattern, func(t *testing.T) {
			got, truncated, err := a.c.Glob(ctx, tt.pattern, tt.cwd, 0)
			require.NoError(t, err)
			assert.False(t, truncated)
			assert.Equal(t, tt.want, got)
		})
	}
	got, truncated, err := a.c.Glob(ctx, "**/*.go", "", 2)
	require.NoError(t, err)
	assert.True(t, truncated)
	assert.Len(t, got, 2)
	_, _, err = a.c.Glob(ctx, "src/[a.go", "", 0)
	requireCode(t, err, CodeInvalid)
	_, _, err = a.c.Glob(ctx, "{a,b", "", 0)
	requireCode(t, err, CodeInvalid)
	// doublestar walks every combination of {a,b} groups: 2^30 would take
	// hours, so more than 256 patterns are refused up front.
	many := strings.Repeat("{a,b}", 30) + "/x"
	_, _, err = a.c.Glob(ctx, many, "", 0)
	e := requireCode(t, err, CodeInvalid)
	assert.Contains(t, e.Message, "expands to more than 256 patterns")
	_, err = a.c.Grep(ctx, GrepRequest{Pattern: "x", Glob: many})
	requireCode(t, err, CodeInvalid)

	// A working directory whose name holds glob syntax is taken literally.
	_, err = a.c.WriteFile(ctx, WriteRequest{Path: "lit[1]{x,y}/f.go", Data: []byte("x")})
	require.NoError(t, err)
	_, err = a.c.WriteFile(ctx, WriteRequest{Path: "lit1x/g.go", Data: []byte("x")})
	require.NoError(t, err)
	got, _, err = a.c.Glob(ctx, "*.go", "lit[1]{x,y}", 0)
	require.NoError(t, err)
	assert.Equal(t, abs("lit[1]{x,y}/f.go"), got)
}

func TestGrep(t *testing.T) {
	a := startAgent(t)
	ctx := ctxT(t)
	files := map[string]string{
		"src/a.go":     "package a\nfunc Hello() {}\n// hello world\n",
		"src/b.ts":     "export const hello = 1;\n",
		"docs/x.md":    "Hello, docs\n",
		".git/HEAD":    "hello from git\n",
		"bin/tool":     "hello\x00binary",
		"many.txt":     strings.Repeat("match me\n", 300),
		"regex.txt":    "a1b22c333\n",
		"long/one.txt": strings.Repeat("x", 5000) + "needle" + strings.Repeat("y", 5000) + "\n",
	}
	for f, c := range files {
		_, err := a.c.Upload(ctx, f, strings.NewReader(c), 0)
		require.NoError(t, err)
	}
	hit := func(p string, line int, text string) GrepHit { return GrepHit{Path: a.path(p), Line: line, Text: text} }
	tests := []struct {
		name string
		req  GrepRequest
		want []GrepHit
	}{
		{"literal", GrepRequest{Pattern: "Hello"}, []GrepHit{hit("docs/x.md", 1, "Hello, docs"), hit("src/a.go", 2, "func Hello() {}")}},
		{"ignore case", GrepRequest{Pattern: "hello", IgnoreCase: true, Path: "src"}, []GrepHit{hit("src/a.go", 2, "func Hello() {}"), hit("src/a.go", 3, "// hello world"), hit("src/b.ts", 1, "export const hello = 1;")}},
		{"literal is not a regex", GrepRequest{Pattern: "Hello()"}, []GrepHit{hit("src/a.go", 2, "func Hello() {}")}},
		{"regex", GrepRequest{Pattern: `\d{3}`, Regex: true}, []GrepHit{hit("regex.txt", 1, "a1b22c333")}},
		{"glob on base name", GrepRequest{Pattern: "hello", IgnoreCase: true, Glob: "*.ts"}, []GrepHit{hit("src/b.ts", 1, "export const hello = 1;")}},
		{"glob on path", GrepRequest{Pattern: "hello", IgnoreCase: true, Glob: "docs/**"}, []GrepHit{hit("docs/x.md", 1, "Hello, docs")}},
		{"single file", GrepRequest{Pattern: "hello", Path: "src/b.ts"}, []GrepHit{hit("src/b.ts", 1, "export const hello = 1;")}},
		{"long line excerpt", GrepRequest{Pattern: "needle", MaxLineBytes: 40}, []GrepHit{hit("long/one.txt", 1, "…"+strings.Repeat("x", 10)+"needle"+strings.Repeat("y", 24)+"…")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := a.c.Grep(ctx, tt.req)
			require.NoError(t, err)
			assert.Equal(t, tt.want, res.Hits)
			assert.False(t, res.Truncated)
		})
	}
	res, err := a.c.Grep(ctx, GrepRequest{Pattern: "match me"})
	require.NoError(t, err)
	assert.Len(t, res.Hits, DefaultGrepHits)
	assert.True(t, res.Truncated)

	res, err = a.c.Grep(ctx, GrepRequest{Pattern: "nothing matches this"})
	require.NoError(t, err)
	assert.Empty(t, res.Hits)
	assert.Equal(t, 6, res.FilesSearched, "binary files and .git are skipped")

	_, err = a.c.Grep(ctx, GrepRequest{Pattern: "(", Regex: true})
	e := requireCode(t, err, CodeInvalid)
	assert.Contains(t, e.Message, "bad regular expression")
	_, err = a.c.Grep(ctx, GrepRequest{Pattern: ""})
	requireCode(t, err, CodeInvalid)
}

// TestSpecialFilesRefused: opening a FIFO waits for a writer (or reader), so
// read_file, write (append), download and grep of one used to hang the
// request forever. They are refused at once with a clear error.
func TestSpecialFilesRefused(t *testing.T) {
	a := startAgent(t)
	require.NoError(t, syscall.Mkfifo(a.path("fifo"), 0o644))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tests := []struct {
		name string
		op   func() error
	}{
		{"read", func() error { _, err := a.c.ReadFile(ctx, ReadRequest{Path: "fifo"}); return err }},
		{"read bytes", func() error { _, err := a.c.ReadFile(ctx, ReadRequest{Path: "fifo", ByteLimit: 10}); return err }},
		{"append", func() error {
			_, err := a.c.WriteFile(ctx, WriteRequest{Path: "fifo", Data: []byte("x"), Append: true})
			return err
		}},
		{"download", func() error { _, err := a.c.Download(ctx, "fifo", io.Discard); return err }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.op()
			var ae *Error
			require.ErrorAs(t, err, &ae)
			assert.Equal(t, CodeInvalid, ae.Code)
			assert.Contains(t, ae.Message, "named pipe (FIFO), not a regular file")
		})
	}
	res, err := a.c.Grep(ctx, GrepRequest{Pattern: "x", Path: "fifo"})
	require.NoError(t, err, "grep skips the FIFO")
	assert.Zero(t, res.FilesSearched)
}

// TestReadCountsTheLinesLeft: after its window, a read counts the file's
// remaining lines in bulk; the count is the same as line by line, however
// the file ends (a line longer than the read buffer included).
func TestReadCountsTheLinesLeft(t *testing.T) {
	a := startAgent(t)
	huge := strings.Repeat("h", 200<<10)
	for _, tc := range []struct {
		name, content string
		lines         int
	}{
		{"newline at the end", "a\nb\nc\n", 3},
		{"no newline at the end", "a\nb\nc", 3},
		{"crlf and empty lines", "a\r\n\r\n\n\nb", 5},
		{"a huge line in the middle", "a\nb\n" + huge + "\nc\n", 4},
		{"a huge last line", "a\nb\n" + huge, 3},
		{"the window's line ends the file", "a\nb", 2},
	} {
		require.NoError(t, os.WriteFile(a.path("f.txt"), []byte(tc.content), 0o644))
		res, err := a.c.ReadFile(ctxT(t), ReadRequest{Path: "f.txt", Limit: 1})
		require.NoError(t, err, tc.name)
		assert.Equal(t, tc.lines, res.TotalLines, tc.name)
		assert.Equal(t, "a", strings.TrimRight(res.Content, "\r\n"), tc.name)
		assert.Equal(t, 2, res.NextOffset, tc.name)
	}
}

// TestWriteAnnouncesItsLength: a write's body goes with its length, so
// the agent reads it into one buffer of that size (not chunked, grown by
// doubling as it comes).
func TestWriteAnnouncesItsLength(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "a.sock")
	l, err := net.Listen("unix", sock)
	require.NoError(t, err)
	var got int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.ContentLength
		io.Copy(io.Discard, r.Body)
		w.Header().Set(ProtocolHeader, strconv.Itoa(ProtocolVersion))
		writeJSON(w, WriteResult{Path: "/workspace/f", Size: r.ContentLength})
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	_, err = Dial(sock).WriteFile(ctxT(t), WriteRequest{Path: "f", Data: make([]byte, 100<<10)})
	require.NoError(t, err)
	assert.EqualValues(t, 100<<10, got)
}

// TestReadsShareNoWindow: reads reuse their window buffers; one read's
// content never shows in the next (big then small, binary then text,
// cut lines and invalid UTF-8 between).
func TestReadsShareNoWindow(t *testing.T) {
	a := startAgent(t)
	files := map[string]string{
		"big.txt":   strings.Repeat(strings.Repeat("b", 99)+"\n", 5000),
		"small.txt": "s\n",
		"bin":       "\x00\x01\x02",
		"long.txt":  strings.Repeat("l", MaxReadLineChars+5) + "\n",
		"bad.txt":   strings.Repeat("x", 10) + "\xff\n",
	}
	for name, content := range files {
		require.NoError(t, os.WriteFile(a.path(name), []byte(content), 0o644))
	}
	want := map[string]string{
		"big.txt":   strings.Repeat(strings.Repeat("b", 99)+"\n", 2000),
		"small.txt": "s\n",
		"bin":       base64.StdEncoding.EncodeToString([]byte("\x00\x01\x02")),
		"long.txt":  strings.Repeat("l", MaxReadLineChars) + LineCutMarker + "\n",
		"bad.txt":   strings.Repeat("x", 10) + "\xff\n",
	}
	for range 3 {
		for _, name := range []string{"big.txt", "small.txt", "bin", "long.txt", "big.txt", "bad.txt", "small.txt"} {
			res, err := a.c.ReadFile(ctxT(t), ReadRequest{Path: name})
			require.NoError(t, err, name)
			if name == "bad.txt" { // not text: sent as bytes
				assert.Equal(t, "base64", res.Encoding, name)
				continue
			}
			assert.Equal(t, want[name], res.Content, name)
		}
	}
}

// TestWritesShareNoBody: writes reuse their body buffers (with reads'
// windows); each file holds exactly its own bytes, a small write after a
// big one and a write over the limit between included.
func TestWritesShareNoBody(t *testing.T) {
	a := startAgent(t)
	big := bytes.Repeat([]byte("B"), 1<<20)
	for range 2 {
		for _, w := range []struct {
			name string
			data []byte
		}{{"big", big}, {"small", []byte("s")}, {"empty", nil}, {"big2", big[:300<<10]}} {
			_, err := a.c.WriteFile(ctxT(t), WriteRequest{Path: w.name, Data: w.data})
			require.NoError(t, err, w.name)
			got, err := os.ReadFile(a.path(w.name))
			require.NoError(t, err)
			assert.Equal(t, len(w.data), len(got), w.name)
			assert.True(t, bytes.Equal(w.data, got), w.name)
			_, err = a.c.ReadFile(ctxT(t), ReadRequest{Path: w.name})
			require.NoError(t, err)
		}
		_, err := a.c.WriteFile(ctxT(t), WriteRequest{Path: "over", Data: big, MaxBytes: 1000})
		requireCode(t, err, CodeTooLarge)
	}
}
