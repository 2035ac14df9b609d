// Package patterns is the authoring front-end of cellbox: it reads a pattern
// written in YAML (Load, Parse) or built in Go (New), validates it and
// produces a Pattern, a description of the pattern's cells and nodes that the
// runtime compiles into a graph. Errors name the file, the line and the field
// and suggest the nearest valid name. The language is documented in
// docs/patterns.md.
package patterns

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/cellbox/cellbox/sandbox/api"
)

// Pattern is a validated pattern description. A YAML file and the
// equivalent Go builder calls produce equal Patterns, except for Source.
type Pattern struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Dir is the pattern folder: the folder `file:` references were read
	// from ("" when there is none).
	Dir   string `json:"dir,omitempty"`
	Cells []Cell `json:"cells,omitempty"` // in declaration order
	Nodes []Node `json:"nodes,omitempty"` // in declaration order
	// Source maps field paths ("nodes.clean.exec.command") to where they
	// were written. It is where the pattern came from, not what it means.
	Source map[string]Pos `json:"-"`
}

// Cell is an input cell.
type Cell struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Value is the initial value, compact JSON; nil when the cell starts
	// empty (null). A null initial value is not checked against Schema.
	Value json.RawMessage `json:"value,omitempty"`
	// File is the file of the pattern folder the value was read from (the
	// value is then its text), or "".
	File string `json:"file,omitempty"`
	// Schema is a JSON Schema the cell's values must satisfy, or nil.
	Schema json.RawMessage `json:"schema,omitempty"`
}

// Kind is a node kind.
type Kind string

// The node kinds.
const (
	KindComputed Kind = "computed"
	KindExec     Kind = "exec"
	KindSandbox  Kind = "sandbox"
	KindFetch    Kind = "fetch"
	KindLLM      Kind = "llm"
)

// kinds lists the node kinds a pattern may use; planned lists those that are
// reserved for later.
var (
	kinds   = []string{string(KindComputed), string(KindExec), string(KindSandbox), string(KindFetch), string(KindLLM)}
	planned = []string{}
)

// Node is a node of the graph. Exactly one of Computed, Exec, Sandbox and
// Fetch is set, as Kind says.
type Node struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Kind        Kind   `json:"kind"`
	// Reads lists the cells and nodes the node's expressions read, sorted.
	Reads    []string     `json:"reads,omitempty"`
	Computed Value        `json:"computed,omitzero"` // an expression or a template
	Exec     *ExecSpec    `json:"exec,omitempty"`
	Sandbox  *SandboxSpec `json:"sandbox,omitempty"`
	Fetch    *FetchSpec   `json:"fetch,omitempty"`
	LLM      *LLMSpec     `json:"llm,omitempty"`
}

// LLMSpec describes an llm node: call a chat model (and run the tool loop
// when it has tools) whenever an input changes. Output: {pending, result:
// {text, messages, tool_calls, usage, stop_reason, turns}, error}.
type LLMSpec struct {
	// Provider is "anthropic" or "openai" (any OpenAI-compatible server);
	// "" is the runner's CELLBOX_LLM_PROVIDER. Keys and base URLs come from
	// the runner's environment.
	Provider string `json:"provider"`
	Model    Value  `json:"model"`
	System   Value  `json:"system,omitzero"`
	// Prompt (a user message) or Messages (a list of {role, content}).
	Prompt   Value `json:"prompt,omitzero"`
	Messages Value `json:"messages,omitzero"`
	// Numbers (literals or expressions); unset leaves the defaults.
	MaxTokens   Value `json:"max_tokens,omitzero"`
	Temperature Value `json:"temperature,omitzero"`
	MaxTurns    Value `json:"max_turns,omitzero"`
	// Tools gives the model a sandbox node's tools.
	Tools *LLMTools `json:"tools,omitempty"`
	// NoCache turns memoization off (YAML `cache: false`).
	NoCache bool `json:"no_cache,omitempty"`
	// Timeout bounds one run (all turns): a duration such as 5m, or an
	// expression giving one; unset means the runner's default.
	Timeout Value `json:"timeout,omitzero"`
}

// llmField is a Value field of an llm node, by its YAML name; a literal
// must be a number or a duration when the field says so.
type llmField struct {
	name             string
	v                *Value
	number, duration bool
}

func (s *LLMSpec) fields() []llmField {
	return []llmField{
		{"model", &s.Model, false, false}, {"system", &s.System, false, false},
		{"prompt", &s.Prompt, false, false}, {"messages", &s.Messages, false, false},
		{"max_tokens", &s.MaxTokens, true, false}, {"temperature", &s.Temperature, true, false},
		{"max_turns", &s.MaxTurns, true, false}, {"timeout", &s.Timeout, false, true},
	}
}

// LLMTools names the sandbox node whose box the model's tools act on and
// the tools it gets (Allow; empty is every tool about one box except those
// that make, remove or re-make boxes or change a network: see
// builtins.BoxTools).
type LLMTools struct {
	Sandbox string   `json:"sandbox"`
	Allow   []string `json:"allow,omitempty"`
}

// ExecSpec describes an exec node: run Command in a fresh box whenever an
// input changes. Output: {pending, result: {stdout, stderr, exit_code,
// files}, error}.
type ExecSpec struct {
	// Command is one command or several run in order in one box, stopping
	// at the first failure. Each item evaluates to a string (or a list of
	// strings, which is spliced in).
	Command []Value `json:"command"`
	// Image is the box image; unset means the runner's default image.
	Image Value            `json:"image,omitzero"`
	Env   map[string]Value `json:"env,omitempty"`
	// Files maps absolute paths in the box to inputs (literal, expression,
	// template, file of the pattern) written before the run and outputs
	// (OutputText, OutputJSON) read back after it into result.files.
	Files map[string]Value `json:"files,omitempty"`
	// NoCache turns memoization off (YAML `cache: false`), for commands
	// with side effects.
	NoCache bool `json:"no_cache,omitempty"`
	// Timeout bounds one run (all commands); 0 means the runner's default.
	Timeout time.Duration `json:"timeout,omitempty"`
	// Network is each run's box network (YAML `network:`), as a sandbox
	// node's: nil or false closed, true full, or an allow list.
	Network *api.Network `json:"network,omitempty"`
}

// SandboxSpec describes a sandbox node: a box that lives while the pattern
// runs, takes commands on its `run` stream and is removed by `destroy`.
// Output: {pending, status, history, files, previews}. Input files are
// rewritten in the box whenever their value changes; output files update
// `files` whenever they change in the box.
type SandboxSpec struct {
	Image Value            `json:"image,omitzero"`
	Env   map[string]Value `json:"env,omitempty"`
	Files map[string]Value `json:"files,omitempty"`
	// Ports are TCP ports (1-65535) a server in the box listens on; the
	// node publishes a preview URL of each in previews["PORT"] while the
	// box runs.
	Ports []int `json:"ports,omitempty"`
	// Start is a server the node keeps running in its box (YAML `start:`).
	Start *StartSpec `json:"start,omitempty"`
	// Network is the box's network (YAML `network:`): nil or false closed,
	// true full, or an allow list through the host's egress proxy, as
	// sandbox_create's network.
	Network *api.Network `json:"network,omitempty"`
	// Snapshot is the id of a snapshot (of the runner's session, e.g. one
	// a snapshot event of a sandbox node took) whose workspace a newly
	// made box starts with; a reattached box keeps its own files.
	Snapshot Value `json:"snapshot,omitzero"`
}

// StartSpec is a sandbox node's supervised server: a command run whenever
// the box comes up (made, woken, reattached after a restart, remade),
// restarted with backoff when it exits; its state and the tail of its
// output are the node's `server`. YAML: `start: "cmd"`, or
// `start: {command: "cmd", port: 8000}` (ready once the port accepts
// connections) or `{command: "cmd", ready: "probe cmd"}` (ready once the
// probe exits 0).
type StartSpec struct {
	Command Value `json:"command"`
	// Port, if set, is the TCP port in the box whose accepting connections
	// makes the server ready.
	Port int `json:"port,omitempty"`
	// Ready, if set, is a command run in the box until it exits 0, which
	// makes the server ready.
	Ready Value `json:"ready,omitzero"`
}

// FetchSpec describes a fetch node: an HTTP request the runner sends (not
// a box) whenever an input changes. Output: {pending, result: {status,
// headers, body}, error}.
type FetchSpec struct {
	// URL is the http or https URL.
	URL Value `json:"url"`
	// Method is the HTTP method; unset means GET.
	Method  Value            `json:"method,omitzero"`
	Headers map[string]Value `json:"headers,omitempty"`
	// SecretHeaders maps a header to the name of the runner's environment
	// variable holding its value; the value is never stored.
	SecretHeaders map[string]string `json:"secret_headers,omitempty"`
	// Body is the request body; an object or list is sent as JSON.
	Body Value `json:"body,omitzero"`
	// Format is how the response body is read: "text" (the default) or
	// "json".
	Format string `json:"format,omitempty"`
	// NoCache turns memoization off (YAML `cache: false`).
	NoCache bool `json:"no_cache,omitempty"`
	// Timeout bounds one request; 0 means the runner's default (30s).
	Timeout time.Duration `json:"timeout,omitempty"`
	// MaxBytes caps the response body; 0 means the default (10 MiB).
	MaxBytes int64 `json:"max_bytes,omitempty"`
}

// ValueKind says how a Value is obtained.
type ValueKind string

// The value kinds.
const (
	ValueLiteral  ValueKind = "literal"  // Text, verbatim
	ValueExpr     ValueKind = "expr"     // the value of Expr (any JSON value)
	ValueTemplate ValueKind = "template" // Parts joined into a string
	ValueFile     ValueKind = "file"     // Text, read from Path in the pattern folder
	ValueOutput   ValueKind = "output"   // a file read back from the box, as Format says (files only)
)

// Value is what a node field is set to. The zero Value is "not set".
type Value struct {
	Kind   ValueKind `json:"kind"`
	Text   string    `json:"text,omitempty"`   // literal; file: the file's content
	Expr   string    `json:"expr,omitempty"`   // expr: the expression, without ${ }
	Parts  []Part    `json:"parts,omitempty"`  // template
	Path   string    `json:"path,omitempty"`   // file: relative to the pattern folder
	Format string    `json:"format,omitempty"` // output: "text" or "json"

	err error // from Str: a malformed ${…}, reported by Build
}

// Part is a piece of a template: literal Text or an expression (Expr).
type Part struct {
	Text string `json:"text,omitempty"`
	Expr string `json:"expr,omitempty"`
}

// IsZero reports whether v is unset.
func (v Value) IsZero() bool { return v.Kind == "" && v.err == nil }

// Exprs returns the expressions v evaluates.
func (v Value) Exprs() []string {
	switch v.Kind {
	case ValueExpr:
		return []string{v.Expr}
	case ValueTemplate:
		var out []string
		for _, p := range v.Parts {
			if p.Expr != "" {
				out = append(out, p.Expr)
			}
		}
		return out
	}
	return nil
}

// String renders v the way it is written in YAML.
func (v Value) String() string {
	switch v.Kind {
	case ValueLiteral:
		return strings.ReplaceAll(v.Text, "${", "$${")
	case ValueExpr:
		return "${" + v.Expr + "}"
	case ValueTemplate:
		var b strings.Builder
		for _, p := range v.Parts {
			if p.Expr != "" {
				b.WriteString("${" + p.Expr + "}")
			} else {
				b.WriteString(strings.ReplaceAll(p.Text, "${", "$${"))
			}
		}
		return b.String()
	case ValueFile:
		return "{file: " + v.Path + "}"
	case ValueOutput:
		return v.Format
	}
	return ""
}

// Output formats of files read back from a box.
var (
	OutputText = Value{Kind: ValueOutput, Format: "text"} // the file's text
	OutputJSON = Value{Kind: ValueOutput, Format: "json"} // the file parsed as JSON
)

// Literal is the string s, verbatim: `${` in it is plain text.
func Literal(s string) Value { return Value{Kind: ValueLiteral, Text: s} }

// Expr is the value of the expression src (written without ${ }).
func Expr(src string) Value { return Value{Kind: ValueExpr, Expr: strings.TrimSpace(src)} }

// Ref is the value of the cell or node called name.
func Ref(name string) Value { return Expr(name) }

// FromFile is the text of the file at path, relative to the pattern folder.
func FromFile(path string) Value { return Value{Kind: ValueFile, Path: path} }

// Str reads s the way a YAML string is read: `${expr}` alone is an
// expression, `${…}` amid text makes a template, `$${` is a literal `${`,
// anything else is literal text. A malformed `${` is reported by Build.
func Str(s string) Value {
	v, err := parseString(s)
	if err != nil {
		return Value{Kind: ValueLiteral, Text: s, err: err}
	}
	return v
}

// Command is a command list from strings read as Str reads them.
func Command(commands ...string) []Value {
	out := make([]Value, len(commands))
	for i, c := range commands {
		out[i] = Str(c)
	}
	return out
}

// Strings is a map of values (env, files) from strings read as Str reads
// them.
func Strings(m map[string]string) map[string]Value {
	out := make(map[string]Value, len(m))
	for k, s := range m {
		out[k] = Str(s)
	}
	return out
}

// Pos is a place in a source file.
type Pos struct {
	File string `json:"file,omitempty"`
	Line int    `json:"line,omitempty"`
	Col  int    `json:"col,omitempty"`
}

// String is "file:line", "file" or "line N".
func (p Pos) String() string {
	switch {
	case p.File != "" && p.Line > 0:
		return p.File + ":" + strconv.Itoa(p.Line)
	case p.File != "":
		return p.File
	case p.Line > 0:
		return "line " + strconv.Itoa(p.Line)
	}
	return ""
}

// Where returns where the field at path was written: the position of the
// longest recorded prefix of path.
func (p *Pattern) Where(path string) Pos {
	for {
		if pos, ok := p.Source[path]; ok {
			return pos
		}
		i := strings.LastIndexAny(path, ".[")
		if i <= 0 {
			return p.Source[""]
		}
		path = path[:i]
	}
}

// Cell returns the cell called name.
func (p *Pattern) Cell(name string) (*Cell, bool) {
	for i := range p.Cells {
		if p.Cells[i].Name == name {
			return &p.Cells[i], true
		}
	}
	return nil, false
}

// Node returns the node called name.
func (p *Pattern) Node(name string) (*Node, bool) {
	for i := range p.Nodes {
		if p.Nodes[i].Name == name {
			return &p.Nodes[i], true
		}
	}
	return nil, false
}

// field returns path extended by key: ".key" for a plain key, `["key"]`
// otherwise (file paths).
func field(path, key string) string {
	plain := key != ""
	for _, r := range key {
		if !(r == '_' || r == '-' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			plain = false
			break
		}
	}
	switch {
	case !plain:
		return path + "[" + strconv.Quote(key) + "]"
	case path == "":
		return key
	}
	return path + "." + key
}

// index returns path extended by a list index.
func index(path string, i int) string { return fmt.Sprintf("%s[%d]", path, i) }
