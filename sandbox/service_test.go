package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/backend"
)

// testSession is a session of a test service, driven in process (the HTTP
// face has its own tests, in sandbox/httpapi).
type testSession struct {
	t     *testing.T
	s     *Service
	id    string
	token string
}

func newSession(t *testing.T, s *Service) *testSession {
	return newSessionWith(t, s, api.NewSessionRequest{})
}

func newSessionWith(t *testing.T, s *Service, opts api.NewSessionRequest) *testSession {
	id, token, err := s.NewSessionWith(context.Background(), opts)
	require.NoError(t, err)
	return &testSession{t: t, s: s, id: id, token: token}
}

// rawIn calls tool name of profile ("" the default) with the JSON body
// and returns the result object; the error is CallToolAs's (unknown
// session, profile or tool).
func (h *testSession) rawIn(profile, name, body string) (map[string]any, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := h.s.CallToolAs(ctx, h.id, profile, name, json.RawMessage(body))
	if err != nil {
		return nil, err
	}
	var m map[string]any
	require.NoError(h.t, json.Unmarshal(res, &m))
	return m, nil
}

// raw calls tool name with the JSON body and returns the result object.
func (h *testSession) raw(name, body string) map[string]any {
	h.t.Helper()
	m, err := h.rawIn("", name, body)
	require.NoError(h.t, err, name)
	return m
}

// profileCall calls tool name of profile and returns its result object.
func (h *testSession) profileCall(profile, name string, input any) map[string]any {
	h.t.Helper()
	body, err := json.Marshal(input)
	require.NoError(h.t, err)
	m, err := h.rawIn(profile, name, string(body))
	require.NoError(h.t, err, "%s/%s", profile, name)
	return m
}

// tool calls a tool that must succeed.
func (h *testSession) tool(name string, input any) map[string]any {
	h.t.Helper()
	m := h.call(name, input)
	require.Equal(h.t, false, m["is_error"], "%s: %v", name, m["error"])
	return m
}

// call calls a tool and returns its result (which may be an error result).
func (h *testSession) call(name string, input any) map[string]any {
	h.t.Helper()
	return h.profileCall("", name, input)
}

// toolErr calls a tool that must fail and returns its message.
func (h *testSession) toolErr(name string, input any) string {
	h.t.Helper()
	m := h.call(name, input)
	require.Equal(h.t, true, m["is_error"], "%s should fail: %v", name, m)
	return m["error"].(string)
}

func TestVerticalSlice(t *testing.T) {
	be := newFakeBackend(t)
	s := newTestService(t, be, "", nil)
	h := newSession(t, s)

	w := h.tool("write_file", map[string]any{"path": "notes/hello.txt", "content": "hello\nworld\n"})
	assert.Equal(t, true, w["ok"])
	assert.EqualValues(t, 12, w["size"])
	assert.True(t, strings.HasSuffix(w["path"].(string), "/notes/hello.txt"), w["path"])

	r := h.tool("read_file", map[string]any{"path": "notes/hello.txt", "offset": 2})
	assert.Equal(t, "world\n", r["content"])
	assert.EqualValues(t, 2, r["total_lines"])
	assert.EqualValues(t, 2, r["start_line"])
	assert.Equal(t, "utf-8", r["encoding"])

	sh := h.tool("shell", map[string]any{"command": "cat notes/hello.txt; echo oops >&2; exit 3"})
	assert.Equal(t, "hello\nworld\n", sh["stdout"])
	assert.Equal(t, "oops\n", sh["stderr"])
	assert.EqualValues(t, 3, sh["exit_code"])
	assert.Equal(t, false, sh["truncated"])

	l := h.tool("sandbox_list", nil)
	boxes := l["sandboxes"].([]any)
	require.Len(t, boxes, 1)
	assert.Equal(t, "default", boxes[0].(map[string]any)["name"])
	assert.Equal(t, "running", boxes[0].(map[string]any)["status"])
	assert.Equal(t, 1, be.count())
}

func TestToolInputErrors(t *testing.T) {
	s := newTestService(t, newFakeBackend(t), "", nil)
	h := newSession(t, s)
	tests := []struct {
		tool     string
		input    string
		contains []string
	}{
		{"shell", `{"command":"true","cwd":"/"}`, []string{`unknown field "cwd"`, "valid fields: background, command, env, sandbox, timeout_ms, working_dir"}},
		{"shell", `{}`, []string{`missing required field "command"`}},
		{"shell", `{"command":"true","timeout_ms":"5s"}`, []string{"timeout_ms: must be integer"}},
		{"shell", `{"command":"true","timeout_ms":0}`, []string{"timeout_ms: must be >= 1"}},
		{"process", `{"action":"stop"}`, []string{`action: must be one of "list", "logs", "kill", "kill_all"`}},
		{"process", `{"action":"logs"}`, []string{"needs the id of a process"}},
		{"edit", `{"path":"x","edits":[{"old_text":"a","new":"b"}]}`, []string{"edits/0"}},
		// seed 003's names are the edit tool's; the old snake_case ones are named as unknown.
		{"edit", `{"path":"x","edits":[{"old_text":"a","new_text":"b"}]}`, []string{"edits/0/old_text: unknown property", "oldText"}},
		{"shell", `{"command":""}`, []string{"command is empty"}},
		{"shell", `[1,2]`, []string{"must be a JSON object"}},
		{"sandbox_list", `{"x":1}`, []string{`unknown field "x"`, "it takes no fields"}},
		{"read_file", `{"path":"missing.txt"}`, []string{"missing.txt", "no such file"}},
		// The error names the tool called, not the agent's op (tree).
		{"ls", `{"path":"missing"}`, []string{"ls /", "/workspace/missing: no such file"}},
		{"sandbox_create", `{"sandbox":"bad name!"}`, []string{"invalid sandbox name"}},
		{"write_file", `{"path":"x","content":"%%%","encoding":"base64"}`, []string{"not valid base64"}},
		{"shell", `{"command":null}`, []string{"command: must be string (got null)"}},
	}
	for _, tt := range tests {
		t.Run(tt.tool+" "+tt.input, func(t *testing.T) {
			m := h.raw(tt.tool, tt.input)
			require.Equal(t, true, m["is_error"], m)
			for _, c := range tt.contains {
				assert.Contains(t, m["error"], c)
			}
		})
	}
}

// TestNullMeansNotGiven: null for an optional field is as if the field
// were left out, as models send it; a required field stays required.
func TestNullMeansNotGiven(t *testing.T) {
	s := newTestService(t, newFakeBackend(t), "", nil)
	h := newSession(t, s)
	m := h.raw("shell", `{"command":"echo hi","sandbox":null,"timeout_ms":null,"env":null,"background":null,"working_dir":null}`)
	require.Equal(t, false, m["is_error"], m)
	assert.Equal(t, "hi\n", m["stdout"])
	m = h.raw("sandbox_create", `{"sandbox":"n","limits":null,"network":null,"env":null}`)
	require.Equal(t, false, m["is_error"], m)
	m = h.raw("write_file", `{"path":"a.txt","content":"x","append":null,"encoding":null}`)
	require.Equal(t, false, m["is_error"], m)
}

func TestFileTools(t *testing.T) {
	s := newTestService(t, newFakeBackend(t), "", nil)
	h := newSession(t, s)
	h.tool("write_file", map[string]any{"path": "src/main.go", "content": "package main\r\n\r\nfunc main() {\r\n\tprintln(\"hi\")\r\n}\r\n"})
	h.tool("write_file", map[string]any{"path": "src/util/util.go", "content": "package util\n// TODO: more\n"})
	h.tool("write_file", map[string]any{"path": "README.md", "content": "# demo\nTODO: docs\n"})

	e := h.tool("edit", map[string]any{"path": "src/main.go", "edits": []map[string]string{
		{"oldText": "package main", "newText": "package main // edited"},
		{"oldText": "println(\"hi\")", "newText": "println(\"hello\")"},
	}})
	assert.EqualValues(t, 2, e["replacements"])
	assert.Contains(t, e["diff"], "+\tprintln(\"hello\")")
	r := h.tool("read_file", map[string]any{"path": "src/main.go"})
	assert.Equal(t, "package main // edited\r\n\r\nfunc main() {\r\n\tprintln(\"hello\")\r\n}\r\n", r["content"], "CRLF line endings are kept")

	msg := h.toolErr("edit", map[string]any{"path": "src/main.go", "edits": []map[string]string{{"oldText": "not there", "newText": "x"}}})
	assert.Contains(t, msg, "src/main.go")

	sr := h.tool("str_replace", map[string]any{"path": "README.md", "old_str": "TODO", "new_str": "DONE"})
	assert.EqualValues(t, 1, sr["replacements"])
	h.tool("write_file", map[string]any{"path": "twice.txt", "content": "a a a"})
	assert.NotEmpty(t, h.toolErr("str_replace", map[string]any{"path": "twice.txt", "old_str": "a", "new_str": "b"}))
	sr = h.tool("str_replace", map[string]any{"path": "twice.txt", "old_str": "a", "new_str": "b", "replace_all": true})
	assert.EqualValues(t, 3, sr["replacements"])

	g := h.tool("grep", map[string]any{"pattern": "todo", "ignore_case": true})
	hits := g["hits"].([]any)
	require.Len(t, hits, 1)
	assert.Contains(t, hits[0].(map[string]any)["path"], "src/util/util.go")
	assert.EqualValues(t, 2, hits[0].(map[string]any)["line"])

	gl := h.tool("glob", map[string]any{"pattern": "**/*.go"})
	files := gl["files"].([]any)
	require.Len(t, files, 2)
	assert.Contains(t, files[0], "src/main.go")

	ls := h.tool("ls", map[string]any{})
	tree := ls["tree"].(string)
	assert.Contains(t, tree, "├── src/\n")
	assert.Contains(t, tree, "│   ├── main.go (")
	assert.Contains(t, tree, "README.md (")
	assert.NotContains(t, tree, "util.go", "two levels deep only")

	big := strings.Repeat("x", 2<<20+1)
	assert.Contains(t, h.toolErr("write_file", map[string]any{"path": "big", "content": big}), "at most")
	h.tool("write_file", map[string]any{"path": "bin", "content": "AAEC/w==", "encoding": "base64"})
	rb := h.tool("read_file", map[string]any{"path": "bin"})
	assert.Equal(t, "base64", rb["encoding"])
	assert.Equal(t, "AAEC/w==", rb["content"])
}

func TestShellTimeoutAndBackground(t *testing.T) {
	s := newTestService(t, newFakeBackend(t), "", nil)
	h := newSession(t, s)
	sh := h.tool("shell", map[string]any{"command": "echo started; sleep 30", "timeout_ms": 300})
	assert.Equal(t, true, sh["timed_out"])
	assert.Equal(t, "started\n", sh["stdout"])
	assert.NotEmpty(t, sh["process_id"])
	assert.Contains(t, sh["hint"], "background: true")

	bg := h.tool("shell", map[string]any{"command": "for i in 1 2 3; do echo line$i; done; sleep 30", "background": true})
	id := bg["process_id"].(string)
	require.NotEmpty(t, id)
	require.Eventually(t, func() bool {
		lg := h.tool("process", map[string]any{"action": "logs", "id": id})
		return lg["output"] == "line1\nline2\nline3\n" && lg["running"] == true
	}, 5*time.Second, 20*time.Millisecond)
	list := h.tool("process", map[string]any{"action": "list"})
	assert.NotEmpty(t, list["processes"])
	k := h.tool("process", map[string]any{"action": "kill", "id": id})
	assert.Equal(t, true, k["ok"])
	assert.Equal(t, false, k["running"])
	assert.Contains(t, h.toolErr("process", map[string]any{"action": "logs", "id": "nope"}), "no such process")
	k = h.tool("process", map[string]any{"action": "kill", "id": id})
	assert.Equal(t, false, k["running"], "killing an ended process is fine")

	out := h.tool("shell", map[string]any{"command": "head -c 200000 /dev/zero | tr '\\0' y"})
	assert.Equal(t, true, out["truncated"])
	assert.Len(t, out["stdout"], 64<<10)
}

func TestBoxesLifecycle(t *testing.T) {
	be := newFakeBackend(t)
	s := newTestService(t, be, "", nil)
	h := newSession(t, s)

	c := h.tool("sandbox_create", map[string]any{"sandbox": "db", "env": map[string]string{"ROLE": "db"}})
	assert.Equal(t, true, c["created"])
	id := c["id"].(string)
	assert.True(t, strings.HasPrefix(id, "cb-"), id)
	c2 := h.tool("sandbox_create", map[string]any{"sandbox": "db"})
	assert.Equal(t, false, c2["created"])
	assert.Equal(t, id, c2["id"])
	sh := h.tool("shell", map[string]any{"sandbox": "db", "command": "echo $ROLE"})
	assert.Equal(t, "db\n", sh["stdout"], "box env applies to every command")

	h.tool("shell", map[string]any{"command": "true"}) // lazily makes "default"
	l := h.tool("sandbox_list", nil)["sandboxes"].([]any)
	require.Len(t, l, 2)
	assert.Equal(t, "db", l[0].(map[string]any)["name"])
	assert.Equal(t, "default", l[1].(map[string]any)["name"])
	assert.Equal(t, 2, be.count())

	assert.Equal(t, true, h.tool("sandbox_destroy", map[string]any{"sandbox": "db"})["ok"])
	assert.Equal(t, 1, be.count())
	assert.Contains(t, h.toolErr("sandbox_destroy", map[string]any{"sandbox": "db"}), `no sandbox named "db" in this session (sandboxes: default)`)

	// Deleting the session destroys its boxes and revokes the token.
	require.NoError(t, s.DeleteSession(context.Background(), h.id))
	assert.Equal(t, 0, be.count())
	_, err := h.rawIn("", "shell", `{"command":"true"}`)
	assert.ErrorIs(t, err, ErrNoSession)
	_, err = s.Authenticate(h.id, h.token)
	assert.ErrorIs(t, err, ErrNoSession)
}

func TestSessionsAreIsolated(t *testing.T) {
	s := newTestService(t, newFakeBackend(t), "", nil)
	a, b := newSession(t, s), newSession(t, s)
	a.tool("write_file", map[string]any{"path": "secret.txt", "content": "a's"})
	assert.Contains(t, b.toolErr("read_file", map[string]any{"path": "secret.txt"}), "no such file")
	ida := a.tool("sandbox_list", nil)["sandboxes"].([]any)[0].(map[string]any)["id"].(string)

	// A box id of another session cannot be attached, shared or not.
	assert.Contains(t, b.toolErr("sandbox_create", map[string]any{"box_id": ida, "share_across_sessions": true}), "and not with \"cb-\"")
	assert.Contains(t, b.toolErr("sandbox_create", map[string]any{"box_id": ".a", "share_across_sessions": true}), "starting with a letter or digit")
	assert.Contains(t, b.toolErr("sandbox_create", map[string]any{"box_id": "team"}), "share_across_sessions: true")
	assert.Contains(t, b.toolErr("sandbox_create", map[string]any{"share_across_sessions": true}), "needs box_id")

	// An explicitly shared box is shared.
	a.tool("sandbox_create", map[string]any{"sandbox": "shared", "box_id": "team", "share_across_sessions": true})
	a.tool("write_file", map[string]any{"sandbox": "shared", "path": "note", "content": "from a"})
	cb := b.tool("sandbox_create", map[string]any{"sandbox": "t", "box_id": "team", "share_across_sessions": true})
	assert.Equal(t, false, cb["created"])
	assert.Equal(t, "from a", b.tool("read_file", map[string]any{"sandbox": "t", "path": "note"})["content"])
	// Destroying it in one session detaches it; the other keeps it.
	b.tool("sandbox_destroy", map[string]any{"sandbox": "t"})
	assert.Equal(t, "from a", a.tool("read_file", map[string]any{"sandbox": "shared", "path": "note"})["content"])
}

func TestRestartReattaches(t *testing.T) {
	be := newFakeBackend(t)
	dir := t.TempDir()
	s1 := newTestService(t, be, dir, nil)
	h := newSession(t, s1)
	h.tool("write_file", map[string]any{"path": "keep.txt", "content": "kept"})
	h.tool("sandbox_create", map[string]any{"sandbox": "lost"})
	h.tool("sandbox_create", map[string]any{"sandbox": "asleep"})
	ids := map[string]string{}
	for _, b := range h.tool("sandbox_list", nil)["sandboxes"].([]any) {
		ids[b.(map[string]any)["name"].(string)] = b.(map[string]any)["id"].(string)
	}
	require.NoError(t, s1.Close())

	// While the server is down: one box vanishes, one is stopped, and an
	// orphan (a pooled box of a crashed server) appears.
	require.NoError(t, be.Remove(context.Background(), ids["lost"]))
	require.NoError(t, be.Stop(context.Background(), ids["asleep"]))
	orphan := "cb-orphan"
	_, err := be.Create(context.Background(), backend.Spec{ID: orphan, HostDir: t.TempDir(),
		Labels: map[string]string{backend.LabelManaged: "1", labelInstance: s1.st.instance}})
	require.NoError(t, err)
	creates := be.creates
	// And the host directory of a box a killed server had half removed
	// (the backend's box gone, its directory not yet).
	stray := filepath.Join(dir, "boxes", "cb-halfremoved")
	require.NoError(t, os.MkdirAll(stray, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(stray, "agent.sock"), nil, 0o600))

	s2 := newTestService(t, be, dir, nil)
	h.s = s2
	assert.Empty(t, be.state(orphan), "orphan removed")
	assert.NoDirExists(t, stray, "a box directory neither the store nor the backend has is removed")
	assert.DirExists(t, s2.hostDir(ids["default"]), "the directories of known boxes stay")
	assert.Equal(t, backend.StateRunning, be.state(ids["default"]))

	r := h.tool("read_file", map[string]any{"path": "keep.txt"})
	assert.Equal(t, "kept", r["content"], "same session token, same box, same files")
	assert.Nil(t, r["notice"])
	assert.Equal(t, creates, be.creates, "reattached, not recreated")

	l := h.tool("sandbox_list", nil)["sandboxes"].([]any)
	status := map[string]string{}
	for _, b := range l {
		status[b.(map[string]any)["name"].(string)] = b.(map[string]any)["status"].(string)
	}
	assert.Equal(t, map[string]string{"default": "running", "asleep": "sleeping", "lost": "lost"}, status)

	sh := h.tool("shell", map[string]any{"sandbox": "lost", "command": "ls"})
	assert.Contains(t, sh["notice"], "recreated with an empty workspace")
	sh = h.tool("shell", map[string]any{"sandbox": "asleep", "command": "true"})
	assert.Nil(t, sh["notice"])
	assert.Equal(t, backend.StateRunning, be.state(ids["asleep"]))
}

func TestIdleSleepAndWake(t *testing.T) {
	be := newFakeBackend(t)
	s := newTestService(t, be, "", func(c *Config) { c.ReapInterval = 20 * time.Millisecond })
	h := newSession(t, s)
	c := h.tool("sandbox_create", map[string]any{"sandbox": "nap", "sleep_after_ms": 100})
	id := c["id"].(string)
	h.tool("write_file", map[string]any{"sandbox": "nap", "path": "f", "content": "still here"})
	// The reaper marks the box sleeping once the backend stopped it: wait
	// for what sandbox_list shows, then check the backend agrees.
	status := func() string {
		return h.tool("sandbox_list", nil)["sandboxes"].([]any)[0].(map[string]any)["status"].(string)
	}
	require.Eventually(t, func() bool { return status() == "sleeping" }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, backend.StateStopped, be.state(id))

	r := h.tool("read_file", map[string]any{"sandbox": "nap", "path": "f"})
	assert.Equal(t, "still here", r["content"])
	assert.Equal(t, backend.StateRunning, be.state(id))

	// A long call is never put to sleep under itself.
	sh := h.tool("shell", map[string]any{"sandbox": "nap", "command": "sleep 0.5; echo done"})
	assert.Equal(t, "done\n", sh["stdout"])
}

func TestConcurrencyLimitsQueue(t *testing.T) {
	be := newFakeBackend(t)
	be.delay = 30 * time.Millisecond
	s := newTestService(t, be, "", func(c *Config) { c.SessionConcurrency = 2; c.GlobalConcurrency = 3 })
	h := newSession(t, s)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.tool("shell", map[string]any{"sandbox": fmt.Sprintf("b%d", i), "command": "true"})
		}()
	}
	wg.Wait()
	assert.Equal(t, 8, be.count(), "a burst queues, nothing fails")
	assert.LessOrEqual(t, be.peak, 2, "at most SessionConcurrency creates at once")
}

func TestWarmPool(t *testing.T) {
	be := newFakeBackend(t)
	s := newTestService(t, be, "", func(c *Config) { c.Pool = map[string]int{backend.DefaultImage: 2} })
	h := newSession(t, s)
	require.Eventually(t, func() bool { return be.count() == 2 }, 5*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { return s.pools.Ready()[backend.DefaultImage] == 2 }, 5*time.Second, 5*time.Millisecond)

	var took []time.Duration
	for i := range 5 {
		start := time.Now()
		c := h.tool("sandbox_create", map[string]any{"sandbox": fmt.Sprintf("w%d", i)})
		sh := h.tool("shell", map[string]any{"sandbox": fmt.Sprintf("w%d", i), "command": "echo hi"})
		took = append(took, time.Since(start))
		assert.Equal(t, "hi\n", sh["stdout"])
		assert.Equal(t, true, c["created"])
		// Wait for the refill so each create takes a warm box.
		require.Eventually(t, func() bool { return s.pools.Ready()[backend.DefaultImage] == 2 }, 5*time.Second, 2*time.Millisecond)
	}
	t.Logf("create -> first exec from the warm pool: %v", took)
	assert.Equal(t, 7, be.count())

	// A box with limits does not come from the pool.
	h.tool("sandbox_create", map[string]any{"sandbox": "big", "limits": map[string]any{"memory_bytes": 1 << 29}})
	assert.Equal(t, 8, be.count())

	// Close removes the pooled boxes but keeps the sessions' ones.
	require.NoError(t, s.Close())
	assert.Equal(t, 6, be.count())
}

// TestWarmPoolFollowsUse: a use-following pool (cellbox run) makes no box
// before one is asked for, grows with use up to its size, and shrinks
// back to nothing when unused.
func TestWarmPoolFollowsUse(t *testing.T) {
	be := newFakeBackend(t)
	s := newTestService(t, be, "", func(c *Config) {
		c.Pool = map[string]int{backend.DefaultImage: 2}
		c.PoolFollowsUse = true
		c.PoolIdle = time.Second
		c.ReapInterval = 10 * time.Millisecond
	})
	ready := func() int { return s.pools.Ready()[backend.DefaultImage] }
	h := newSession(t, s)
	time.Sleep(30 * time.Millisecond) // three reaper rounds
	assert.Equal(t, 0, be.count(), "no box before one is asked for")

	h.tool("sandbox_create", map[string]any{"sandbox": "a"}) // a miss: the pool grows to 1
	require.Eventually(t, func() bool { return ready() == 1 }, 5*time.Second, 2*time.Millisecond)
	h.tool("sandbox_create", map[string]any{"sandbox": "b"}) // a hit: it grows to 2
	assert.EqualValues(t, 1, s.Metrics().WarmTaken)
	require.Eventually(t, func() bool { return ready() == 2 }, 5*time.Second, 2*time.Millisecond)
	h.tool("sandbox_create", map[string]any{"sandbox": "c"}) // a hit; it stays at 2
	assert.EqualValues(t, 2, s.Metrics().WarmTaken)
	require.Eventually(t, func() bool { return ready() == 2 }, 5*time.Second, 2*time.Millisecond)
	assert.Equal(t, 5, be.count(), "three boxes of the session, two warm")

	// Unused, the pool shrinks box by box to nothing.
	require.Eventually(t, func() bool { return ready() == 0 }, 10*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { return be.count() == 3 }, 10*time.Second, 5*time.Millisecond, "the warm boxes are removed, the session's stay")
}

// TestOneShotBoxesAreNotStored: a box Config.OneShot names (an exec
// stage's) costs no commit of the state file on its way in or out; one a
// dead process left behind is removed at the next start as an orphan,
// while an ordinary box is reattached.
func TestOneShotBoxesAreNotStored(t *testing.T) {
	be := newFakeBackend(t)
	dir := t.TempDir()
	oneShot := func(c *Config) { c.OneShot = func(_, name string) bool { return strings.HasPrefix(name, "run-") } }
	s := newTestService(t, be, dir, oneShot)
	h := newSession(t, s)
	h.tool("shell", map[string]any{"sandbox": "keep", "command": "true"})
	s.flushLastUsed()
	state := func() []byte {
		b, err := os.ReadFile(filepath.Join(dir, StateFile))
		require.NoError(t, err)
		return b
	}
	before := state()
	h.tool("shell", map[string]any{"sandbox": "run-1", "command": "echo hi > f"})
	h.tool("sandbox_destroy", map[string]any{"sandbox": "run-1"})
	h.tool("shell", map[string]any{"sandbox": "run-2", "command": "true"})
	assert.Equal(t, before, state(), "one-shot boxes: no commit")
	assert.Equal(t, 2, be.count(), "keep and run-2")

	// The process dies with run-2 alive; the next start removes it.
	require.NoError(t, s.Close())
	s2 := newTestService(t, be, dir, oneShot)
	assert.Equal(t, 1, be.count(), "run-2 was an orphan")
	l := (&testSession{t: t, s: s2, id: h.id, token: h.token}).tool("sandbox_list", nil)
	boxes := l["sandboxes"].([]any)
	require.Len(t, boxes, 1)
	assert.Equal(t, "keep", boxes[0].(map[string]any)["name"])
}

func TestTransferBetweenBoxes(t *testing.T) {
	s := newTestService(t, newFakeBackend(t), "", nil)
	h := newSession(t, s)
	h.tool("shell", map[string]any{"sandbox": "builder", "command": "mkdir -p app/dist/assets && echo '<h1>hi</h1>' > app/dist/index.html && head -c 3000 /dev/urandom > app/dist/assets/blob.bin && chmod 755 app/dist/index.html && ln app/dist/index.html app/dist/same.html"})
	sum := h.tool("shell", map[string]any{"sandbox": "builder", "command": "cd app/dist && sha256sum index.html assets/blob.bin"})["stdout"]

	tr := h.tool("transfer", map[string]any{"from_sandbox": "builder", "from_path": "app/dist", "to_sandbox": "web", "to_path": "site/static", "recursive": true})
	assert.EqualValues(t, 3012, tr["bytes"])
	assert.True(t, strings.HasSuffix(tr["path"].(string), "/site/static"), tr["path"])
	got := h.tool("shell", map[string]any{"sandbox": "web", "command": "cd site/static && sha256sum index.html assets/blob.bin && stat -c %a index.html && stat -c %h same.html"})["stdout"]
	assert.Equal(t, sum.(string)+"755\n2\n", got, "a hard link stays one (renamed with its tree)")

	// A single file into an existing directory lands inside it.
	tr = h.tool("transfer", map[string]any{"from_sandbox": "builder", "from_path": "app/dist/assets/blob.bin", "to_sandbox": "web", "to_path": "site"})
	assert.EqualValues(t, 3000, tr["bytes"])
	assert.True(t, strings.HasSuffix(tr["path"].(string), "/site/blob.bin"), tr["path"])

	assert.Contains(t, h.toolErr("transfer", map[string]any{"from_sandbox": "builder", "from_path": "app", "to_sandbox": "web", "to_path": "x"}), "recursive: true")
	assert.Contains(t, h.toolErr("transfer", map[string]any{"from_sandbox": "builder", "from_path": "nope", "to_sandbox": "web", "to_path": "x"}), "no such file")
}

// A directory copied into itself (or through a link into itself) is
// refused, as cp refuses it: the copy read what it wrote and ended with
// truncated files, saying ok. Beside it, and a file onto itself, is fine.
func TestTransferWithinOneBox(t *testing.T) {
	s := newTestService(t, newFakeBackend(t), "", nil)
	h := newSession(t, s)
	h.tool("shell", map[string]any{"sandbox": "b", "command": "mkdir -p a/d && head -c 1000000 /dev/urandom > a/f && ln -s a link"})
	sum := h.tool("shell", map[string]any{"sandbox": "b", "command": "sha256sum < a/f"})["stdout"]
	for _, tc := range []struct{ from, to string }{{".", "a/copy"}, {"a", "a/copy"}, {"a", "a"}, {"a", "a/d"}, {"a", "link/x/y"}, {"./a/", "a/d/../copy"}} {
		msg := h.toolErr("transfer", map[string]any{"from_sandbox": "b", "from_path": tc.from, "to_sandbox": "b", "to_path": tc.to, "recursive": true})
		assert.Contains(t, msg, "into itself", tc)
	}
	ls := h.tool("shell", map[string]any{"sandbox": "b", "command": "find . | sort"})["stdout"]
	assert.Equal(t, ".\n./a\n./a/d\n./a/f\n./link\n", ls, "nothing was copied")

	h.tool("transfer", map[string]any{"from_sandbox": "b", "from_path": "a", "to_sandbox": "b", "to_path": "ab", "recursive": true})
	h.tool("transfer", map[string]any{"from_sandbox": "b", "from_path": "a/f", "to_sandbox": "b", "to_path": "a/f"})
	got := h.tool("shell", map[string]any{"sandbox": "b", "command": "sha256sum < ab/f && sha256sum < a/f"})["stdout"]
	assert.Equal(t, sum.(string)+sum.(string), got)
}

// A box left running by an older cellbox (its agent speaks another
// protocol) is restarted with this server's agent, its workspace kept; only
// a box whose agent is still another protocol once restarted is recreated.
func TestProtocolMismatchRestarts(t *testing.T) {
	for _, stale := range []bool{false, true} {
		t.Run(fmt.Sprintf("stale=%v", stale), func(t *testing.T) {
			be := newFakeBackend(t)
			dir := t.TempDir()
			s1 := newTestService(t, be, dir, nil)
			h := newSession(t, s1)
			id := h.tool("sandbox_create", map[string]any{"sandbox": "x"})["id"].(string)
			h.tool("write_file", map[string]any{"sandbox": "x", "path": "f", "content": "old"})
			require.NoError(t, s1.Close())

			// The box now runs an agent of another protocol (an older cellbox).
			require.NoError(t, be.Stop(context.Background(), id))
			be.mu.Lock()
			be.old[id], be.stale[id] = true, stale
			be.mu.Unlock()
			_, err := be.Start(context.Background(), id)
			require.NoError(t, err)

			s2 := newTestService(t, be, dir, nil)
			h.s = s2
			sh := h.tool("shell", map[string]any{"sandbox": "x", "command": "cat f || true"})
			assert.Contains(t, sh["notice"], "ran an agent of protocol 99")
			if stale {
				assert.Contains(t, sh["notice"], "recreated with an empty workspace")
				assert.Equal(t, "", sh["stdout"], "the recreated box is empty")
			} else {
				assert.Contains(t, sh["notice"], "restarted with this server's agent, its workspace kept")
				assert.Equal(t, "old", sh["stdout"], "the workspace is kept")
			}
			assert.Equal(t, backend.StateRunning, be.state(id), "same id")
		})
	}
}

// SleepAll stops the running boxes of every session (more of them than
// it stops at once), keeping their files; a box already asleep stays so;
// the next call wakes a box.
func TestSleepAll(t *testing.T) {
	be := newFakeBackend(t)
	s := newTestService(t, be, "", nil)
	var ids []string
	var last *testSession
	for i := range sleepConcurrency + 2 {
		last = newSession(t, s)
		ids = append(ids, last.tool("sandbox_create", map[string]any{"sandbox": "a"})["id"].(string))
		last.tool("write_file", map[string]any{"sandbox": "a", "path": "f", "content": fmt.Sprint("kept ", i)})
	}
	s.mu.Lock()
	asleep := s.boxes[ids[len(ids)-1]]
	s.mu.Unlock()
	require.NoError(t, s.sleepBoxes(context.Background(), []*box{asleep}))
	stops := be.stops

	require.NoError(t, s.SleepAll(context.Background()))
	for _, id := range ids {
		assert.Equal(t, backend.StateStopped, be.state(id), id)
	}
	assert.Equal(t, stops+len(ids)-1, be.stops, "each running box stopped once, the sleeping one not again")
	// The process is shutting down: a call still arriving does not start a
	// box again to run on after it exits (it used to wake it).
	assert.Contains(t, last.toolErr("read_file", map[string]any{"sandbox": "a", "path": "f"}), "the server is shutting down and has put its boxes to sleep")
	assert.Contains(t, last.toolErr("sandbox_create", map[string]any{"sandbox": "b"}), "the server is shutting down")
	assert.Equal(t, api.CodeUnavailable, last.call("read_file", map[string]any{"sandbox": "a", "path": "f"})["code"], "call again once the server is back")
	assert.Equal(t, backend.StateStopped, be.state(ids[len(ids)-1]))
	require.NoError(t, s.SleepAll(context.Background()), "again, with nothing else running")

	// The next service over the data dir wakes the box, files kept.
	require.NoError(t, s.Close())
	s2 := newTestService(t, be, s.cfg.DataDir, nil)
	again := &testSession{t: t, s: s2, id: last.id, token: last.token}
	assert.Equal(t, fmt.Sprint("kept ", len(ids)-1), again.tool("read_file", map[string]any{"sandbox": "a", "path": "f"})["content"])
	assert.Equal(t, backend.StateRunning, be.state(ids[len(ids)-1]), "woken by the next call")
}

// stuckStop is a backend whose Stop of one box never returns until the
// test ends (an engine that hangs).
type stuckStop struct {
	*fakeBackend
	id      string
	release chan struct{}
}

func (b *stuckStop) Stop(ctx context.Context, id string) error {
	if id == b.id {
		<-b.release
	}
	return b.fakeBackend.Stop(ctx, id)
}

// SleepAll does not wait beyond its context for a box that does not stop:
// it names the box in its error, and the other boxes are asleep.
func TestSleepAllStuckBox(t *testing.T) {
	be := &stuckStop{fakeBackend: newFakeBackend(t), release: make(chan struct{})}
	t.Cleanup(func() { close(be.release) })
	s := newTestService(t, be, "", nil)
	h := newSession(t, s)
	be.id = h.tool("sandbox_create", map[string]any{"sandbox": "stuck"})["id"].(string)
	other := h.tool("sandbox_create", map[string]any{"sandbox": "fine"})["id"].(string)

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := s.SleepAll(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorContains(t, err, be.id+" did not stop in time")
	assert.NotContains(t, err.Error(), other)
	assert.Equal(t, backend.StateStopped, be.state(other))
}
