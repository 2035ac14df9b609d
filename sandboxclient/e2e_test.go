package sandboxclient_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/docker"
	"github.com/cellbox/cellbox/sandbox/httpapi"
	"github.com/cellbox/cellbox/sandbox/local"
	"github.com/cellbox/cellbox/sandboxclient"
)

// The service hands out an in-process implementation of Client, which
// also reports image digests (for the exec node's memo key).
var (
	_ sandboxclient.Client        = (*sandbox.LocalClient)(nil)
	_ sandboxclient.ImageDigester = (*sandbox.LocalClient)(nil)
)

// backends are the real backends the end-to-end tests run on.
var backends = []struct {
	name string
	open func(t *testing.T, dataDir string) backend.Backend
}{
	{"local", func(t *testing.T, dataDir string) backend.Backend {
		testenv.RequireBwrap(t)
		be, err := local.New(local.Options{Root: filepath.Join(dataDir, "local"), Logger: quiet()})
		require.NoError(t, err)
		return be
	}},
	{"docker", func(t *testing.T, dataDir string) backend.Backend {
		testenv.RequireDocker(t)
		be, err := docker.New(context.Background(), docker.Options{Logger: quiet()})
		require.NoError(t, err)
		return be
	}},
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// server is a Service on a real backend behind a real HTTP server.
type server struct {
	svc  *sandbox.Service
	url  string
	http *httptest.Server
}

func startServer(t *testing.T, be backend.Backend, dataDir string, mod func(*sandbox.Config)) *server {
	t.Helper()
	cfg := sandbox.Config{
		Backend:     be,
		DataDir:     dataDir,
		AgentBinary: testenv.CellboxBinary(t),
		Pool:        map[string]int{backend.DefaultImage: 1},
		Logger:      quiet(),
	}
	if mod != nil {
		mod(&cfg)
	}
	svc, err := sandbox.New(context.Background(), cfg)
	require.NoError(t, err)
	hs := httptest.NewServer(httpapi.Handler(svc))
	svc.SetBaseURL(hs.URL)
	s := &server{svc: svc, url: hs.URL, http: hs}
	t.Cleanup(s.stop)
	return s
}

func (s *server) stop() {
	s.http.Close()
	s.svc.Close()
}

// newSession makes a session and deletes it (and its boxes) at the end.
func newSession(t *testing.T, s *server) *sandboxclient.HTTP {
	t.Helper()
	c, err := sandboxclient.NewSession(context.Background(), s.url)
	require.NoError(t, err)
	t.Cleanup(func() {
		id, _ := c.Session()
		s.svc.DeleteSession(context.Background(), id)
	})
	return c
}

// call runs a tool that must succeed and decodes its result.
func call(t *testing.T, c sandboxclient.Client, name string, input any) map[string]any {
	t.Helper()
	res, err := c.Tool(context.Background(), name, input)
	require.NoError(t, err, "%s %v", name, input)
	var m map[string]any
	require.NoError(t, json.Unmarshal(res, &m))
	return m
}

// toolErr runs a tool that must fail and returns its message.
func toolErr(t *testing.T, c sandboxclient.Client, name string, input any) string {
	t.Helper()
	_, err := c.Tool(context.Background(), name, input)
	var te *sandboxclient.ToolError
	require.ErrorAs(t, err, &te, "%s %v should fail", name, input)
	return te.Message
}

func TestEndToEnd(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			dir := t.TempDir()
			be := b.open(t, dir)
			s := startServer(t, be, dir, nil)
			c := newSession(t, s)
			ctx := context.Background()

			t.Run("seed 000 multi-sandbox workflow", func(t *testing.T) {
				for _, name := range []string{"frontend", "backend"} {
					out, err := c.CreateBox(ctx, api.SandboxCreateInput{Sandbox: name})
					require.NoError(t, err)
					assert.True(t, out.Created)
				}
				build := call(t, c, "shell", map[string]any{"sandbox": "frontend", "command": "mkdir -p app && cd app && mkdir -p dist/assets && echo '<h1>built</h1><script src=\"assets/app.js\"></script>' > dist/index.html && echo 'console.log(1)' > dist/assets/app.js && echo built"})
				assert.Equal(t, "built\n", build["stdout"])
				call(t, c, "shell", map[string]any{"sandbox": "backend", "command": "mkdir -p /workspace/app"})
				call(t, c, "write_file", map[string]any{"sandbox": "backend", "path": "/workspace/app/main.py", "content": "print('api')\n"})
				tr := call(t, c, "transfer", map[string]any{"from_sandbox": "frontend", "from_path": "/workspace/app/dist", "to_sandbox": "backend", "to_path": "/workspace/app/static", "recursive": true})
				assert.Equal(t, "/workspace/app/static", tr["path"])
				assert.EqualValues(t, len("<h1>built</h1><script src=\"assets/app.js\"></script>\n")+len("console.log(1)\n"), tr["bytes"])
				bg := call(t, c, "shell", map[string]any{"sandbox": "backend", "command": "cd /workspace/app/static && exec python3 -m http.server 8000 --bind 127.0.0.1", "background": true})
				require.NotEmpty(t, bg["process_id"])
				var url string
				require.Eventually(t, func() bool {
					br := call(t, c, "browse", map[string]any{"sandbox": "backend", "port": 8000})
					url, _ = br["url"].(string)
					return br["listening"] == true
				}, 10*time.Second, 50*time.Millisecond)
				require.Regexp(t, `^http://p[0-9a-f]{32}\.localhost:\d+/$`, url, "a preview has its own origin")
				for path, want := range map[string]string{"": "<h1>built</h1>", "assets/app.js": "console.log(1)"} {
					resp, body := testenv.HTTPGet(t, url+path, "")
					assert.Equal(t, 200, resp.StatusCode, path)
					assert.Contains(t, body, want, path)
				}
				k := call(t, c, "process", map[string]any{"sandbox": "backend", "action": "kill", "id": bg["process_id"]})
				assert.Equal(t, false, k["running"])
			})

			t.Run("file tools", func(t *testing.T) {
				call(t, c, "write_file", map[string]any{"path": "src/app.py", "content": "def main():\n    print('hi')\n"})
				e := call(t, c, "edit", map[string]any{"path": "src/app.py", "edits": []map[string]string{{"oldText": "print('hi')", "newText": "print('hello')"}}})
				assert.Contains(t, e["diff"], "+    print('hello')")
				call(t, c, "str_replace", map[string]any{"path": "/workspace/src/app.py", "old_str": "main", "new_str": "run"})
				r := call(t, c, "read_file", map[string]any{"path": "src/app.py"})
				assert.Equal(t, "def run():\n    print('hello')\n", r["content"])
				g := call(t, c, "grep", map[string]any{"pattern": "hello"})
				assert.Equal(t, []any{map[string]any{"path": "/workspace/src/app.py", "line": 2.0, "text": "    print('hello')"}}, g["hits"])
				gl := call(t, c, "glob", map[string]any{"pattern": "**/*.py"})
				assert.Equal(t, []any{"/workspace/src/app.py"}, gl["files"])
				ls := call(t, c, "ls", nil)
				assert.Contains(t, ls["tree"], "└── src/\n    └── app.py (")
			})

			t.Run("bad input loses nothing", func(t *testing.T) {
				call(t, c, "shell", map[string]any{"command": "ln -sf /etc /workspace/etc-link"})
				assert.Contains(t, toolErr(t, c, "read_file", map[string]any{"path": "../etc/passwd"}), "outside the workspace")
				assert.Contains(t, toolErr(t, c, "read_file", map[string]any{"path": "etc-link/passwd"}), "outside the workspace")
				assert.Contains(t, toolErr(t, c, "write_file", map[string]any{"path": "etc-link/evil", "content": "x"}), "outside the workspace")
				y := call(t, c, "shell", map[string]any{"command": "yes", "timeout_ms": 500})
				assert.Equal(t, true, y["timed_out"])
				assert.Equal(t, true, y["truncated"])
				assert.Len(t, y["stdout"], 64<<10)
				line := call(t, c, "shell", map[string]any{"command": "head -c 10000000 /dev/zero | tr '\\0' a; echo; echo done >&2"})
				assert.Equal(t, true, line["truncated"])
				assert.Equal(t, "done\n", line["stderr"])
				ok := call(t, c, "shell", map[string]any{"command": "echo still alive"})
				assert.Equal(t, "still alive\n", ok["stdout"])
			})

			t.Run("streaming exec, upload, download, watch", func(t *testing.T) {
				var mu sync.Mutex
				var chunks []string
				res, err := c.Exec(ctx, "", api.ExecRequest{Command: "echo one; sleep 0.2; echo two >&2; exit 4"}, func(stream string, data []byte) {
					mu.Lock()
					chunks = append(chunks, stream+":"+string(data))
					mu.Unlock()
				})
				require.NoError(t, err)
				assert.Equal(t, 4, res.ExitCode)
				assert.Equal(t, "one\n", res.Stdout)
				assert.Equal(t, []string{"stdout:one\n", "stderr:two\n"}, chunks)

				data := make([]byte, 1<<20)
				rand.Read(data)
				for _, p := range []string{"blobs/a.bin", "/tmp/b.bin"} {
					n, err := c.Upload(ctx, "", p, bytes.NewReader(data))
					require.NoError(t, err)
					assert.EqualValues(t, len(data), n)
					var buf bytes.Buffer
					n, err = c.Download(ctx, "", p, &buf)
					require.NoError(t, err)
					assert.EqualValues(t, len(data), n)
					assert.True(t, bytes.Equal(data, buf.Bytes()), "binary-safe round trip of %s", p)
				}
				_, err = c.Download(ctx, "", "nope.bin", io.Discard)
				var ae *sandboxclient.APIError
				require.ErrorAs(t, err, &ae)
				assert.Equal(t, 404, ae.Status)

				wctx, cancel := context.WithCancel(ctx)
				defer cancel()
				ch, err := c.Watch(wctx, "", "/workspace")
				require.NoError(t, err)
				call(t, c, "write_file", map[string]any{"path": "watched.txt", "content": "x"})
				deadline := time.After(10 * time.Second)
				for seen := false; !seen; {
					select {
					case evs := <-ch:
						for _, e := range evs {
							seen = seen || e.Path == "/workspace/watched.txt"
						}
					case <-deadline:
						t.Fatal("no watch event for /workspace/watched.txt")
					}
				}
			})

			t.Run("another session's token is rejected", func(t *testing.T) {
				other := newSession(t, s)
				id, _ := c.Session()
				_, token := other.Session()
				_, err := sandboxclient.New(s.url, id, token).Tool(ctx, "shell", map[string]any{"command": "true"})
				var ae *sandboxclient.APIError
				require.ErrorAs(t, err, &ae)
				assert.Equal(t, http.StatusForbidden, ae.Status)
				assert.Contains(t, toolErr(t, other, "read_file", map[string]any{"path": "src/app.py"}), "no such file")
			})
		})
	}
}

func TestRestartAndIdleSleep(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			dir := t.TempDir()
			be := b.open(t, dir)
			fast := func(c *sandbox.Config) { c.ReapInterval = 50 * time.Millisecond }
			s1 := startServer(t, be, dir, fast)
			c := newSession(t, s1)
			id, token := c.Session()
			call(t, c, "write_file", map[string]any{"path": "keep.txt", "content": "kept"})
			call(t, c, "sandbox_create", map[string]any{"sandbox": "nap", "sleep_after_ms": 300})
			call(t, c, "write_file", map[string]any{"sandbox": "nap", "path": "dream.txt", "content": "zzz"})
			s1.stop()

			s2 := startServer(t, be, dir, fast)
			c2 := sandboxclient.New(s2.url, id, token)
			t.Cleanup(func() { c2.DeleteSession(context.Background()) })
			r := call(t, c2, "read_file", map[string]any{"path": "keep.txt"})
			assert.Equal(t, "kept", r["content"], "same session, same box after a restart")
			assert.Nil(t, r["notice"])

			status := func() string {
				for _, sb := range call(t, c2, "sandbox_list", nil)["sandboxes"].([]any) {
					if m := sb.(map[string]any); m["name"] == "nap" {
						return m["status"].(string)
					}
				}
				return ""
			}
			require.Eventually(t, func() bool { return status() == "sleeping" }, 20*time.Second, 100*time.Millisecond)
			r = call(t, c2, "read_file", map[string]any{"sandbox": "nap", "path": "dream.txt"})
			assert.Equal(t, "zzz", r["content"], "woken transparently, workspace kept")
			assert.Equal(t, "running", status())
		})
	}
}

func TestInProcessClient(t *testing.T) {
	dir := t.TempDir()
	be := backends[0].open(t, dir)
	s := startServer(t, be, dir, nil)
	id, _, err := s.svc.NewSession(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { s.svc.DeleteSession(context.Background(), id) })
	c := s.svc.Client(id)
	ctx := context.Background()
	out, err := c.CreateBox(ctx, api.SandboxCreateInput{Sandbox: "b"})
	require.NoError(t, err)
	assert.True(t, out.Created)
	n, err := c.Upload(ctx, "b", "in.txt", strings.NewReader("hello"))
	require.NoError(t, err)
	assert.EqualValues(t, 5, n)
	res, err := c.Exec(ctx, "b", api.ExecRequest{Argv: []string{"cat", "in.txt"}}, nil)
	require.NoError(t, err)
	assert.Equal(t, "hello", res.Stdout)
	_, err = c.Tool(ctx, "read_file", map[string]any{"sandbox": "b", "path": "missing"})
	var te *sandboxclient.ToolError
	require.True(t, errors.As(err, &te))
	assert.Contains(t, te.Message, "no such file")
	require.NoError(t, c.DestroyBox(ctx, "b"))
	assert.Error(t, c.DestroyBox(ctx, "b"))
}

// Both clients serve the tool profiles, and an HTTP client can make a
// session with allowed_commands.
func TestProfilesAndAllowedCommands(t *testing.T) {
	dir := t.TempDir()
	be := backends[0].open(t, dir)
	s := startServer(t, be, dir, nil)
	ctx := context.Background()

	hc := newSession(t, s)
	tools, err := hc.ToolsFor(ctx, "fs-tools")
	require.NoError(t, err)
	var names []string
	for _, tl := range tools {
		names = append(names, tl.Name)
	}
	assert.Equal(t, []string{"read", "write", "edit", "grep", "exec"}, names)
	_, err = hc.ToolsFor(ctx, "nope")
	var ae *sandboxclient.APIError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, http.StatusBadRequest, ae.Status)

	id, _, err := s.svc.NewSession(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { s.svc.DeleteSession(context.Background(), id) })
	for name, c := range map[string]interface {
		ToolAs(ctx context.Context, profile, name string, input any) (json.RawMessage, error)
	}{"http": hc, "in-process": s.svc.Client(id)} {
		t.Run(name, func(t *testing.T) {
			_, err := c.ToolAs(ctx, "fs-tools", "write", map[string]any{"path": "/workspace/p.txt", "content": "a\nb\n"})
			require.NoError(t, err)
			_, err = c.ToolAs(ctx, "fs-tools", "edit", map[string]any{"path": "/workspace/p.txt", "edits": []map[string]string{{"oldText": "b", "newText": "B"}}})
			require.NoError(t, err)
			res, err := c.ToolAs(ctx, "deerflow", "read_file", map[string]any{"description": "check", "path": "/workspace/p.txt", "start_line": 2})
			require.NoError(t, err)
			assert.JSONEq(t, `{"is_error":false,"output":"B\n"}`, string(res))
		})
	}

	limited, err := sandboxclient.NewSessionWithOptions(ctx, s.url, "", api.NewSessionRequest{AllowedCommands: []string{"echo"}})
	require.NoError(t, err)
	t.Cleanup(func() { limited.DeleteSession(context.Background()) })
	assert.Contains(t, toolErr(t, limited, "shell", map[string]any{"command": "id"}), "is not allowed in this session")
	assert.Equal(t, "ok\n", call(t, limited, "shell", map[string]any{"command": "echo ok"})["stdout"])
}

// TestLargeFilesConcurrently: write_file and read_file of large texts in
// parallel, through one client and one server. The client encodes inputs
// and the HTTP API reads bodies and renders results into kept buffers:
// every file must hold its own text and read back as written, and (under
// -race, as CI runs it) a buffer handed back while its call still reads
// it is a data race.
func TestLargeFilesConcurrently(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			dir := t.TempDir()
			s := startServer(t, b.open(t, dir), dir, nil)
			c := newSession(t, s)
			ctx := context.Background()
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Go(func() {
					for round := range 6 {
						// Distinct per writer and round, with escapes to
						// undo: a mix-up shows as a wrong text.
						line := fmt.Sprintf("writer %d round %d \"quoted\"\t%s\n", g, round, strings.Repeat(string(rune('a'+g)), 100))
						content := strings.Repeat(line, (128<<10)/len(line))
						path := fmt.Sprintf("big/%d.txt", g)
						res, err := c.Tool(ctx, "write_file", api.WriteFileInput{Path: path, Content: content})
						if !assert.NoError(t, err) {
							return
						}
						var w api.WriteFileOutput
						if !assert.NoError(t, api.DecodeResult(res, &w)) {
							return
						}
						assert.EqualValues(t, len(content), w.Size)
						var got strings.Builder
						for off := 0; ; {
							res, err := c.Tool(ctx, "read_file", api.ReadFileInput{Path: path, Offset: off})
							if !assert.NoError(t, err) {
								return
							}
							var out api.ReadFileOutput
							if !assert.NoError(t, api.DecodeResult(res, &out)) {
								return
							}
							got.WriteString(out.Content)
							if out.NextOffset == 0 {
								break
							}
							off = out.NextOffset
						}
						assert.True(t, got.String() == content, "writer %d round %d: read back %d bytes, wrote %d", g, round, got.Len(), len(content))
					}
				})
			}
			wg.Wait()
		})
	}
}

// TestToolInto decodes a result into the tool's output struct, and a
// failed call's *ToolError keeps its own copy of the result object: the
// buffer the result was read into serves the next call.
func TestToolInto(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			dir := t.TempDir()
			s := startServer(t, b.open(t, dir), dir, nil)
			c := newSession(t, s)
			ctx := context.Background()

			err := c.ToolInto(ctx, "read_file", api.ReadFileInput{Path: "missing.txt"}, &api.ReadFileOutput{})
			var te *sandboxclient.ToolError
			require.ErrorAs(t, err, &te)
			require.ErrorIs(t, err, sandboxclient.ErrNotFound)
			failed := string(te.Result)

			content := strings.Repeat(strings.Repeat("all work and no play ", 5)+"\n", 1500) // one window: 1500 lines, 156 KiB
			require.NoError(t, c.ToolInto(ctx, "write_file", api.WriteFileInput{Path: "big.txt", Content: content}, &api.WriteFileOutput{}))
			var out api.ReadFileOutput
			require.NoError(t, c.ToolInto(ctx, "read_file", api.ReadFileInput{Path: "big.txt"}, &out))
			assert.True(t, content == out.Content, "read back %d bytes, wrote %d", len(out.Content), len(content))
			assert.Equal(t, 1500, out.TotalLines)

			assert.Equal(t, failed, string(te.Result), "the error's result, after two more calls")
			assert.Contains(t, failed, `"code":"not_found"`)
		})
	}
}
