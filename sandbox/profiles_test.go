package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/tools"
)

// seedTool is one tool as its seed document defines it: the property
// names in the seed's order and the required ones.
type seedTool struct {
	name     string
	props    []string
	required []string
}

// seedProfiles are transcribed by hand from the seed documents (in
// /work/shared/seeds, beside DESIGN.md), not from the code.
var seedProfiles = map[string][]seedTool{
	// 000_a1541213c64e4143.txt, "## Tool Definitions": the inputSchema of
	// each ### section.
	"cloudflare": {
		{"shell", []string{"sandbox", "command", "timeout_ms", "working_dir"}, []string{"command"}},
		{"read_file", []string{"sandbox", "path", "offset", "limit"}, []string{"path"}},
		{"write_file", []string{"sandbox", "path", "content", "append"}, []string{"path", "content"}},
		{"glob", []string{"sandbox", "pattern", "cwd"}, []string{"pattern"}},
		{"browse", []string{"sandbox", "port"}, []string{"port"}},
		{"sandbox_create", []string{"sandbox", "image", "sleep_after_ms"}, []string{"sandbox"}},
		{"sandbox_list", nil, nil},
		{"transfer", []string{"from_sandbox", "from_path", "to_sandbox", "to_path", "recursive"}, []string{"from_sandbox", "from_path", "to_sandbox", "to_path"}},
	},
	// 003_f999ce16fa2611df.txt, the "Schema:" block of each of read,
	// write, edit, grep, exec (a field is optional when written "name?").
	"fs-tools": {
		{"read", []string{"path", "offset", "limit"}, []string{"path"}},
		{"write", []string{"path", "content"}, []string{"path", "content"}},
		{"edit", []string{"path", "edits"}, []string{"path", "edits"}},
		{"grep", []string{"pattern", "path", "regex", "ignoreCase", "glob"}, []string{"pattern", "path"}},
		{"exec", []string{"command", "cwd"}, []string{"command"}},
	},
	// 004_0be6fde3583a136a.txt, the "Parameters" of bash, ls, read_file,
	// write_file, str_replace ("required" under a name; description first).
	"deerflow": {
		{"bash", []string{"description", "command"}, []string{"description", "command"}},
		{"ls", []string{"description", "path"}, []string{"description", "path"}},
		{"read_file", []string{"description", "path", "start_line", "end_line"}, []string{"description", "path"}},
		{"write_file", []string{"description", "path", "content", "append"}, []string{"description", "path", "content"}},
		{"str_replace", []string{"description", "path", "old_str", "new_str", "replace_all"}, []string{"description", "path", "old_str", "new_str"}},
	},
}

// propertyOrder returns the names of a schema's properties in the order
// they are written (the order a model sees them in).
func propertyOrder(t *testing.T, schema json.RawMessage) []string {
	t.Helper()
	var top map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(schema, &top))
	props, ok := top["properties"]
	if !ok {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(props))
	_, err := dec.Token() // {
	require.NoError(t, err)
	var names []string
	for dec.More() {
		tok, err := dec.Token()
		require.NoError(t, err)
		names = append(names, tok.(string))
		var skip json.RawMessage
		require.NoError(t, dec.Decode(&skip))
	}
	return names
}

// getTools returns the tool list of profile as GET /v1/tools?profile=
// serves it (sandbox/httpapi tests the route itself).
func getTools(t *testing.T, profile string) []api.ToolInfo {
	t.Helper()
	tools, err := ToolInfosFor(profile)
	require.NoError(t, err)
	return tools
}

func TestProfileToolListsMatchSeeds(t *testing.T) {
	for profile, want := range seedProfiles {
		t.Run(profile, func(t *testing.T) {
			tools := getTools(t, profile)
			var names, wantNames []string
			for _, tl := range tools {
				names = append(names, tl.Name)
			}
			for _, w := range want {
				wantNames = append(wantNames, w.name)
			}
			require.Equal(t, wantNames, names)
			for i, w := range want {
				tl := tools[i]
				assert.NotEmpty(t, tl.Description, w.name)
				assert.Equal(t, w.props, propertyOrder(t, tl.InputSchema), "%s: properties", w.name)
				var schema struct {
					Type     string   `json:"type"`
					Required []string `json:"required"`
				}
				require.NoError(t, json.Unmarshal(tl.InputSchema, &schema))
				assert.Equal(t, "object", schema.Type)
				sort.Strings(schema.Required)
				req := append([]string(nil), w.required...)
				sort.Strings(req)
				assert.Equal(t, req, schema.Required, "%s: required", w.name)
			}
		})
	}

	t.Run("fs-tools edit items", func(t *testing.T) {
		// seed 003, edit: edits: Array<{ oldText: string; newText: string }>
		for _, profile := range []string{"fs-tools", ""} {
			tools := getTools(t, profile)
			var edit json.RawMessage
			for _, tl := range tools {
				if tl.Name == "edit" {
					edit = tl.InputSchema
				}
			}
			require.NotNil(t, edit, "profile %q has edit", profile)
			var schema struct {
				Properties struct {
					Edits struct {
						Items json.RawMessage `json:"items"`
					} `json:"edits"`
				} `json:"properties"`
			}
			require.NoError(t, json.Unmarshal(edit, &schema))
			assert.Equal(t, []string{"oldText", "newText"}, propertyOrder(t, schema.Properties.Edits.Items), "profile %q", profile)
		}
	})

	t.Run("default and unknown", func(t *testing.T) {
		infos := getTools(t, "")
		assert.Equal(t, "shell", infos[0].Name)
		assert.Len(t, infos, len(Tools()), "the default profile is the registry")
		_, err := ToolInfosFor("openai")
		assert.ErrorIs(t, err, tools.ErrUnknownProfile)
		assert.ErrorContains(t, err, `unknown tool profile "openai"; profiles: cellbox, cloudflare, fs-tools, deerflow`)
	})
}

// shaped checks a result succeeded and has exactly the fields of its seed's
// result shape (beside is_error and notice), and returns it.
func shaped(t *testing.T, m map[string]any, fields ...string) map[string]any {
	t.Helper()
	require.Equal(t, false, m["is_error"], "%v", m)
	var got []string
	for k := range m {
		if k != api.FieldIsError && k != api.FieldNotice {
			got = append(got, k)
		}
	}
	assert.ElementsMatch(t, fields, got, "result fields of %v", m)
	return m
}

// TestProfileCallsInRealBox calls tools of each profile in a bubblewrap box,
// with the seeds' field names, and checks the seeds' result shapes.
func TestProfileCallsInRealBox(t *testing.T) {
	rb := newRealService(t, "local", nil)
	h := newSession(t, rb.s)

	t.Run("cloudflare", func(t *testing.T) {
		// seed 000: write_file returns { ok, size }, read_file { content, size }
		// with a byte offset and limit, shell { stdout, stderr, exit_code }.
		w := shaped(t, h.profileCall("cloudflare", "write_file", map[string]any{"path": "/workspace/cf.txt", "content": "hello world\n"}), "ok", "size")
		assert.EqualValues(t, 12, w["size"])
		r := shaped(t, h.profileCall("cloudflare", "read_file", map[string]any{"path": "/workspace/cf.txt", "offset": 6, "limit": 5}), "content", "size")
		assert.Equal(t, "world", r["content"])
		assert.EqualValues(t, 12, r["size"])
		r = h.profileCall("cloudflare", "read_file", map[string]any{"path": "/workspace/cf.txt", "offset": 6})
		assert.Equal(t, "world\n", r["content"])
		sh := shaped(t, h.profileCall("cloudflare", "shell", map[string]any{"command": "cat cf.txt; exit 2", "working_dir": "/workspace"}), "stdout", "stderr", "exit_code")
		assert.Equal(t, "hello world\n", sh["stdout"])
		assert.EqualValues(t, 2, sh["exit_code"])
		to := h.profileCall("cloudflare", "shell", map[string]any{"command": "echo started; sleep 30", "timeout_ms": 300})
		assert.Equal(t, "started\n", to["stdout"])
		assert.Contains(t, to["notice"], "still running after 300 ms and was killed")
		assert.NotContains(t, to["notice"], "background: true", "the notice names no field the profile lacks")
		l := shaped(t, h.profileCall("cloudflare", "sandbox_list", map[string]any{}), "sandboxes")
		assert.Equal(t, []any{map[string]any{"name": "default", "image": "host", "status": "running"}}, l["sandboxes"])
		shaped(t, h.profileCall("cloudflare", "transfer", map[string]any{"from_sandbox": "default", "from_path": "/workspace/cf.txt", "to_sandbox": "default", "to_path": "/workspace/cf2.txt"}), "ok", "bytes")
	})

	t.Run("fs-tools", func(t *testing.T) {
		// seed 003: edit with edits [{oldText, newText}] against the original
		// file, read { content, nextOffset }, grep { hits, truncated },
		// exec { exitCode, stdout, stderr, truncated }.
		shaped(t, h.profileCall("fs-tools", "write", map[string]any{"path": "/workspace/fs.txt", "content": "one\ntwo\nthree\n"}), "ok", "size")
		e := shaped(t, h.profileCall("fs-tools", "edit", map[string]any{"path": "/workspace/fs.txt", "edits": []map[string]string{
			{"oldText": "one", "newText": "ONE"}, {"oldText": "three", "newText": "THREE"},
		}}), "ok", "diff", "replacements")
		assert.Contains(t, e["diff"], "+THREE")
		r := shaped(t, h.profileCall("fs-tools", "read", map[string]any{"path": "/workspace/fs.txt", "offset": 1, "limit": 2}), "content", "nextOffset")
		assert.Equal(t, "ONE\ntwo\n", r["content"])
		assert.EqualValues(t, 3, r["nextOffset"])
		g := shaped(t, h.profileCall("fs-tools", "grep", map[string]any{"pattern": "thr", "path": "/workspace", "ignoreCase": true}), "hits", "truncated")
		assert.Equal(t, []any{map[string]any{"path": "/workspace/fs.txt", "line": 3.0, "text": "THREE"}}, g["hits"])
		x := shaped(t, h.profileCall("fs-tools", "exec", map[string]any{"command": "wc -l < fs.txt", "cwd": "/workspace"}), "exitCode", "stdout", "stderr", "truncated")
		assert.Equal(t, "3\n", x["stdout"])
		assert.EqualValues(t, 0, x["exitCode"])
		// seed 003, exec: stdout and stderr are each capped at 32 KiB.
		big := h.profileCall("fs-tools", "exec", map[string]any{"command": "head -c 40000 /dev/zero | tr '\\0' a"})
		assert.Equal(t, 32<<10, len(big["stdout"].(string)))
		assert.Equal(t, true, big["truncated"])
		assert.Contains(t, big["notice"], "cut at 32 KiB")
	})

	t.Run("deerflow", func(t *testing.T) {
		// seed 004: every tool takes description first and returns a string:
		// "OK" for write_file and str_replace, the file (or line range) for
		// read_file, the tree for ls, the output for bash.
		w := shaped(t, h.profileCall("deerflow", "write_file", map[string]any{"description": "make a file", "path": "/workspace/df/a.py", "content": "a = 1\nb = 2\nc = 3\n"}), "output")
		assert.Equal(t, "OK", w["output"])
		s := shaped(t, h.profileCall("deerflow", "str_replace", map[string]any{"description": "fix b", "path": "/workspace/df/a.py", "old_str": "b = 2", "new_str": "b = 20"}), "output")
		assert.Equal(t, "OK", s["output"])
		r := shaped(t, h.profileCall("deerflow", "read_file", map[string]any{"description": "read b and c", "path": "/workspace/df/a.py", "start_line": 2, "end_line": 3}), "output")
		assert.Equal(t, "b = 20\nc = 3\n", r["output"])
		l := shaped(t, h.profileCall("deerflow", "ls", map[string]any{"description": "look", "path": "/workspace/df"}), "output")
		assert.Contains(t, l["output"], "a.py")
		b := shaped(t, h.profileCall("deerflow", "bash", map[string]any{"description": "run it", "command": "python3 -c 'exec(open(\"/workspace/df/a.py\").read()); print(b)'; echo warn >&2"}), "output")
		assert.Equal(t, "20\n\nStd Error:\nwarn\n", b["output"])
		e := h.profileCall("deerflow", "str_replace", map[string]any{"description": "x", "path": "/workspace/df/a.py", "old_str": "nope", "new_str": "x"})
		assert.Equal(t, true, e["is_error"])
		tool, err := LookupToolIn("deerflow", "str_replace")
		require.NoError(t, err)
		raw, err := json.Marshal(e)
		require.NoError(t, err)
		assert.True(t, strings.HasPrefix(tool.ResultText(raw), "Error: "), tool.ResultText(raw))
	})

	t.Run("unknown tool in profile", func(t *testing.T) {
		_, err := h.rawIn("cloudflare", "read", `{}`)
		assert.ErrorIs(t, err, tools.ErrUnknownTool)
		assert.ErrorContains(t, err, `unknown tool "read" in profile cloudflare; tools: browse, glob, read_file`)
	})

	t.Run("a typo of a tool gets a suggestion", func(t *testing.T) {
		_, err := h.rawIn("", "shel", `{}`)
		assert.ErrorIs(t, err, tools.ErrUnknownTool)
		assert.ErrorContains(t, err, `unknown tool "shel" in profile cellbox (did you mean "shell"?); tools: `)
	})
}

func TestAllowedCommands(t *testing.T) {
	rb := newRealService(t, "local", nil)
	h := newSessionWith(t, rb.s, api.NewSessionRequest{AllowedCommands: []string{"echo", "ls -la"}})

	// Refused before it reaches a box: the session has none afterwards.
	msg := h.toolErr("shell", map[string]any{"command": "touch /workspace/ran"})
	assert.Contains(t, msg, `command "touch /workspace/ran" is not allowed in this session: a command must start with one of ["echo" "ls -la"] (allowed_commands`)
	l := h.tool("sandbox_list", nil)
	assert.Empty(t, l["sandboxes"], "a refused command must not even make the box")

	sh := h.tool("shell", map[string]any{"command": "echo hi"})
	assert.Equal(t, "hi\n", sh["stdout"])
	h.tool("shell", map[string]any{"command": "ls -la /workspace"})

	refused := []struct {
		name    string
		profile string
		tool    string
		input   map[string]any
		want    string
	}{
		{"prefix of a word", "", "shell", map[string]any{"command": "lsblk"}, "is not allowed"},
		{"prefix without its argument", "", "shell", map[string]any{"command": "ls /workspace"}, "is not allowed"},
		{"chained", "", "shell", map[string]any{"command": "echo hi; touch /workspace/ran"}, `";" could run another command`},
		{"and", "", "shell", map[string]any{"command": "echo hi && touch /workspace/ran"}, `"&" could run another command`},
		{"substitution", "", "shell", map[string]any{"command": "echo $(touch /workspace/ran)"}, `"$" could run another command`},
		{"backticks", "", "shell", map[string]any{"command": "echo `touch /workspace/ran`"}, "could run another command"},
		{"second line", "", "shell", map[string]any{"command": "echo hi\ntouch /workspace/ran"}, "could run another command"},
		{"redirect", "", "shell", map[string]any{"command": "echo x > /workspace/ran"}, "could run another command"},
		{"env", "", "shell", map[string]any{"command": "echo hi", "env": map[string]string{"BASH_ENV": "/workspace/x"}}, "env refused"},
		{"background", "", "shell", map[string]any{"command": "touch /workspace/ran", "background": true}, "is not allowed"},
		{"box env", "", "sandbox_create", map[string]any{"sandbox": "other", "env": map[string]string{"BASH_ENV": "/workspace/x"}}, "env refused"},
		{"fs-tools exec", "fs-tools", "exec", map[string]any{"command": "touch /workspace/ran"}, "is not allowed"},
		{"deerflow bash", "deerflow", "bash", map[string]any{"description": "x", "command": "touch /workspace/ran"}, "is not allowed"},
		{"cloudflare shell", "cloudflare", "shell", map[string]any{"command": "touch /workspace/ran"}, "is not allowed"},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			m := h.profileCall(tt.profile, tt.tool, tt.input)
			require.Equal(t, true, m["is_error"], "%v", m)
			assert.Contains(t, m["error"], tt.want)
		})
	}

	t.Run("exec", func(t *testing.T) {
		// The streaming exec behind the exec endpoint and sandboxclient.
		sess, err := rb.s.Authenticate(h.id, h.token)
		require.NoError(t, err)
		_, err = rb.s.Exec(context.Background(), sess, "default", api.ExecRequest{Command: "touch /workspace/ran"}, nil, nil, func(string) {})
		assert.ErrorContains(t, err, "is not allowed")
	})

	// Nothing of the refused commands ran.
	g := h.tool("glob", map[string]any{"pattern": "*", "cwd": "/workspace"})
	assert.Empty(t, g["files"])

	// Another session of the same server is not limited.
	free := newSession(t, rb.s)
	free.tool("shell", map[string]any{"command": "touch /workspace/ran"})
}

func TestAllowedCommandsBadList(t *testing.T) {
	s := newTestService(t, newFakeBackend(t), "", nil)
	for _, list := range [][]string{{""}, {"echo; rm"}} {
		_, _, err := s.NewSessionWith(context.Background(), api.NewSessionRequest{AllowedCommands: list})
		assert.ErrorContains(t, err, "allowed_commands", "%q", list)
		assert.Equal(t, api.CodeInvalidInput, api.CodeOf(err), "a bad list is the caller's error (HTTP 400): %q", list)
	}
}

// The allow-list is kept with the session: a restarted server still
// refuses.
func TestAllowedCommandsSurviveRestart(t *testing.T) {
	be := newFakeBackend(t)
	dir := t.TempDir()
	s := newTestService(t, be, dir, nil)
	id, _, err := s.NewSessionWith(context.Background(), api.NewSessionRequest{AllowedCommands: []string{"echo"}})
	require.NoError(t, err)
	require.NoError(t, s.Close())

	s = newTestService(t, be, dir, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := s.CallTool(ctx, id, "shell", json.RawMessage(`{"command":"touch x"}`))
	require.NoError(t, err)
	assert.Contains(t, string(res), "is not allowed in this session")
}

// TestProfileToolsTakeBaseMeta: a profile's tool has the title and hints
// of the registry tool it maps onto, so MCP annotates it the same.
func TestProfileToolsTakeBaseMeta(t *testing.T) {
	for _, p := range Profiles()[1:] {
		for _, tool := range p.Tools() {
			base, ok := LookupTool(tool.Base)
			require.True(t, ok, "%s/%s", p.Name, tool.Name)
			assert.Equal(t, base.Meta, tool.Meta, "%s/%s", p.Name, tool.Name)
		}
	}
}
