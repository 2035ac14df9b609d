// Package mcp serves a tool registry over the Model Context Protocol
// (JSON-RPC 2.0, protocol revision 2025-06-18): initialize, ping,
// tools/list, tools/call and the notifications initialized and cancelled.
//
// Server.Handle answers one message and knows no transport; Serve runs the
// stdio transport (newline-delimited messages) and ServeHTTP the Streamable
// HTTP transport without server-sent event streams (one message per POST,
// answered as application/json).
//
// A tool that runs and fails is a result with isError: true, which the
// model sees and can act on; an unknown tool or arguments that are not an
// object are JSON-RPC errors.
package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/cellbox/cellbox/internal/safe"
	"github.com/cellbox/cellbox/sandbox/api"
)

// ProtocolVersion is the MCP revision this server speaks.
const ProtocolVersion = "2025-06-18"

// SupportedVersions are the revisions a client may ask for in initialize;
// the server answers with the same one. Any other gets ProtocolVersion.
// The older revisions differ only in features this server does not use
// (their clients ignore structuredContent).
var SupportedVersions = []string{ProtocolVersion, "2025-03-26", "2024-11-05"}

// JSON-RPC error codes.
const (
	CodeParseError     = -32700
	CodeInvalidRequest = -32600
	CodeMethodNotFound = -32601
	CodeInvalidParams  = -32602
	CodeInternalError  = -32603
)

// MaxMessage caps one incoming message.
const MaxMessage = 16 << 20

// Caller is the tool registry the server offers, bound to one session.
type Caller interface {
	// Tools lists the tools.
	Tools() []api.ToolInfo
	// Call runs tool name with the JSON object args and returns its result
	// object (with is_error). The error is for faults that are not the
	// tool's (the session is gone, the server does not answer).
	Call(ctx context.Context, name string, args json.RawMessage) (json.RawMessage, error)
}

// Info describes the server in the answer to initialize.
type Info struct {
	Name    string
	Version string
	// Instructions tell the model how to use the tools (optional).
	Instructions string
}

// Server answers MCP messages with the tools of a Caller. It holds no
// per-connection state but the requests in flight (for
// notifications/cancelled), so one Server serves one connection.
type Server struct {
	caller Caller
	info   Info

	mu       sync.Mutex
	inflight map[string]context.CancelCauseFunc // by request id (raw JSON)
}

// NewServer returns a server of caller's tools.
func NewServer(caller Caller, info Info) *Server {
	return &Server{caller: caller, info: info, inflight: map[string]context.CancelCauseFunc{}}
}

// Supported reports whether version is one of SupportedVersions.
func Supported(version string) bool {
	for _, v := range SupportedVersions {
		if v == version {
			return true
		}
	}
	return false
}

// message is any JSON-RPC message; raw fields tell absent from null.
type message struct {
	JSONRPC json.RawMessage `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  json.RawMessage `json:"method"`
	Params  json.RawMessage `json:"params"`
	Result  json.RawMessage `json:"result"`
	Error   json.RawMessage `json:"error"`
}

// rpcError is a JSON-RPC error object.
type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func errorf(code int, format string, args ...any) *rpcError {
	return &rpcError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// errCancelled ends a request the client cancelled; it gets no answer.
var errCancelled = errors.New("cancelled by the client")

// Handle answers one JSON-RPC message. The answer is nil when none is due:
// for a notification, or a response (this server sends no requests).
func (s *Server) Handle(ctx context.Context, msg []byte) []byte {
	answer, _ := s.handle(ctx, msg)
	return answer
}

// handle answers msg; rejected is true when the message was not a valid
// request at all (parse error, invalid request), which HTTP answers with 400.
// A panic while answering is an internal error answer, not a dead server.
func (s *Server) handle(ctx context.Context, msg []byte) (answer []byte, rejected bool) {
	var err error
	defer func() {
		if err != nil {
			var m struct {
				ID json.RawMessage `json:"id"`
			}
			if json.Unmarshal(msg, &m) != nil || len(m.ID) == 0 || !validID(m.ID) {
				m.ID = nil
			}
			answer, rejected = encodeError(m.ID, errorf(CodeInternalError, "%v", err)), false
		}
	}()
	defer safe.Recover(nil, "MCP request", &err)
	return s.answer(ctx, msg)
}

func (s *Server) answer(ctx context.Context, msg []byte) (answer []byte, rejected bool) {
	msg = bytes.TrimSpace(msg)
	if len(msg) == 0 {
		return encodeError(nil, errorf(CodeParseError, "parse error: empty message; send one JSON-RPC 2.0 request object")), true
	}
	var m message
	if err := json.Unmarshal(msg, &m); err != nil {
		var se *json.SyntaxError
		switch {
		case errors.As(err, &se):
			return encodeError(nil, errorf(CodeParseError, "parse error: %v at offset %d", err, max(se.Offset-1, 0))), true
		case msg[0] == '[':
			return encodeError(nil, errorf(CodeInvalidRequest, "JSON-RPC batches are not supported (MCP %s): send one message at a time", ProtocolVersion)), true
		}
		return encodeError(nil, errorf(CodeInvalidRequest, "invalid request: a JSON-RPC message must be an object, got %s", kind(msg))), true
	}
	id := m.ID
	if id != nil && !validID(id) {
		return encodeError(nil, errorf(CodeInvalidRequest, "invalid request: id must be a string or a number, got %s", kind(id))), true
	}
	if string(m.JSONRPC) != `"2.0"` {
		return encodeError(id, errorf(CodeInvalidRequest, `invalid request: "jsonrpc" must be "2.0"`)), true
	}
	if m.Method == nil {
		if id != nil && (m.Result != nil || m.Error != nil) {
			return nil, false // a response; this server sends no requests
		}
		return encodeError(id, errorf(CodeInvalidRequest, `invalid request: missing "method"`)), true
	}
	var method string
	if err := json.Unmarshal(m.Method, &method); err != nil {
		return encodeError(id, errorf(CodeInvalidRequest, `invalid request: "method" must be a string, got %s`, kind(m.Method))), true
	}
	params := bytes.TrimSpace(m.Params)
	if len(params) > 0 && params[0] != '{' && string(params) != "null" {
		if id == nil {
			return nil, false
		}
		return encodeError(id, errorf(CodeInvalidParams, "params of %s must be an object, got %s", method, kind(params))), false
	}
	if id == nil {
		s.notify(method, params)
		return nil, false
	}
	result, rerr := s.dispatch(ctx, id, method, params)
	switch {
	case rerr == noAnswer:
		return nil, false
	case rerr != nil:
		return encodeError(id, rerr), false
	}
	out, err := json.Marshal(response{JSONRPC: "2.0", ID: id, Result: result})
	if err != nil {
		return encodeError(id, errorf(CodeInternalError, "encode result of %s: %v", method, err)), false
	}
	return out, false
}

// noAnswer is the "error" of a request the client cancelled: the spec asks
// for no response to it.
var noAnswer = &rpcError{Code: CodeInternalError, Message: "cancelled"}

type response struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  any             `json:"result,omitempty"`
	Error   *rpcError       `json:"error,omitempty"`
}

func encodeError(id json.RawMessage, e *rpcError) []byte {
	if id == nil {
		id = json.RawMessage("null")
	}
	out, _ := json.Marshal(response{JSONRPC: "2.0", ID: id, Error: e})
	return out
}

// validID: MCP request ids are strings or numbers (never null).
func validID(id json.RawMessage) bool {
	switch c := id[0]; {
	case c == '"', c == '-', c >= '0' && c <= '9':
		return true
	}
	return false
}

// kind names the JSON type of raw, for error messages.
func kind(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "nothing"
	}
	switch c := raw[0]; {
	case c == '{':
		return "an object"
	case c == '[':
		return "an array"
	case c == '"':
		return "a string"
	case c == 't', c == 'f':
		return "a boolean"
	case c == 'n':
		return "null"
	}
	return "a number"
}

// notify handles a notification.
func (s *Server) notify(method string, params json.RawMessage) {
	if method != "notifications/cancelled" {
		return // notifications/initialized and anything else need nothing
	}
	var p struct {
		RequestID json.RawMessage `json:"requestId"`
	}
	if json.Unmarshal(params, &p) != nil || p.RequestID == nil {
		return
	}
	s.mu.Lock()
	cancel := s.inflight[string(p.RequestID)]
	s.mu.Unlock()
	if cancel != nil {
		cancel(errCancelled)
	}
}

func (s *Server) dispatch(ctx context.Context, id json.RawMessage, method string, params json.RawMessage) (any, *rpcError) {
	switch method {
	case "initialize":
		return s.initialize(params)
	case "ping":
		return struct{}{}, nil
	case "tools/list":
		return s.listTools(params)
	case "tools/call":
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		key := string(id)
		s.mu.Lock()
		s.inflight[key] = cancel
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			delete(s.inflight, key)
			s.mu.Unlock()
		}()
		res, rerr := s.callTool(ctx, params)
		if errors.Is(context.Cause(ctx), errCancelled) {
			return nil, noAnswer
		}
		return res, rerr
	}
	return nil, errorf(CodeMethodNotFound, "method %q not found; this server offers initialize, ping, tools/list and tools/call", method)
}

func (s *Server) initialize(params json.RawMessage) (any, *rpcError) {
	var p struct {
		ProtocolVersion json.RawMessage `json:"protocolVersion"`
	}
	if len(params) > 0 {
		json.Unmarshal(params, &p) // params is an object: cannot fail
	}
	version := ProtocolVersion
	var asked string
	if json.Unmarshal(p.ProtocolVersion, &asked) == nil && Supported(asked) {
		version = asked
	}
	type implementation struct {
		Name    string `json:"name"`
		Version string `json:"version"`
	}
	return struct {
		ProtocolVersion string         `json:"protocolVersion"`
		Capabilities    any            `json:"capabilities"`
		ServerInfo      implementation `json:"serverInfo"`
		Instructions    string         `json:"instructions,omitempty"`
	}{
		ProtocolVersion: version,
		Capabilities:    map[string]any{"tools": map[string]bool{"listChanged": false}},
		ServerInfo:      implementation{Name: s.info.Name, Version: s.info.Version},
		Instructions:    s.info.Instructions,
	}, nil
}

// tool is one entry of tools/list.
type tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"inputSchema"`
}

func (s *Server) listTools(params json.RawMessage) (any, *rpcError) {
	var p struct {
		Cursor string `json:"cursor"`
	}
	if len(params) > 0 {
		if err := json.Unmarshal(params, &p); err != nil {
			return nil, errorf(CodeInvalidParams, "params of tools/list: %v", err)
		}
	}
	if p.Cursor != "" {
		return nil, errorf(CodeInvalidParams, "invalid cursor %q: tools/list answers all tools at once, without nextCursor", p.Cursor)
	}
	infos := s.caller.Tools()
	tools := make([]tool, len(infos))
	for i, t := range infos {
		tools[i] = tool{Name: t.Name, Description: t.Description, InputSchema: t.InputSchema}
	}
	return struct {
		Tools []tool `json:"tools"`
	}{tools}, nil
}

// callResult is the result of tools/call.
type callResult struct {
	Content           []textContent   `json:"content"`
	StructuredContent json.RawMessage `json:"structuredContent"`
	IsError           bool            `json:"isError"`
}

type textContent struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

func (s *Server) callTool(ctx context.Context, params json.RawMessage) (any, *rpcError) {
	var p struct {
		Name      json.RawMessage `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if len(params) > 0 {
		json.Unmarshal(params, &p) // params is an object: cannot fail
	}
	var name string
	if p.Name == nil || json.Unmarshal(p.Name, &name) != nil || name == "" {
		return nil, errorf(CodeInvalidParams, `tools/call needs params {"name": TOOL, "arguments": {...}}; "name" must be a tool name (see tools/list)`)
	}
	var names []string
	found := false
	for _, t := range s.caller.Tools() {
		names = append(names, t.Name)
		found = found || t.Name == name
	}
	if !found {
		return nil, errorf(CodeInvalidParams, "unknown tool %q; tools: %s", name, strings.Join(names, ", "))
	}
	args := bytes.TrimSpace(p.Arguments)
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage("{}")
	}
	if args[0] != '{' {
		return nil, errorf(CodeInvalidParams, "arguments of tool %s must be a JSON object, got %s", name, kind(args))
	}
	res, err := s.caller.Call(ctx, name, args)
	if err != nil {
		return nil, errorf(CodeInternalError, "tool %s: %v", name, err)
	}
	var compact bytes.Buffer
	var head struct {
		IsError bool `json:"is_error"`
	}
	if err := json.Compact(&compact, res); err != nil || json.Unmarshal(res, &head) != nil || compact.Bytes()[0] != '{' {
		return nil, errorf(CodeInternalError, "tool %s returned a result that is not a JSON object", name)
	}
	return callResult{
		Content:           []textContent{{Type: "text", Text: compact.String()}},
		StructuredContent: compact.Bytes(),
		IsError:           head.IsError,
	}, nil
}
