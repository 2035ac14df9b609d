// Package mcpserver serves the tool registry (sandbox.Tools) over the Model
// Context Protocol with the official SDK
// (github.com/modelcontextprotocol/go-sdk), which owns the protocol:
// JSON-RPC, version negotiation, the stdio and Streamable HTTP transports,
// sessions, cancellation, progress and logging. This package is only the
// adapter from the registry to the SDK:
//
//   - a tool of the registry becomes an SDK tool with its title and
//     annotations (the tool's tools.Meta) and an output schema made
//     from its Go result type;
//   - a call goes through a ToolCaller (a session of a sandbox.Service, or
//     a remote server's) with the request's context, so
//     notifications/cancelled kills the command;
//   - shell output comes back as progress and log notifications;
//   - box files are resources (BoxResourceTemplate), read with read_file's
//     rules.
//
// It serves no transport itself: cellbox mcp runs a server of New or
// ForSession on stdio; sandbox/httpapi serves one on Streamable HTTP.
package mcpserver

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cellbox/cellbox/internal/jsonschema"
	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/tools"
)

// Instructions tell an MCP client's model how the tools fit together.
const Instructions = `These tools run commands and edit files in sandboxed Linux boxes of your session. ` +
	`A box is named by the "sandbox" field (default "default"), is created on first use and keeps its files between calls; ` +
	`relative paths are relative to /workspace. Boxes have no network unless given one: sandbox_create {"network": {"allow": [...]}} (an allow list, or true for all), or network_set on a running box. ` +
	`Use shell for commands (background: true for servers, then process), read_file/write_file/edit/str_replace/grep/glob/ls for files, ` +
	`transfer to copy between boxes, and browse to get a URL for a server listening in a box. ` +
	`Box files are also resources: ` + BoxResourceTemplate + ` (path relative to /workspace; //abs for an absolute path).`

// BoxResourceTemplate is the URI template of box files as MCP resources.
const BoxResourceTemplate = "cellbox://box/{sandbox}/{+path}"

// ToolCaller runs a tool of the registry for one session and returns its
// result object (with is_error). The error is for faults that are not the
// tool's: the session is gone, the server does not answer.
type ToolCaller interface {
	CallTool(ctx context.Context, name string, args json.RawMessage) (json.RawMessage, error)
}

// ToolCallerFunc adapts a function to ToolCaller.
type ToolCallerFunc func(ctx context.Context, name string, args json.RawMessage) (json.RawMessage, error)

// CallTool calls f.
func (f ToolCallerFunc) CallTool(ctx context.Context, name string, args json.RawMessage) (json.RawMessage, error) {
	return f(ctx, name, args)
}

// Binder picks the caller an MCP request runs with (which session's
// boxes). It sees the request's SDK session and, over HTTP, its headers
// and token info.
type Binder func(ctx context.Context, req mcp.Request) (ToolCaller, error)

// Implementation describes cellbox to MCP clients.
func Implementation() *mcp.Implementation {
	version := "dev"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		version = bi.Main.Version
	}
	return &mcp.Implementation{Name: "cellbox", Title: "cellbox sandboxes", Version: version}
}

// New returns an MCP server of tools (sandbox.ToolInfosFor(profile), or a
// remote server's list) whose calls and resource reads run through bind's
// caller. profile ("" for cellbox's own) names the tool set the tools are
// of: it gives each tool's metadata, output schema and text.
func New(profile string, tools []api.ToolInfo, bind Binder) *mcp.Server {
	srv := mcp.NewServer(Implementation(), &mcp.ServerOptions{
		Instructions: Instructions,
		// Capabilities nil: the SDK's default, {"logging":{}}, plus tools
		// and resources from what is added below.
	})
	for _, info := range tools {
		rt, _ := sandbox.LookupToolIn(profile, info.Name) // nil: a tool of a newer server
		srv.AddTool(mcpTool(info, rt), func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return callMCPTool(ctx, req, rt, bind)
		})
	}
	srv.AddResourceTemplate(&mcp.ResourceTemplate{
		Name:        "box-file",
		Title:       "File in a box",
		URITemplate: BoxResourceTemplate,
		Description: "A file in a sandbox (box) of this session, read with the read_file tool's rules: text as text, binary as a blob; at most " + fmt.Sprint(sandbox.MaxFileBytes>>20) + " MiB.",
	}, func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		caller, err := bind(ctx, req)
		if err != nil {
			return nil, err
		}
		return readBoxResource(ctx, caller, req.Params.URI)
	})
	return srv
}

// mcpTool describes a registry tool to the SDK.
func mcpTool(info api.ToolInfo, rt *tools.Tool) *mcp.Tool {
	t := &mcp.Tool{Name: info.Name, Description: info.Description, InputSchema: info.InputSchema}
	if rt == nil {
		return t // a tool of a newer server: described by its info only
	}
	m := rt.Meta
	t.Title = m.Title
	t.Annotations = &mcp.ToolAnnotations{
		Title:           m.Title,
		ReadOnlyHint:    m.ReadOnly,
		IdempotentHint:  m.Idempotent,
		DestructiveHint: &m.Destructive,
	}
	if !m.OpenWorld {
		t.Annotations.OpenWorldHint = new(bool)
	}
	t.OutputSchema = outputSchema(rt.Output)
	return t
}

// resultFields are the fields tools.AppendResult adds to every successful result.
var resultFields = map[string]any{
	"is_error": map[string]any{"type": "boolean", "description": "false: the tool ran (failures are results with isError and no structuredContent)"},
	"notice":   map[string]any{"type": "string", "description": "something worth knowing happened, e.g. a lost box was recreated"},
}

// outputSchema is the JSON Schema of a successful result of a tool whose
// output is of type out: its fields plus is_error and notice. An output
// that is an interface (shell answers one of two shapes) is any object.
func outputSchema(out reflect.Type) json.RawMessage {
	schema := map[string]any{"type": "object"}
	if out != nil && out.Kind() != reflect.Interface {
		raw := jsonschema.JSON(out)
		schema = map[string]any{}
		if err := json.Unmarshal(raw, &schema); err != nil {
			panic(fmt.Sprintf("mcpserver: output schema of %v: %v", out, err))
		}
	}
	props, _ := schema["properties"].(map[string]any)
	if props == nil {
		props = map[string]any{}
	}
	for k, v := range resultFields {
		props[k] = v
	}
	schema["properties"] = props
	required, _ := schema["required"].([]any)
	schema["required"] = append([]any{"is_error"}, required...)
	raw, err := json.Marshal(schema)
	if err != nil {
		panic(fmt.Sprintf("mcpserver: output schema of %v: %v", out, err))
	}
	return raw
}

// callMCPTool runs one tools/call. ctx is the request's: the SDK cancels
// it on notifications/cancelled (or when the session ends), which kills a
// running command.
func callMCPTool(ctx context.Context, req *mcp.CallToolRequest, rt *tools.Tool, bind Binder) (*mcp.CallToolResult, error) {
	caller, err := bind(ctx, req)
	if err != nil {
		// The call cannot run (no session could be made for it: the
		// server's session cap): a failed tool result with its code, as
		// any tool's failure, not a JSON-RPC error without one.
		text := string(sandbox.ErrorResult(err))
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}, IsError: true}, nil
	}
	name := req.Params.Name
	out := newOutputNotifier(ctx, req)
	res, err := caller.CallTool(tools.WithOutput(ctx, out.write), name, req.Params.Arguments)
	out.flush()
	if err != nil {
		return nil, fmt.Errorf("tool %s: %w", name, err)
	}
	var head struct {
		IsError bool            `json:"is_error"`
		Notice  string          `json:"notice"`
		Outputs json.RawMessage `json:"outputs"` // for imageContents: the result is parsed once
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, res); err != nil || json.Unmarshal(res, &head) != nil {
		return nil, fmt.Errorf("tool %s returned a result that is not a JSON object", name)
	}
	if head.Notice != "" {
		req.Session.Log(ctx, &mcp.LoggingMessageParams{Level: "notice", Logger: "cellbox", Data: head.Notice})
	}
	// The text is the whole result object, as the HTTP API answers it, for
	// clients that show only content. A failed call has no
	// structuredContent: it would not match the output schema, which
	// clients validate.
	text := compact.String()
	if rt != nil && rt.TextResult {
		text = rt.ResultText(compact.Bytes()) // a seed tool that answers a plain string
	}
	var images []mcp.Content
	if !head.IsError {
		images, text = imageContents(head.Outputs, text)
	}
	result := &mcp.CallToolResult{
		Content: append([]mcp.Content{&mcp.TextContent{Text: text}}, images...),
		IsError: head.IsError,
	}
	if !head.IsError {
		result.StructuredContent = json.RawMessage(compact.Bytes())
	}
	return result, nil
}

// imageContents returns the images among a result's rich outputs (its
// "outputs" field as raw JSON: run_code's, a plot as base64 PNG) as MCP
// image content, so that a client shows them (and a model sees them) as
// images, and text (the result as JSON) with each image's base64 replaced
// by a note saying where it went: a model was sent every plot twice, the
// second time as some 20,000 characters of base64 text. structuredContent
// keeps the data, for clients that read the result as data.
func imageContents(outputs json.RawMessage, text string) ([]mcp.Content, string) {
	var r []struct {
		MIME     string `json:"mime"`
		Data     string `json:"data"`
		Encoding string `json:"encoding"`
	}
	if len(outputs) == 0 || json.Unmarshal(outputs, &r) != nil {
		return nil, text
	}
	var out []mcp.Content
	for _, o := range r {
		if o.Encoding != "base64" || !strings.HasPrefix(o.MIME, "image/") {
			continue
		}
		b, err := base64.StdEncoding.DecodeString(o.Data)
		if err != nil {
			continue
		}
		out = append(out, &mcp.ImageContent{Data: b, MIMEType: o.MIME})
		// Base64 holds nothing JSON escapes, so the string stands in the
		// text as it is.
		note := fmt.Sprintf("(%s, %d bytes: image content %d of this result)", o.MIME, len(b), len(out)+1)
		text = strings.Replace(text, `"`+o.Data+`"`, strconv.Quote(note), 1)
	}
	return out, text
}

// maxNotifiedLine caps the text of one progress or log notification.
const maxNotifiedLine = 4 << 10

// outputNotifier turns a command's output into notifications, a line
// each: progress when the call has a progressToken, and log messages at
// level debug (sent only if the client asked for them with
// logging/setLevel). Streams are split into lines separately.
type outputNotifier struct {
	ctx     context.Context
	session *mcp.ServerSession
	token   any

	mu      sync.Mutex
	partial map[string][]byte // by stream: the unfinished last line
	n       float64           // progress so far: lines sent
}

func newOutputNotifier(ctx context.Context, req *mcp.CallToolRequest) *outputNotifier {
	return &outputNotifier{ctx: ctx, session: req.Session, token: req.Params.GetProgressToken(), partial: map[string][]byte{}}
}

func (o *outputNotifier) write(stream string, data []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	buf := append(o.partial[stream], data...)
	for {
		i := bytes.IndexByte(buf, '\n')
		if i < 0 {
			break
		}
		o.send(stream, buf[:i])
		buf = buf[i+1:]
	}
	if len(buf) > maxNotifiedLine {
		o.send(stream, buf)
		buf = nil
	}
	o.partial[stream] = append([]byte(nil), buf...)
}

// flush sends the unfinished lines.
func (o *outputNotifier) flush() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, stream := range []string{"stdout", "stderr"} {
		if len(o.partial[stream]) > 0 {
			o.send(stream, o.partial[stream])
		}
	}
	o.partial = map[string][]byte{}
}

func (o *outputNotifier) send(stream string, line []byte) {
	text := strings.ToValidUTF8(string(line[:min(len(line), maxNotifiedLine)]), "\uFFFD")
	if stream != "stdout" {
		text = stream + ": " + text
	}
	o.n++
	// A notification that cannot be sent (the client went away) changes
	// nothing for the command: the errors are dropped.
	if o.token != nil {
		o.session.NotifyProgress(o.ctx, &mcp.ProgressNotificationParams{ProgressToken: o.token, Progress: o.n, Message: text})
	}
	o.session.Log(o.ctx, &mcp.LoggingMessageParams{Level: "debug", Logger: stream, Data: text})
}

// resourceError is a failed resources/read as a JSON-RPC error: invalid
// params (-32602, also MCP's "resource not found") for what the client
// asked wrong, internal error (-32603) for what the server could not do
// (a fault, or unavailable: shutting down; the message says to read
// again once it is back). A plain error would reach the client with
// code 0.
func resourceError(code, msg string) error {
	c := int64(jsonrpc.CodeInvalidParams)
	if code == "" || code == api.CodeInternal || code == api.CodeUnavailable {
		c = jsonrpc.CodeInternalError
	}
	return &jsonrpc.Error{Code: c, Message: msg}
}

// readBoxResource reads the file a cellbox://box/{sandbox}/{+path} URI
// names with the read_file tool, window by window, so it follows that
// tool's rules (paths, sandboxes, binary as base64).
func readBoxResource(ctx context.Context, caller ToolCaller, uri string) (*mcp.ReadResourceResult, error) {
	box, path, err := parseBoxURI(uri)
	if err != nil {
		return nil, resourceError(api.CodeInvalidInput, err.Error())
	}
	if err := boxExists(ctx, caller, box, uri); err != nil {
		return nil, err
	}
	var (
		text     strings.Builder
		encoding string
	)
	for offset := 0; ; {
		args, err := json.Marshal(api.ReadFileInput{Sandbox: box, Path: path, Offset: offset})
		if err != nil {
			return nil, err
		}
		raw, err := caller.CallTool(ctx, "read_file", args)
		if err != nil {
			return nil, resourceError(sandbox.ErrorCode(err), fmt.Sprintf("read %s: %v", uri, err))
		}
		var out struct {
			api.ReadFileOutput
			IsError bool   `json:"is_error"`
			Error   string `json:"error"`
			Code    string `json:"code"`
		}
		if err := json.Unmarshal(raw, &out); err != nil {
			return nil, fmt.Errorf("read %s: %w", uri, err)
		}
		if out.IsError {
			return nil, resourceError(out.Code, fmt.Sprintf("read %s: %s", uri, out.Error))
		}
		if out.Size > sandbox.MaxFileBytes {
			return nil, resourceError(api.CodeTooLarge, fmt.Sprintf("read %s: the file has %d bytes, more than a resource may (%d); read it in windows with the read_file tool", uri, out.Size, sandbox.MaxFileBytes))
		}
		encoding = out.Encoding
		if encoding == "base64" && out.Truncated {
			return nil, resourceError(api.CodeTooLarge, fmt.Sprintf("read %s: a binary file of %d bytes is more than read_file returns at once; copy it out with the files endpoint (cellbox tool, or GET /v1/sessions/ID/boxes/BOX/files/PATH)", uri, out.Size))
		}
		text.WriteString(out.Content)
		if out.NextOffset == 0 || encoding == "base64" {
			break
		}
		offset = out.NextOffset
	}
	if encoding == "base64" {
		blob, err := base64.StdEncoding.DecodeString(text.String())
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", uri, err)
		}
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: "application/octet-stream", Blob: blob}}}, nil
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: "text/plain; charset=utf-8", Text: text.String()}}}, nil
}

// boxExists fails with a resource-not-found error naming the session's
// sandboxes unless it has one named box: reading a resource must not make
// a box (read_file, a tool, makes the box it names), which a mistyped URI
// did, taking one of the session's sandboxes.
func boxExists(ctx context.Context, caller ToolCaller, box, uri string) error {
	raw, err := caller.CallTool(ctx, "sandbox_list", json.RawMessage(`{}`))
	if err != nil {
		return resourceError(sandbox.ErrorCode(err), fmt.Sprintf("read %s: %v", uri, err))
	}
	var list api.SandboxListOutput
	if err := json.Unmarshal(raw, &list); err != nil {
		return fmt.Errorf("read %s: %w", uri, err)
	}
	var names []string
	for _, s := range list.Sandboxes {
		if s.Name == box {
			return nil
		}
		names = append(names, s.Name)
	}
	e := mcp.ResourceNotFoundError(uri)
	if je, ok := e.(*jsonrpc.Error); ok {
		je.Message = fmt.Sprintf("%s: this session has no sandbox named %q (it has: %s); make it with a tool call, e.g. sandbox_create", je.Message, box, cmp.Or(strings.Join(names, ", "), "none"))
	}
	return e
}

// parseBoxURI splits cellbox://box/SANDBOX/PATH; PATH is relative to
// /workspace, or absolute when it starts with a slash (cellbox://box/b//etc/hosts).
func parseBoxURI(uri string) (box, path string, err error) {
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != "cellbox" || u.Host != "box" {
		return "", "", mcp.ResourceNotFoundError(uri)
	}
	box, path, ok := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/")
	if !ok || box == "" || path == "" {
		return "", "", errors.New("resource URI " + uri + " names no file: use " + BoxResourceTemplate)
	}
	return box, path, nil
}

// ForSession returns an MCP server of profile's tools ("" for cellbox's
// own) that runs every call in session id of svc, for a client that is the
// only one of the session (cellbox mcp on stdio). The session no longer
// expires when idle.
func ForSession(svc *sandbox.Service, id, profile string) (*mcp.Server, error) {
	tools, err := sandbox.ToolInfosFor(profile)
	if err != nil {
		return nil, err
	}
	if err := svc.Pin(id); err != nil {
		return nil, err
	}
	caller := SessionCaller(svc, id, profile)
	return New(profile, tools, func(context.Context, mcp.Request) (ToolCaller, error) { return caller, nil }), nil
}

// SessionCaller runs profile's tools in session id of svc.
func SessionCaller(svc *sandbox.Service, id, profile string) ToolCaller {
	return ToolCallerFunc(func(ctx context.Context, name string, args json.RawMessage) (json.RawMessage, error) {
		return svc.CallToolAs(ctx, id, profile, name, args)
	})
}
