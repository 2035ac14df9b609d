package sandbox

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/cellbox/cellbox/internal/fastjson"

	"github.com/cellbox/cellbox/internal/jsonschema"
	"github.com/cellbox/cellbox/internal/safe"
	"github.com/cellbox/cellbox/sandbox/api"
)

// Tool is one tool of the registry: the HTTP API, MCP, the CLI and the LLM
// built-in all serve these.
type Tool struct {
	Name        string
	Description string
	// InputSchema is the JSON Schema of the input, generated from the input
	// struct.
	InputSchema json.RawMessage
	// Input is the input struct's type.
	Input reflect.Type
	// Output is the result struct's type (the fields of a successful
	// result, beside is_error); docs/tools.md is generated from both.
	Output reflect.Type
	// Profile is the tool profile the tool belongs to (DefaultProfile for
	// the registry itself; see profiles.go).
	Profile string
	// Base is, for a profile's tool, the registry tool whose handler serves
	// it (its annotations apply); "" for the registry's own tools.
	Base string
	// TextResult says the tool's seed returns a plain string: the result's
	// "output" field is what a model should see (see ResultText).
	TextResult bool
	// Meta is the tool's title and behaviour hints (MCP's annotations).
	Meta ToolMeta

	fields   []string // property names, sorted
	required []string
	// strings are the input's string fields by JSON name (their index
	// paths), which decode fills from long raw strings directly.
	stringIdx map[string][]int
	run       func(ctx context.Context, c *call, raw json.RawMessage) (any, error)
}

// ErrUnknownTool is returned (wrapped) by CallTool for a name the registry
// does not have.
var ErrUnknownTool = errors.New("unknown tool")

// ToolMeta is what a tool says about itself beyond its input and output:
// a title for people and the hints a client uses to decide whether to ask
// before calling it (MCP's tool annotations). Every tool has one, given
// where the tool is defined (defineTool refuses a tool without a title).
type ToolMeta struct {
	Title string
	// ReadOnly: the tool changes nothing.
	ReadOnly bool
	// Destructive: the tool may delete or overwrite (meaningful when not
	// ReadOnly).
	Destructive bool
	// Idempotent: calling it again with the same input changes nothing
	// more.
	Idempotent bool
	// OpenWorld: the tool may reach beyond the session's boxes (a command
	// with network access); false for tools that work on the boxes only.
	OpenWorld bool
}

// defineTool makes a Tool whose input is In; the handler gets the decoded
// input (unknown fields and missing required ones are refused before).
func defineTool[In any, Out any](name string, meta ToolMeta, description string, h func(ctx context.Context, c *call, in In) (Out, error)) *Tool {
	if meta.Title == "" {
		panic("sandbox: tool " + name + " has no title: give its ToolMeta where it is defined")
	}
	var zero In
	schema := jsonschema.For(reflect.TypeOf(zero))
	raw, err := json.Marshal(schema)
	if err != nil {
		panic(fmt.Sprintf("sandbox: schema of tool %s: %v", name, err))
	}
	var out Out
	t := &Tool{Name: name, Description: description, InputSchema: raw, Input: reflect.TypeOf(zero), Output: reflect.TypeOf(out), Profile: DefaultProfile, Meta: meta}
	t.fields = slices.Sorted(maps.Keys(schema.Properties))
	t.required = schema.Required
	t.stringIdx = stringFields(reflect.TypeOf(zero))
	t.run = func(ctx context.Context, c *call, raw json.RawMessage) (any, error) {
		var in In
		if err := t.decode(raw, &in); err != nil {
			return nil, api.WithCode(api.CodeInvalidInput, err)
		}
		return h(ctx, c, in)
	}
	return t
}

// decode checks raw against the tool's fields and decodes it into in, with
// errors a model can act on.
func (t *Tool) decode(raw json.RawMessage, in any) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		raw = json.RawMessage("{}")
	}
	fields, err := fastjson.SplitObject(raw) // one fast pass, however long the content
	if err != nil {
		return fmt.Errorf("the input of %s must be a JSON object with the fields %s", t.Name, strings.Join(t.fields, ", "))
	}
	// A long string that fastjson.Unquote decodes below has its escapes checked
	// there, in the same pass; here only its UTF-8.
	viaRaw := t.allStrings(fields)
	for _, k := range sortedNames(fields) {
		check := validText
		if viaRaw && isLong(fields[k]) {
			check = utf8.Valid
		}
		if !check(fields[k]) {
			return t.badText(k)
		}
		if !contains(t.fields, k) {
			valid := "it takes no fields"
			if len(t.fields) > 0 {
				valid = "valid fields: " + strings.Join(t.fields, ", ")
			}
			return fmt.Errorf("unknown field %q in the input of %s; %s", k, t.Name, valid)
		}
	}
	// null for an optional field means "not given": models send it for
	// every field they leave out.
	dropped := false
	for k, v := range fields {
		if string(v) == "null" && !contains(t.required, k) {
			delete(fields, k)
			dropped = true
		}
	}
	if dropped {
		if raw, err = json.Marshal(fields); err != nil {
			return fmt.Errorf("input of %s: %w", t.Name, err)
		}
	}
	for _, k := range t.required {
		if _, ok := fields[k]; !ok {
			return fmt.Errorf("missing required field %q in the input of %s (required: %s)", k, t.Name, strings.Join(t.required, ", "))
		}
	}
	sk := skeleton(raw, fields)
	if err := jsonschema.Validate(t.InputSchema, sk); err != nil {
		var ve *jsonschema.ValidationError
		if errors.As(err, &ve) {
			problems := make([]string, len(ve.Violations))
			for i, v := range ve.Violations {
				problems[i] = strings.TrimPrefix(v.String(), "/")
			}
			return fmt.Errorf("invalid input of %s: %s", t.Name, strings.Join(problems, "; "))
		}
		return fmt.Errorf("invalid input of %s: %w", t.Name, err)
	}
	// A long input (write_file's content) is decoded from its skeleton, its
	// long strings set directly: a second full parse of a megabyte costs
	// more than the rest of the call.
	target, long := raw, map[string]json.RawMessage(nil)
	switch {
	case viaRaw && len(sk) < len(raw):
		target, long = sk, fields
	case viaRaw: // no skeleton after all: the escapes are checked here
		for k, v := range fields {
			if isLong(v) && !validText(v) {
				return t.badText(k)
			}
		}
	}
	if err := json.Unmarshal(target, in); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return fmt.Errorf("field %q of %s: expected %s, got %s", te.Field, t.Name, jsonKind(te.Type), te.Value)
		}
		return fmt.Errorf("input of %s: %w", t.Name, err)
	}
	for k, v := range long {
		if !isLong(v) {
			continue
		}
		s, err := fastjson.Unquote(v)
		if errors.Is(err, fastjson.ErrLoneSurrogate) {
			return t.badText(k)
		}
		if err != nil {
			return fmt.Errorf("field %q of %s: %w", k, t.Name, err)
		}
		reflect.ValueOf(in).Elem().FieldByIndex(t.stringIdx[k]).SetString(s)
	}
	return nil
}

// allStrings reports whether every long string value of the input goes to
// a string field (so that the skeleton's "" stands for it); otherwise
// decode parses the whole input.
func (t *Tool) allStrings(fields map[string]json.RawMessage) bool {
	for k, v := range fields {
		if isLong(v) {
			if _, ok := t.stringIdx[k]; !ok {
				return false
			}
		}
	}
	return true
}

// isLong reports whether v is a string value skeleton elides.
func isLong(v json.RawMessage) bool { return len(v) > fastjson.LongString && v[0] == '"' }

// badText is decode's error for a field that is not valid text.
func (t *Tool) badText(field string) error {
	hint := ""
	if field == "content" {
		hint = t.base64Hint() // bytes go as base64 in content, never in a path or command
	}
	return fmt.Errorf("field %q of %s is not valid UTF-8 (or holds a lone surrogate escape such as \\udc80); send text as UTF-8%s", field, t.Name, hint)
}

// stringFields maps the JSON names of a struct type's string fields to
// their index paths.
func stringFields(typ reflect.Type) map[string][]int {
	out := map[string][]int{}
	if typ == nil || typ.Kind() != reflect.Struct {
		return out
	}
	for _, f := range reflect.VisibleFields(typ) {
		if !f.IsExported() || f.Anonymous || f.Type.Kind() != reflect.String {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || strings.Contains(opts, "string") {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Index
	}
	return out
}

// base64Hint tells how to send bytes, for the tools that take them.
func (t *Tool) base64Hint() string {
	if contains(t.fields, "encoding") {
		return `, or bytes base64-encoded with "encoding": "base64"`
	}
	return ""
}

// validText reports whether the raw JSON value v holds only valid UTF-8
// and no lone UTF-16 surrogate escape. encoding/json would silently turn
// either into U+FFFD, so a command, path or content would not be what the
// caller sent.
func validText(v []byte) bool {
	if !utf8.Valid(v) {
		return false
	}
	pending := false // the last escape was a high surrogate
	for i := 0; i < len(v); {
		// Only escapes matter: jump to the next backslash.
		j := bytes.IndexByte(v[i:], '\\')
		if j < 0 {
			break
		}
		if j > 0 && pending {
			return false
		}
		i += j
		if i+1 >= len(v) {
			break
		}
		if v[i+1] != 'u' || i+6 > len(v) {
			if pending {
				return false
			}
			i += 2 // an escaped character: skip it (it may be a backslash)
			continue
		}
		r, err := strconv.ParseUint(string(v[i+2:i+6]), 16, 16)
		if err != nil {
			return false
		}
		i += 6
		switch {
		case r >= 0xd800 && r < 0xdc00:
			if pending {
				return false
			}
			pending = true
		case r >= 0xdc00 && r < 0xe000:
			if !pending {
				return false
			}
			pending = false
		default:
			if pending {
				return false
			}
		}
	}
	return !pending
}

// skeleton is the input to check against the schema: raw, with long
// strings (file contents) replaced by "". No tool constrains a long
// string beyond its type, and the schema validator would parse it again.
func skeleton(raw json.RawMessage, fields map[string]json.RawMessage) json.RawMessage {
	if len(raw) < fastjson.LongString {
		return raw
	}
	short := make(map[string]json.RawMessage, len(fields))
	for k, v := range fields {
		if isLong(v) {
			v = json.RawMessage(`""`)
		}
		short[k] = v
	}
	out, err := json.Marshal(short)
	if err != nil {
		return raw
	}
	return out
}

func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "a boolean"
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct, reflect.Pointer:
		return "an object"
	}
	return t.String()
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

var (
	registryOnce sync.Once
	registry     map[string]*Tool
	toolOrder    []*Tool
)

// Tools returns the registry, in a stable order.
func Tools() []*Tool {
	registryOnce.Do(func() {
		registry = map[string]*Tool{}
		for _, t := range allTools() {
			if registry[t.Name] != nil {
				panic("sandbox: tool defined twice: " + t.Name)
			}
			registry[t.Name] = t
			toolOrder = append(toolOrder, t)
		}
	})
	return toolOrder
}

// LookupTool returns the tool called name.
func LookupTool(name string) (*Tool, bool) {
	Tools()
	t, ok := registry[name]
	return t, ok
}

// ToolInfos describes every tool of the default profile (GET /v1/tools).
func ToolInfos() []api.ToolInfo { return toolInfos(Tools()) }

func toolInfos(tools []*Tool) []api.ToolInfo {
	var out []api.ToolInfo
	for _, t := range tools {
		out = append(out, api.ToolInfo{Name: t.Name, Description: t.Description, InputSchema: t.InputSchema})
	}
	return out
}

func toolNames(tools []*Tool) []string {
	var names []string
	for _, t := range tools {
		names = append(names, t.Name)
	}
	sort.Strings(names)
	return names
}

// call is one tool call: its session, the boxes it leased and the notices
// for the result.
type call struct {
	s       *Service
	sess    *Session
	mu      sync.Mutex // guards notices: a heal may add one from a goroutine of the call
	notices []string
	leases  []*lease
}

// box leases the session's box name (lazily created, woken if asleep)
// until the call ends.
func (c *call) box(ctx context.Context, name string) (*lease, error) {
	return c.lease(ctx, name, false)
}

// existingBox is box for a tool that has nothing to do with a new, empty
// sandbox (snapshot, fork): a name the session has no sandbox of is no_box.
func (c *call) existingBox(ctx context.Context, name string) (*lease, error) {
	return c.lease(ctx, name, true)
}

func (c *call) lease(ctx context.Context, name string, mustExist bool) (*lease, error) {
	l, err := c.s.acquireBox(ctx, c.sess, name, c.notice, mustExist)
	if err != nil {
		return nil, err
	}
	c.leases = append(c.leases, l)
	return l, nil
}

func (c *call) notice(n string) {
	c.mu.Lock()
	c.notices = append(c.notices, n)
	c.mu.Unlock()
}

func (c *call) done() {
	for _, l := range c.leases {
		l.release()
	}
}

// CallTool runs tool name for session id with the JSON input raw and
// returns the result object: the tool's output plus "is_error" (and
// "error" with a message a model can act on when it failed, "notice" when
// something happened worth knowing, e.g. a lost box was recreated). The
// error is non-nil only for an unknown session or tool.
func (s *Service) CallTool(ctx context.Context, sessionID, name string, raw json.RawMessage) (json.RawMessage, error) {
	return s.CallToolAs(ctx, sessionID, DefaultProfile, name, raw)
}

// CallToolAs is CallTool with the tool named as in profile ("" is the
// default profile); an unknown profile is an ErrUnknownProfile.
func (s *Service) CallToolAs(ctx context.Context, sessionID, profile, name string, raw json.RawMessage) (json.RawMessage, error) {
	return s.AppendToolResult(ctx, nil, sessionID, profile, name, raw)
}

// AppendToolResult is CallToolAs appending the result object to dst: the
// HTTP API renders a result (a read_file window is 256 KiB) into a buffer
// it keeps for the next call. The call keeps nothing of raw: it may be
// reused once this returns.
func (s *Service) AppendToolResult(ctx context.Context, dst []byte, sessionID, profile, name string, raw json.RawMessage) (json.RawMessage, error) {
	t, err := LookupToolIn(profile, name)
	if err != nil {
		return nil, err
	}
	sess, err := s.session(sessionID)
	if err != nil {
		return nil, err
	}
	return s.callTool(ctx, dst, sess, t, raw)
}

func (s *Service) callTool(ctx context.Context, dst []byte, sess *Session, t *Tool, raw json.RawMessage) (json.RawMessage, error) {
	name := t.Name
	if t.Profile != DefaultProfile {
		name = t.Profile + "/" + t.Name // the metric's label
	}
	start := time.Now()
	c := &call{s: s, sess: sess}
	out, err := s.runTool(withCall(ctx, sess, c.notice), t, c, raw)
	if err != nil {
		for _, l := range c.leases {
			err = s.explain(ctx, sess, l, err)
		}
		// The caller ended the call with a reason (a server that
		// stops): that is the answer (what failed then is the echo of
		// it in the agent's connection), with the reason's code, or
		// unavailable: the call did not fail, it was not let finish,
		// and may be made again once the server is back. (The one
		// caller that gives a reason is cellbox's HTTP server when its
		// --shutdown-grace runs out; its reason has no code.)
		if cause := context.Cause(ctx); ctx.Err() != nil && cause != ctx.Err() {
			err = api.WithCode(cmp.Or(api.CodeOf(cause), api.CodeUnavailable), cause)
		}
	}
	c.done()
	s.metrics.observeTool(name, err == nil, time.Since(start))
	if err != nil {
		s.log.Debug("tool failed", "tool", name, "session", sess.ID, "err", err)
	}
	return toolResult(dst, out, err, c.notices), nil
}

// runTool runs t's handler; a panic in it is an error result.
func (s *Service) runTool(ctx context.Context, t *Tool, c *call, raw json.RawMessage) (out any, err error) {
	defer safe.Recover(s.log, "tool "+t.Name, &err)
	return t.run(ctx, c, raw)
}

// ErrorResult is the result object of a call that failed with err before
// any tool ran (a face that could not bind it to a session): what
// CallTool answers for a failed tool, {"is_error": true, "error", "code"}.
func ErrorResult(err error) json.RawMessage { return toolResult(nil, nil, err, nil) }

// toolResult appends a result object to dst: {"is_error":..., ["error", "code"], ["notice"], output fields...}.
// It is written into one buffer: the output is most often one long
// content, which fastjson quotes straight into it.
func toolResult(dst []byte, out any, err error, notices []string) json.RawMessage {
	start := len(dst)
	buf := dst
	head := func(isError bool) {
		buf = append(buf[:start], `{"is_error":`...)
		buf = strconv.AppendBool(buf, isError)
		if isError {
			buf = append(buf, `,"error":`...)
			buf = fastjson.AppendString(buf, err.Error(), false)
			buf = append(buf, `,"code":`...)
			buf = fastjson.AppendString(buf, ErrorCode(err), false)
		}
		if len(notices) > 0 {
			buf = append(buf, `,"notice":`...)
			buf = fastjson.AppendString(buf, strings.Join(notices, "; "), false)
		}
	}
	if err == nil {
		head(false)
		n := len(buf)
		var merr error
		buf, merr = fastjson.AppendMarshal(buf, out, false)
		switch body := buf[n:]; {
		case merr != nil:
			err = fmt.Errorf("encode result: %w", merr)
		case len(body) < 2 || body[0] != '{':
			err = errors.New("tool result is not an object")
		case len(body) == 2: // {}: no output fields
			return append(buf[:n], '}')
		default: // the output's fields follow the head's
			body[0] = ','
			return buf
		}
	}
	head(true)
	return append(buf, '}')
}
