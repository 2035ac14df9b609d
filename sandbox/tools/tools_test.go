package tools_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/tools"
)

type echoIn struct {
	Path    string `json:"path"`
	Content string `json:"content,omitempty"`
	Count   int    `json:"count,omitempty"`
}

type echoOut struct {
	Path    string `json:"path"`
	Content string `json:"content"`
	Count   int    `json:"count"`
	By      string `json:"by"`
}

// caller is a per-call value, as the sandbox's call is.
type caller struct{ name string }

func echo(_ context.Context, c *caller, in echoIn) (echoOut, error) {
	return echoOut{Path: in.Path, Content: in.Content, Count: in.Count, By: c.name}, nil
}

func echoTool() *tools.Tool {
	return tools.Define("echo", tools.Meta{Title: "Echo", ReadOnly: true}, "Echo the input.", echo)
}

// TestToolNeedsMeta: a tool defined without its title and hints is refused
// where it is defined, so none reaches MCP unannotated.
func TestToolNeedsMeta(t *testing.T) {
	assert.PanicsWithValue(t, "tools: tool x has no title: give its Meta where it is defined", func() { tools.Define("x", tools.Meta{}, "d", echo) })
	assert.NotPanics(t, func() { tools.Define("x", tools.Meta{Title: "X", ReadOnly: true}, "d", echo) })
}

// TestRunDecodes: Run hands the handler the decoded input and the per-call
// value; a null optional field is "not given".
func TestRunDecodes(t *testing.T) {
	long := strings.Repeat("é", 40<<10) // past fastjson's long-string threshold: decoded from the skeleton
	for _, raw := range []string{`{"path":"a","count":2}`, `{"path":"a","count":2,"content":null}`, `{"path":"a","count":2,"content":"` + long + `"}`} {
		out, err := echoTool().Run(context.Background(), &caller{name: "me"}, json.RawMessage(raw))
		require.NoError(t, err, raw[:min(len(raw), 60)])
		got := out.(echoOut)
		assert.Equal(t, "a", got.Path)
		assert.Equal(t, 2, got.Count)
		assert.Equal(t, "me", got.By)
		if strings.Contains(raw, long) {
			assert.Equal(t, long, got.Content, "a long string arrives whole")
		}
	}
}

// TestRunRefusesBadInput: every refusal is invalid_input and says what to
// send instead.
func TestRunRefusesBadInput(t *testing.T) {
	for _, tc := range []struct{ raw, want string }{
		{`[]`, "the input of echo must be a JSON object with the fields content, count, path"},
		{`{"path":"a","size":1}`, `unknown field "size" in the input of echo; valid fields: content, count, path`},
		{`{}`, `missing required field "path" in the input of echo (required: path)`},
		{`{"path":null}`, `path: must be string (got null)`},
		{`{"path":"a","count":"two"}`, "count"},
		{`{"path":"\udc80"}`, `field "path" of echo is not valid UTF-8`},
		{"{\"path\":\"a\xff\"}", `field "path" of echo is not valid UTF-8`},
	} {
		_, err := echoTool().Run(context.Background(), &caller{}, json.RawMessage(tc.raw))
		require.Error(t, err, tc.raw)
		assert.Contains(t, err.Error(), tc.want, tc.raw)
		assert.Equal(t, api.CodeInvalidInput, api.CodeOf(err), tc.raw)
	}
}

// TestSet: a profile's tool maps onto a default tool and takes its Meta;
// lookups of unknown names are typed errors that list what exists.
func TestSet(t *testing.T) {
	base := echoTool()
	mapped := tools.Map(base, "say", "Say it.", func(ctx context.Context, c *caller, in echoIn) (tools.TextOutput, error) {
		return tools.TextOutput{Output: in.Path}, nil
	})
	set := tools.NewSet(tools.NewProfile("own", "ours", []*tools.Tool{base}), tools.NewProfile("other", "theirs", []*tools.Tool{mapped}))
	assert.Equal(t, "echo", mapped.Base)
	assert.Equal(t, base.Meta, mapped.Meta)
	assert.True(t, mapped.TextResult)
	assert.False(t, base.TextResult)
	assert.Equal(t, "other", mapped.Profile)
	assert.Equal(t, "own", base.Profile)

	got, err := set.Lookup("", "echo")
	require.NoError(t, err)
	assert.Same(t, base, got)
	_, err = set.Lookup("other", "sya")
	assert.True(t, errors.Is(err, tools.ErrUnknownTool), "%v", err)
	assert.Contains(t, err.Error(), `did you mean "say"`)
	_, err = set.Profile("nope")
	assert.True(t, errors.Is(err, tools.ErrUnknownProfile), "%v", err)
	assert.Contains(t, err.Error(), "profiles: own, other")

	assert.Equal(t, "hi\n(note)", mapped.ResultText(json.RawMessage(`{"is_error":false,"notice":"note","output":"hi"}`)))
	assert.Equal(t, "Error: no", mapped.ResultText(json.RawMessage(`{"is_error":true,"error":"no"}`)))

	assert.Panics(t, func() { tools.NewProfile("p", "", []*tools.Tool{base, base}) }, "two tools of one name")
	orphan := tools.Map(echoTool(), "x", "", echo)
	orphan.Base = "gone"
	assert.Panics(t, func() {
		tools.NewSet(tools.NewProfile("own", "", []*tools.Tool{echoTool()}), tools.NewProfile("o", "", []*tools.Tool{orphan}))
	})
}

// TestAppendResult: the head, then the output's fields; an output that is
// not an object is an internal error, not a malformed result.
func TestAppendResult(t *testing.T) {
	assert.JSONEq(t, `{"is_error":false,"notice":"a; b","ok":true}`, string(tools.AppendResult(nil, api.OKOutput{OK: true}, nil, "", []string{"a", "b"})))
	assert.JSONEq(t, `{"is_error":true,"error":"no","code":"not_found"}`, string(tools.AppendResult(nil, nil, errors.New("no"), api.CodeNotFound, nil)))
	assert.JSONEq(t, `{"is_error":true,"error":"tool result is not an object","code":"internal"}`, string(tools.AppendResult(nil, 3, nil, "", nil)))
	assert.Equal(t, `kept{"is_error":false}`, string(tools.AppendResult([]byte("kept"), struct{}{}, nil, "", nil)))
}
