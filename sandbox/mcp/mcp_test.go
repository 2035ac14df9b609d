package mcp_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/mcp"
)

// fakeCaller offers the real registry's tools; its calls answer canned
// results (the tools themselves are tested in package sandbox).
type fakeCaller struct {
	mu      sync.Mutex
	calls   []string // name + " " + args
	started chan struct{}
	ended   chan error // the context error of a blocking call
}

func newFake() *fakeCaller {
	return &fakeCaller{started: make(chan struct{}, 1), ended: make(chan error, 1)}
}

func (f *fakeCaller) Tools() []api.ToolInfo { return sandbox.ToolInfos() }

func (f *fakeCaller) Call(ctx context.Context, name string, args json.RawMessage) (json.RawMessage, error) {
	f.mu.Lock()
	f.calls = append(f.calls, name+" "+string(args))
	f.mu.Unlock()
	switch name {
	case "shell":
		return json.RawMessage("{\"is_error\": false,\n \"stdout\": \"hi\\n\", \"exit_code\": 0}"), nil
	case "read_file":
		return json.RawMessage(`{"is_error":true,"error":"read_file missing.txt in box \"default\": no such file"}`), nil
	case "ls":
		return nil, errors.New("session \"s-1\": no such session")
	case "glob":
		return json.RawMessage(`["not", "an object"]`), nil
	case "edit":
		panic("a bug in a tool")
	case "grep": // blocks until cancelled
		f.started <- struct{}{}
		<-ctx.Done()
		f.ended <- ctx.Err()
		return json.RawMessage(`{"is_error":true,"error":"cancelled"}`), nil
	}
	return json.RawMessage(`{"is_error":false}`), nil
}

func (f *fakeCaller) lastCall() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) == 0 {
		return ""
	}
	return f.calls[len(f.calls)-1]
}

func newServer(f *fakeCaller) *mcp.Server {
	return mcp.NewServer(f, mcp.Info{Name: "cellbox", Version: "test", Instructions: "use the tools"})
}

// answer handles msg and decodes the answer.
func answer(t *testing.T, s *mcp.Server, msg string) map[string]any {
	t.Helper()
	out := s.Handle(context.Background(), []byte(msg))
	require.NotNil(t, out, "an answer to %s", msg)
	assert.NotContains(t, string(out), "\n", "one line")
	var m map[string]any
	require.NoError(t, json.Unmarshal(out, &m), string(out))
	assert.Equal(t, "2.0", m["jsonrpc"])
	return m
}

func TestInitializeNegotiatesVersion(t *testing.T) {
	tests := []struct{ asked, want string }{
		{"2025-06-18", "2025-06-18"},
		{"2025-03-26", "2025-03-26"},
		{"2024-11-05", "2024-11-05"},
		{"2099-01-01", "2025-06-18"},
		{"", "2025-06-18"},
	}
	for _, tt := range tests {
		t.Run(tt.asked, func(t *testing.T) {
			m := answer(t, newServer(newFake()), `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"`+tt.asked+`","capabilities":{},"clientInfo":{"name":"test","version":"1"}}}`)
			assert.EqualValues(t, 1, m["id"])
			res := m["result"].(map[string]any)
			assert.Equal(t, tt.want, res["protocolVersion"])
			assert.Equal(t, map[string]any{"tools": map[string]any{"listChanged": false}}, res["capabilities"])
			assert.Equal(t, map[string]any{"name": "cellbox", "version": "test"}, res["serverInfo"])
			assert.Equal(t, "use the tools", res["instructions"])
		})
	}
}

func TestNotificationsAndResponsesGetNoAnswer(t *testing.T) {
	s := newServer(newFake())
	for _, msg := range []string{
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":99,"reason":"gone"}}`,
		`{"jsonrpc":"2.0","method":"notifications/unknown","params":[1]}`,
		`{"jsonrpc":"2.0","id":5,"result":{}}`,
		`{"jsonrpc":"2.0","id":6,"error":{"code":-1,"message":"no"}}`,
	} {
		assert.Nil(t, s.Handle(context.Background(), []byte(msg)), msg)
	}
}

func TestProtocolErrors(t *testing.T) {
	tests := []struct {
		name, msg string
		id        any
		code      float64
		message   string
	}{
		{"malformed JSON", `{"jsonrpc":"2.0","id":1,"method":`, nil, mcp.CodeParseError, "parse error: unexpected end of JSON input"},
		{"bad character", `{"jsonrpc":"2.0",x}`, nil, mcp.CodeParseError, "invalid character 'x' looking for beginning of object key string at offset 17"},
		{"empty", `  `, nil, mcp.CodeParseError, "empty message"},
		{"batch", `[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, nil, mcp.CodeInvalidRequest, "batches are not supported"},
		{"not an object", `42`, nil, mcp.CodeInvalidRequest, "must be an object, got a number"},
		{"id null", `{"jsonrpc":"2.0","id":null,"method":"ping"}`, nil, mcp.CodeInvalidRequest, "id must be a string or a number, got null"},
		{"old jsonrpc", `{"jsonrpc":"1.0","id":"a","method":"ping"}`, "a", mcp.CodeInvalidRequest, `"jsonrpc" must be "2.0"`},
		{"no method", `{"jsonrpc":"2.0","id":2}`, 2.0, mcp.CodeInvalidRequest, `missing "method"`},
		{"method not a string", `{"jsonrpc":"2.0","id":2,"method":7}`, 2.0, mcp.CodeInvalidRequest, `"method" must be a string`},
		{"unknown method", `{"jsonrpc":"2.0","id":3,"method":"resources/list"}`, 3.0, mcp.CodeMethodNotFound, `method "resources/list" not found`},
		{"params not an object", `{"jsonrpc":"2.0","id":4,"method":"tools/list","params":[]}`, 4.0, mcp.CodeInvalidParams, "params of tools/list must be an object, got an array"},
		{"cursor", `{"jsonrpc":"2.0","id":4,"method":"tools/list","params":{"cursor":"x"}}`, 4.0, mcp.CodeInvalidParams, `invalid cursor "x"`},
		{"unknown tool", `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"rm_rf"}}`, 5.0, mcp.CodeInvalidParams, `unknown tool "rm_rf"; tools: shell, process, read_file`},
		{"no tool name", `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"arguments":{}}}`, 5.0, mcp.CodeInvalidParams, `"name" must be a tool name`},
		{"no params", `{"jsonrpc":"2.0","id":5,"method":"tools/call"}`, 5.0, mcp.CodeInvalidParams, `"name" must be a tool name`},
		{"arguments an array", `{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"shell","arguments":["ls"]}}`, 6.0, mcp.CodeInvalidParams, "arguments of tool shell must be a JSON object, got an array"},
		{"arguments a string", `{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"shell","arguments":"{\"command\":\"ls\"}"}}`, 6.0, mcp.CodeInvalidParams, "got a string"},
		{"caller fault", `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"ls"}}`, 7.0, mcp.CodeInternalError, `tool ls: session "s-1": no such session`},
		{"result not an object", `{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"glob","arguments":{}}}`, 8.0, mcp.CodeInternalError, "not a JSON object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake()
			m := answer(t, newServer(f), tt.msg)
			assert.Equal(t, tt.id, m["id"])
			assert.NotContains(t, m, "result")
			e, ok := m["error"].(map[string]any)
			require.True(t, ok, "an error: %v", m)
			assert.Equal(t, tt.code, e["code"])
			assert.Contains(t, e["message"], tt.message)
			if tt.code != mcp.CodeInternalError {
				assert.Empty(t, f.calls, "no tool ran")
			}
		})
	}
}

func TestPing(t *testing.T) {
	m := answer(t, newServer(newFake()), `{"jsonrpc":"2.0","id":"p","method":"ping"}`)
	assert.Equal(t, "p", m["id"])
	assert.Equal(t, map[string]any{}, m["result"])
}

func TestToolsList(t *testing.T) {
	for _, params := range []string{``, `,"params":{}`, `,"params":null`} {
		m := answer(t, newServer(newFake()), `{"jsonrpc":"2.0","id":1,"method":"tools/list"`+params+`}`)
		tools := m["result"].(map[string]any)["tools"].([]any)
		require.Len(t, tools, len(sandbox.Tools()))
		byName := map[string]map[string]any{}
		for _, raw := range tools {
			tool := raw.(map[string]any)
			byName[tool["name"].(string)] = tool
			assert.NotEmpty(t, tool["description"], tool["name"])
			schema, ok := tool["inputSchema"].(map[string]any)
			require.True(t, ok, "%s has an inputSchema", tool["name"])
			assert.Equal(t, "object", schema["type"], "%s: MCP wants object schemas", tool["name"])
		}
		for _, name := range []string{"shell", "read_file", "write_file", "edit", "str_replace", "grep", "glob", "ls", "transfer", "browse", "sandbox_create"} {
			assert.Contains(t, byName, name)
		}
		shell := byName["shell"]["inputSchema"].(map[string]any)
		assert.Equal(t, []any{"command"}, shell["required"])
		assert.Contains(t, shell["properties"], "command")
	}
}

func TestToolsCall(t *testing.T) {
	t.Run("success", func(t *testing.T) {
		f := newFake()
		m := answer(t, newServer(f), `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"shell","arguments":{"command":"echo hi"}}}`)
		assert.Equal(t, `shell {"command":"echo hi"}`, f.lastCall())
		res := m["result"].(map[string]any)
		assert.Equal(t, false, res["isError"])
		want := `{"is_error":false,"stdout":"hi\n","exit_code":0}`
		assert.Equal(t, []any{map[string]any{"type": "text", "text": want}}, res["content"], "the result object as compact JSON text")
		assert.Equal(t, map[string]any{"is_error": false, "stdout": "hi\n", "exit_code": 0.0}, res["structuredContent"])
	})
	t.Run("is_error", func(t *testing.T) {
		m := answer(t, newServer(newFake()), `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"missing.txt"}}}`)
		res := m["result"].(map[string]any)
		assert.Equal(t, true, res["isError"])
		assert.Contains(t, res["content"].([]any)[0].(map[string]any)["text"], "no such file")
		assert.Equal(t, true, res["structuredContent"].(map[string]any)["is_error"])
	})
	t.Run("no arguments", func(t *testing.T) {
		for _, params := range []string{`{"name":"sandbox_list"}`, `{"name":"sandbox_list","arguments":null}`} {
			f := newFake()
			m := answer(t, newServer(f), `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":`+params+`}`)
			assert.Equal(t, false, m["result"].(map[string]any)["isError"])
			assert.Equal(t, "sandbox_list {}", f.lastCall())
		}
	})
}

// stdio drives Serve over pipes.
type stdio struct {
	t     *testing.T
	in    *io.PipeWriter
	lines chan map[string]any
	done  chan error
}

func startStdio(t *testing.T, s *mcp.Server) *stdio {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	c := &stdio{t: t, in: inW, lines: make(chan map[string]any, 16), done: make(chan error, 1)}
	go func() {
		c.done <- s.Serve(context.Background(), inR, outW)
		outW.Close()
	}()
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			var m map[string]any
			if !assert.NoError(t, json.Unmarshal(sc.Bytes(), &m), sc.Text()) {
				return
			}
			c.lines <- m
		}
	}()
	t.Cleanup(func() { inW.Close() })
	return c
}

func (c *stdio) send(msg string) {
	_, err := io.WriteString(c.in, msg+"\n")
	require.NoError(c.t, err)
}

func (c *stdio) next() map[string]any {
	select {
	case m, ok := <-c.lines:
		require.True(c.t, ok, "an answer")
		return m
	case <-time.After(10 * time.Second):
		c.t.Fatal("no answer")
	}
	return nil
}

func TestServeStdio(t *testing.T) {
	f := newFake()
	c := startStdio(t, newServer(f))
	c.send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}`)
	assert.EqualValues(t, 1, c.next()["id"])
	c.send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	c.send("")
	c.send(`{"jsonrpc":"2.0","id":"slow","method":"tools/call","params":{"name":"grep","arguments":{"pattern":"x"}}}`)
	<-f.started
	// A ping is answered while the tool call runs.
	c.send(`{"jsonrpc":"2.0","id":2,"method":"ping"}`)
	assert.EqualValues(t, 2, c.next()["id"])
	// Cancelling ends the call and suppresses its answer.
	c.send(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"slow","reason":"user"}}`)
	select {
	case err := <-f.ended:
		assert.ErrorIs(t, err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("the cancelled call did not end")
	}
	c.send(`not json`)
	assert.EqualValues(t, mcp.CodeParseError, c.next()["error"].(map[string]any)["code"])
	// A message over the cap is refused without ending the connection.
	c.send(`{"jsonrpc":"2.0","id":3,"method":"ping","params":{"pad":"` + strings.Repeat("x", mcp.MaxMessage) + `"}}`)
	assert.Contains(t, c.next()["error"].(map[string]any)["message"], "larger than")
	c.send(`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"shell","arguments":{"command":"echo hi"}}}`)
	res := c.next()
	assert.EqualValues(t, 4, res["id"])
	assert.Equal(t, "hi\n", res["result"].(map[string]any)["structuredContent"].(map[string]any)["stdout"])

	// A last request without a newline is answered before Serve returns.
	_, err := io.WriteString(c.in, `{"jsonrpc":"2.0","id":5,"method":"ping"}`)
	require.NoError(t, err)
	require.NoError(t, c.in.Close())
	assert.EqualValues(t, 5, c.next()["id"])
	select {
	case err := <-c.done:
		assert.NoError(t, err, "end of input is a normal stop")
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return at end of input")
	}
	_, more := <-c.lines
	assert.False(t, more, "no answer to the cancelled request")
}

func TestServeStopsWithContext(t *testing.T) {
	f := newFake()
	inR, inW := io.Pipe()
	defer inW.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- newServer(f).Serve(ctx, inR, io.Discard) }()
	go io.WriteString(inW, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"grep","arguments":{"pattern":"x"}}}`+"\n")
	<-f.started
	cancel()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, context.Canceled)
		assert.ErrorIs(t, <-f.ended, context.Canceled, "the call in flight was cancelled")
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not stop")
	}
}

func TestServeHTTP(t *testing.T) {
	srv := httptest.NewServer(newServer(newFake()))
	defer srv.Close()
	post := func(body string, header ...string) (int, http.Header, string) {
		req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, resp.Header, string(data)
	}
	tests := []struct {
		name    string
		body    string
		header  []string
		status  int
		content string // a substring of the body; "" means no body
	}{
		{"request", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"shell","arguments":{"command":"echo hi"}}}`, nil, 200, `"structuredContent":{"is_error":false,"stdout":"hi\n"`},
		{"tool error is a result", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"x"}}}`, []string{"MCP-Protocol-Version", "2025-06-18"}, 200, `"isError":true`},
		{"protocol error of a request", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"nope"}}`, nil, 200, `"code":-32602`},
		{"notification", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, nil, 202, ""},
		{"response", `{"jsonrpc":"2.0","id":9,"result":{}}`, nil, 202, ""},
		{"malformed", `{"jsonrpc":`, nil, 400, `"code":-32700`},
		{"batch", `[]`, nil, 400, `"code":-32600`},
		{"older version header", `{"jsonrpc":"2.0","id":1,"method":"ping"}`, []string{"MCP-Protocol-Version", "2025-03-26"}, 200, `"result":{}`},
		{"unsupported version header", `{"jsonrpc":"2.0","id":1,"method":"ping"}`, []string{"MCP-Protocol-Version", "1999-01-01"}, 400, `unsupported MCP-Protocol-Version \"1999-01-01\"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, h, body := post(tt.body, tt.header...)
			assert.Equal(t, tt.status, status, body)
			if tt.content == "" {
				assert.Empty(t, body)
				return
			}
			assert.Equal(t, "application/json", h.Get("Content-Type"))
			assert.Contains(t, body, tt.content)
		})
	}

	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "no event stream")
	assert.Equal(t, "POST", resp.Header.Get("Allow"))

	big := bytes.Repeat([]byte("x"), mcp.MaxMessage+1)
	status, _, body := post(string(big))
	assert.Equal(t, http.StatusRequestEntityTooLarge, status)
	assert.Contains(t, body, "larger than")
}

// TestPanicIsAnError: a panic while answering a request (here in the
// caller) is an internal error answer; the server keeps serving.
func TestPanicIsAnError(t *testing.T) {
	var stdout bytes.Buffer
	in := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"edit","arguments":{}}}` + "\n" +
		`{"jsonrpc":"2.0","id":2,"method":"ping"}` + "\n"
	require.NoError(t, newServer(newFake()).Serve(context.Background(), strings.NewReader(in), &stdout))
	answers := map[float64]map[string]any{}
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m))
		answers[m["id"].(float64)] = m
	}
	require.Len(t, answers, 2)
	e := answers[1]["error"].(map[string]any)
	assert.EqualValues(t, mcp.CodeInternalError, e["code"])
	assert.Contains(t, e["message"], "a bug in a tool")
	assert.NotNil(t, answers[2]["result"])
}
