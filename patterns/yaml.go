package patterns

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/cellbox/cellbox/internal/readall"
	"github.com/cellbox/cellbox/internal/suggest"
	"github.com/cellbox/cellbox/sandbox/api"

	"go.yaml.in/yaml/v4"
)

// FileName is the pattern file Load looks for in a folder.
const FileName = "pattern.yaml"

// Load reads and validates the pattern at path: a pattern file, or a folder
// holding pattern.yaml. `file:` references are read from the file's folder.
func Load(path string) (*Pattern, error) {
	file, dir := path, filepath.Dir(path)
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		file, dir = filepath.Join(path, FileName), path
	}
	st, err := os.Stat(file)
	if err != nil {
		return nil, fmt.Errorf("load pattern: %w", err)
	}
	// A pipe is read (`cellbox run <(make-pattern)`), opened without
	// blocking: a FIFO nobody writes to reads as empty instead of hanging.
	flag := os.O_RDONLY
	switch {
	case st.Mode()&fs.ModeNamedPipe != 0:
		flag |= syscall.O_NONBLOCK
	case !st.Mode().IsRegular():
		return nil, fmt.Errorf("load pattern %s: %s, not a regular file or a pipe; give a pattern file or its folder", file, fileKind(st))
	case !strings.HasSuffix(file, ".yaml") && !strings.HasSuffix(file, ".yml"):
		// Not read: its lines would come back in the errors (a pattern
		// loaded by path over the API could show any file the server reads).
		return nil, fmt.Errorf("load pattern %s: not a .yaml file; give a pattern folder (holding %s) or a .yaml file", file, FileName)
	}
	f, err := os.OpenFile(file, flag, 0)
	if err != nil {
		return nil, fmt.Errorf("load pattern: %w", err)
	}
	defer f.Close()
	src, err := readCapped(f, maxFileSize)
	if err != nil {
		return nil, fmt.Errorf("load pattern %s: %w", file, err)
	}
	return parse(file, dir, src, folderFS(dir))
}

// readCapped reads r to its end, or fails once it passed max bytes: a
// file that grows while it is read (or a device that Stat called empty)
// cannot fill the memory.
func readCapped(r io.Reader, max int64) ([]byte, error) {
	b, err := readall.Capped(r, max)
	if errors.Is(err, readall.ErrTooLarge) {
		return nil, fmt.Errorf("more than the %d bytes a pattern file may have", max)
	}
	return b, err
}

// fileKind names what a file that is not a regular file is. Patterns read
// only regular files (and a pattern file from a pipe): a device may never
// end, and opening a FIFO blocks until someone writes to it.
func fileKind(st fs.FileInfo) string {
	switch t := st.Mode().Type(); {
	case t&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case t&fs.ModeSocket != 0:
		return "a socket"
	case t&fs.ModeDevice != 0:
		return "a device"
	case t&fs.ModeDir != 0:
		return "a folder"
	}
	return "a special file"
}

// Parse reads and validates a pattern from YAML source. filename names it in
// errors; dir is the pattern folder `file:` references are read from (nil
// when there is none).
func Parse(filename string, src []byte, dir fs.FS) (*Pattern, error) {
	return parse(filename, "", src, dir)
}

// errReported marks a field whose problem the loader already reported, so
// the checker does not report it again.
var errReported = errors.New("reported")

// The fields of each mapping of the language.
var (
	topFields     = []string{"name", "description", "cells", "nodes"}
	cellFields    = []string{"value", "file", "schema", "description"}
	nodeFields    = append(slices.Clone(kinds), "description")
	execFields    = []string{"command", "image", "env", "files", "cache", "timeout", "network"}
	sandboxFields = []string{"image", "env", "files", "ports", "start", "network", "snapshot"}
	startFields   = []string{"command", "port", "ready"}
	fetchFields   = []string{"url", "method", "headers", "secret_headers", "body", "format", "cache", "timeout", "max_bytes"}
	llmFields     = []string{"provider", "model", "system", "prompt", "messages", "tools", "max_tokens", "temperature", "max_turns", "cache", "timeout"}
	llmToolFields = []string{"sandbox", "allow"}
	fileFields    = []string{"file", "content", "output"}
)

// maxYAMLNodes caps how many YAML nodes a value may expand to (aliases can
// make a small file expand exponentially).
const maxYAMLNodes = 1 << 20

// MaxDepth is how deeply a cell's value may nest lists and objects, in a
// pattern and through the runtime API alike.
const MaxDepth = 1000

type loader struct {
	file   string
	p      *Pattern
	e      *errs
	budget int  // YAML nodes values may still expand to
	tooBig bool // the budget ran out (reported once)
	// expanding are the anchored nodes value is inside of: an alias to
	// one of them is a value that contains itself.
	expanding map[*yaml.Node]bool
}

func parse(file, dir string, src []byte, fsys fs.FS) (*Pattern, error) {
	p := &Pattern{Dir: dir, Source: map[string]Pos{"": {File: file}}}
	l := &loader{file: file, p: p, e: &errs{where: p.Where}, budget: maxYAMLNodes}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(src))
	err := dec.Decode(&doc)
	switch {
	case errors.Is(err, io.EOF):
		return nil, ErrorList{{Pos: Pos{File: file}, Msg: "empty pattern: it needs at least a name (see docs/patterns.md)"}}
	case err != nil:
		pos := Pos{File: file}
		msg := strings.TrimPrefix(err.Error(), "yaml: ")
		var le *yaml.LoadError
		if errors.As(err, &le) {
			// yaml/v4 reports where it gave up (Mark, 1-based) and the
			// construct it was in (ContextMark). An unclosed {, [ or quote
			// is only noticed lines later, so name the line it opens on.
			mark := le.Mark
			if (strings.HasPrefix(le.ContextMsg, "while parsing a flow") || le.ContextMsg == "while scanning a quoted scalar") && le.ContextMark.Line > 0 {
				mark = le.ContextMark
			}
			pos.Line, pos.Col, msg = mark.Line, mark.Column, le.Message
			if lines := strings.Split(string(src), "\n"); pos.Line >= 1 && pos.Line <= len(lines) && strings.Contains(strings.Join(lines[pos.Line-1:min(pos.Line+1, len(lines))], "\n"), "${") {
				msg += ` (inside {…} or […] YAML needs ${…} quoted: '${x}')`
			}
		}
		return nil, ErrorList{{Pos: pos, Msg: "malformed YAML: " + msg}}
	}
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return nil, ErrorList{{Pos: Pos{File: file, Line: more.Line}, Msg: "more than one YAML document: a pattern file holds one"}}
	}
	if l.top(&doc) {
		check(p, fsys, l.e)
	}
	if err := l.e.err(); err != nil {
		return nil, err
	}
	return p, nil
}

func (l *loader) pos(n *yaml.Node) Pos { return Pos{File: l.file, Line: n.Line, Col: n.Column} }

func (l *loader) errAt(n *yaml.Node, path, format string, args ...any) {
	l.e.list = append(l.e.list, &Error{Pos: l.pos(n), Path: shortPath(path), Msg: fmt.Sprintf(format, args...)})
}

// shortPath cuts the middle out of a path of a deep value (up to MaxDepth
// levels), so that an error stays a line: its start and its end.
func shortPath(path string) string {
	const keep = 60
	if len(path) <= 2*keep+20 {
		return path
	}
	// A cut may split a key's multi-byte rune: its halves are dropped, as
	// sandbox/agent's middle does.
	return strings.ToValidUTF8(path[:keep], "") + fmt.Sprintf("…(%d bytes)…", len(path)-2*keep) + strings.ToValidUTF8(path[len(path)-keep:], "")
}

// deref follows aliases and unwraps a document.
func deref(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && i < 100; i++ {
		switch {
		case n.Kind == yaml.AliasNode:
			n = n.Alias
		case n.Kind == yaml.DocumentNode && len(n.Content) == 1:
			n = n.Content[0]
		default:
			return n
		}
	}
	return n
}

type entry struct {
	key, val *yaml.Node
	path     string
}

// pairs reads a mapping whose keys are names the user chose (cells, nodes,
// env, files): it reports non-mappings, non-scalar and repeated keys and
// records where each entry was written.
func (l *loader) pairs(n *yaml.Node, path, what string) []entry {
	n = deref(n)
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		l.errAt(n, path, "want a mapping of %s, got %s", what, describe(n))
		return nil
	}
	var out []entry
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			l.errAt(k, path, "a key must be a plain name, got %s", describe(k))
			continue
		}
		at := field(path, k.Value)
		if k.ShortTag() == "!!merge" {
			l.errAt(k, at, "merge keys (<<) are not supported; write the fields out (aliases such as *name are fine)")
			continue
		}
		if prev, dup := seen[k.Value]; dup {
			l.errAt(k, at, "%q is defined twice (first at %s)", k.Value, l.pos(prev))
			continue
		}
		seen[k.Value] = k
		l.p.Source[at] = l.pos(k)
		out = append(out, entry{key: k, val: v, path: at})
	}
	return out
}

// fields reads a mapping of the language's own fields; unknown fields are
// reported with the nearest valid one. hint, when not empty, is added to
// unknown-field errors.
func (l *loader) fields(n *yaml.Node, path string, names []string, hint string) (map[string]entry, bool) {
	n = deref(n)
	if n.Kind != yaml.MappingNode {
		l.errAt(n, path, "want a mapping with fields %s, got %s", list(names), describe(n))
		return nil, false
	}
	out := map[string]entry{}
	for _, e := range l.pairs(n, path, "fields") {
		if !slices.Contains(names, e.key.Value) {
			l.errAt(e.key, e.path, "unknown field %q%s (fields: %s)%s", e.key.Value, suggest.DidYouMean(e.key.Value, names), list(names), hint)
			continue
		}
		out[e.key.Value] = e
	}
	return out, true
}

// top reads the document; false means it is not a pattern at all.
func (l *loader) top(doc *yaml.Node) bool {
	f, ok := l.fields(doc, "", topFields, "")
	if !ok {
		return false
	}
	if e, ok := f["name"]; ok {
		l.p.Name, _ = l.str(e)
	}
	if e, ok := f["description"]; ok {
		l.p.Description, _ = l.str(e)
	}
	if e, ok := f["cells"]; ok {
		for _, c := range l.pairs(e.val, "cells", "cell names to values") {
			l.cell(c)
		}
	}
	if e, ok := f["nodes"]; ok {
		for _, n := range l.pairs(e.val, "nodes", "node names to nodes") {
			l.node(n)
		}
	}
	return true
}

func (l *loader) cell(e entry) {
	c := Cell{Name: e.key.Value}
	defer func() { l.p.Cells = append(l.p.Cells, c) }()
	n := deref(e.val)
	if n.Kind != yaml.MappingNode {
		c.Value = l.json(n, e.path, 0)
		return
	}
	f, _ := l.fields(n, e.path, cellFields,
		"; a cell written as a mapping takes these fields, so write an object value under value: ("+e.key.Value+": {value: {...}})")
	if d, ok := f["description"]; ok {
		c.Description, _ = l.str(d)
	}
	v, hasValue := f["value"]
	file, hasFile := f["file"]
	switch {
	case hasValue && hasFile:
		l.errAt(file.key, file.path, "a cell takes value or file, not both")
	case hasValue:
		c.Value = l.json(v.val, v.path, 0)
	case hasFile:
		if s, ok := l.str(file); ok && s == "" {
			l.errAt(file.val, file.path, "empty file name")
		} else {
			c.File = s
		}
	}
	if s, ok := f["schema"]; ok {
		if sn := deref(s.val); sn.Kind != yaml.MappingNode && sn.ShortTag() != "!!bool" {
			l.errAt(sn, s.path, "a JSON Schema is a mapping (or true/false), got %s", describe(sn))
		} else {
			c.Schema = l.json(sn, s.path, 0)
		}
	}
}

func (l *loader) node(e entry) {
	n := Node{Name: e.key.Value}
	defer func() { l.p.Nodes = append(l.p.Nodes, n) }()
	vn := deref(e.val)
	if vn.Kind != yaml.MappingNode {
		l.errAt(vn, e.path, "want a node: a mapping with one of %s, got %s", list(kinds), describe(vn))
		return
	}
	var specs []entry
	fields := l.pairs(vn, e.path, "fields")
	hasKind := slices.ContainsFunc(fields, func(f entry) bool { return slices.Contains(kinds, f.key.Value) })
	for _, f := range fields {
		switch k := f.key.Value; {
		case k == "description":
			n.Description, _ = l.str(f)
		case slices.Contains(kinds, k):
			specs = append(specs, f)
		case slices.Contains(planned, k):
			l.errAt(f.key, f.path, "node kind %q is not available yet (kinds: %s)", k, list(kinds))
			n.Kind = Kind(k) // known but unavailable: check skips it
			return
		case hasKind:
			l.errAt(f.key, f.path, "unknown field %q%s: a node holds its kind and a description, and the kind's settings go under it (fields: %s)", k, suggest.DidYouMean(k, nodeFields), list(nodeFields))
		default:
			l.errAt(f.key, f.path, "unknown node kind %q%s (kinds: %s)", k, suggest.DidYouMean(k, nodeFields), list(kinds))
		}
	}
	switch len(specs) {
	case 0:
		if !slices.ContainsFunc(l.e.list, func(err *Error) bool { return strings.HasPrefix(err.Path, e.path) }) {
			l.errAt(vn, e.path, "missing node kind: write one of %s", list(kinds))
		}
		return
	case 1:
	default:
		l.errAt(specs[1].key, specs[1].path, "a node has one kind; %q already has %s", n.Name, specs[0].key.Value)
		return
	}
	s := specs[0]
	n.Kind = Kind(s.key.Value)
	switch n.Kind {
	case KindComputed:
		if sn := deref(s.val); sn.Kind == yaml.ScalarNode && sn.ShortTag() != "!!str" {
			n.Computed = Literal(sn.Value) // computed: 5 — a constant; the checker explains
		} else {
			n.Computed = l.string(s)
		}
	case KindExec:
		n.Exec = &ExecSpec{}
		reported := len(l.e.list)
		f, ok := l.fields(s.val, s.path, execFields, "")
		if c, has := f["command"]; has {
			n.Exec.Command = l.command(c)
		} else if !ok || len(l.e.list) > reported {
			n.Exec.Command = []Value{{err: errReported}} // likely misspelled, reported as unknown
		}
		if !ok {
			return
		}
		n.Exec.NoCache, n.Exec.Timeout = l.noCache(f), l.timeout(f)
		n.Exec.Image, n.Exec.Env, n.Exec.Files = l.box(f)
		if e, ok := f["network"]; ok {
			n.Exec.Network = l.network(e)
		}
	case KindFetch:
		n.Fetch = l.fetch(s)
	case KindLLM:
		n.LLM = &LLMSpec{}
		f, ok := l.fields(s.val, s.path, llmFields, "")
		if !ok {
			n.LLM.Provider = "?" // reported; the checker skips it
			return
		}
		l.llm(n.LLM, f)
	case KindSandbox:
		n.Sandbox = &SandboxSpec{}
		if f, ok := l.fields(s.val, s.path, sandboxFields, ""); ok {
			n.Sandbox.Image, n.Sandbox.Env, n.Sandbox.Files = l.box(f)
			if e, ok := f["ports"]; ok {
				n.Sandbox.Ports = l.ports(e)
			}
			if e, ok := f["start"]; ok {
				n.Sandbox.Start = l.start(e)
			}
			if e, ok := f["network"]; ok {
				n.Sandbox.Network = l.network(e)
			}
			if e, ok := f["snapshot"]; ok {
				n.Sandbox.Snapshot = l.string(e)
			}
		}
	}
}

// noCache reads the cache field (true or false): true when it is false.
func (l *loader) noCache(f map[string]entry) bool {
	c, ok := f["cache"]
	if !ok {
		return false
	}
	var cache bool
	if cn := deref(c.val); cn.Kind != yaml.ScalarNode || cn.ShortTag() != "!!bool" || cn.Decode(&cache) != nil {
		l.errAt(cn, c.path, "want true or false, got %s", describe(cn))
		return false
	}
	return !cache
}

// timeout reads the timeout field, a positive duration.
func (l *loader) timeout(f map[string]entry) time.Duration {
	t, ok := f["timeout"]
	if !ok {
		return 0
	}
	s, ok := l.str(t)
	if !ok {
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		l.errAt(t.val, t.path, "want a positive duration such as 30s or 5m, got %q", s)
		return 0 // reported: the checks of every pattern need not say it again
	}
	return d
}

// fetch reads a fetch node's fields.
func (l *loader) fetch(s entry) *FetchSpec {
	spec := &FetchSpec{}
	f, ok := l.fields(s.val, s.path, fetchFields, "")
	if !ok {
		spec.URL = Value{err: errReported}
		return spec
	}
	if e, ok := f["url"]; ok {
		spec.URL = l.string(e)
	}
	if e, ok := f["method"]; ok {
		spec.Method = l.string(e)
		// One written as it is is checked now, as the runner would when
		// it runs (builtins/fetch.go).
		if m := spec.Method; m.Kind == ValueLiteral && m.err == nil && strings.ContainsFunc(strings.ToUpper(m.Text), func(r rune) bool { return r < 'A' || r > 'Z' }) {
			l.errAt(deref(e.val), e.path, "method %q is not an HTTP method (e.g. GET, POST)", m.Text)
			spec.Method = Value{err: errReported}
		}
	}
	if e, ok := f["headers"]; ok {
		spec.Headers = map[string]Value{}
		for _, v := range l.pairs(e.val, e.path, "header names to values") {
			spec.Headers[v.key.Value] = l.scalar(v, "a string")
		}
	}
	if e, ok := f["secret_headers"]; ok {
		spec.SecretHeaders = map[string]string{}
		for _, v := range l.pairs(e.val, e.path, "header names to environment variable names") {
			if name, ok := l.str(v); ok {
				spec.SecretHeaders[v.key.Value] = name
			}
		}
	}
	if e, ok := f["body"]; ok {
		spec.Body = l.scalar(e, "a string or a ${…} expression (an object or list is sent as JSON)")
	}
	if e, ok := f["format"]; ok {
		spec.Format, _ = l.str(e)
	}
	if e, ok := f["max_bytes"]; ok {
		if n := deref(e.val); n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&spec.MaxBytes) != nil || spec.MaxBytes <= 0 {
			l.errAt(n, e.path, "want a positive number of bytes such as 1048576, got %s", describe(n))
			spec.MaxBytes = 0 // reported: the checks of every pattern need not say it again
		}
	}
	spec.NoCache, spec.Timeout = l.noCache(f), l.timeout(f)
	return spec
}

// llm reads an llm node's fields.
func (l *loader) llm(s *LLMSpec, f map[string]entry) {
	s.NoCache = l.noCache(f)
	if e, ok := f["provider"]; ok {
		if p, ok := l.str(e); ok {
			s.Provider = p
		} else {
			s.Provider = "?"
		}
	}
	for _, x := range s.fields() {
		e, ok := f[x.name]
		switch {
		case !ok:
		case x.number:
			*x.v = l.scalar(e, "a number or ${…}")
		default:
			*x.v = l.string(e)
		}
	}
	if e, ok := f["tools"]; ok {
		s.Tools = &LLMTools{}
		tf, ok := l.fields(e.val, e.path, llmToolFields, "")
		if !ok {
			return
		}
		if b, ok := tf["sandbox"]; ok {
			s.Tools.Sandbox, _ = l.str(b)
		}
		if a, ok := tf["allow"]; ok {
			n := deref(a.val)
			if n.Kind != yaml.SequenceNode {
				l.errAt(n, a.path, "want a list of tool names such as [shell, read_file, edit], got %s", describe(n))
				return
			}
			for i, item := range n.Content {
				if name, ok := l.str(entry{val: item, path: index(a.path, i)}); ok {
					s.Tools.Allow = append(s.Tools.Allow, name)
				}
			}
		}
	}
}

// portReported stands for a port the loader reported as malformed.
const portReported = math.MinInt

// ports reads a list of port numbers (their range is checked with the
// rest of the pattern).
func (l *loader) ports(e entry) []int {
	n := deref(e.val)
	if n.Kind != yaml.SequenceNode {
		l.errAt(n, e.path, "want a list of port numbers such as [8000], got %s", describe(n))
		return nil
	}
	var out []int
	for i, item := range n.Content {
		at := index(e.path, i)
		item = deref(item)
		l.p.Source[at] = l.pos(item)
		var port int
		if item.Kind != yaml.ScalarNode || item.ShortTag() != "!!int" || item.Decode(&port) != nil {
			l.errAt(item, at, "want a port number (1-65535), got %s", describe(item))
			port = portReported // keeps the indexes of the others
		}
		out = append(out, port)
	}
	return out
}

// start reads a sandbox's start: a command string, or a mapping with
// command and port or ready.
func (l *loader) start(e entry) *StartSpec {
	n := deref(e.val)
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str" {
		return &StartSpec{Command: l.string(e)}
	}
	if n.Kind != yaml.MappingNode {
		l.errAt(n, e.path, `want a command ("python3 server.py") or {command: ..., port: 8000} or {command: ..., ready: ...}, got %s`, describe(n))
		return &StartSpec{Command: Value{err: errReported}}
	}
	s := &StartSpec{}
	f, _ := l.fields(n, e.path, startFields, "")
	if c, ok := f["command"]; ok {
		s.Command = l.string(c)
	}
	if p, ok := f["port"]; ok {
		pn := deref(p.val)
		if pn.Kind != yaml.ScalarNode || pn.ShortTag() != "!!int" || pn.Decode(&s.Port) != nil {
			l.errAt(pn, p.path, "want a port number (1-65535), got %s", describe(pn))
			s.Port = portReported
		}
	}
	if r, ok := f["ready"]; ok {
		s.Ready = l.string(r)
	}
	return s
}

// network reads a box's network: true (full), false (closed, the
// default), or {allow: [...], inject: [...]}, the sandbox_create value.
// An inject rule names a server secret; a key written into a pattern file
// would travel with it, so value is refused.
func (l *loader) network(e entry) *api.Network {
	n := deref(e.val)
	if n.Kind != yaml.MappingNode && n.ShortTag() != "!!bool" && n.ShortTag() != "!!null" {
		l.errAt(n, e.path, "want true, false or {allow: [...], inject: [...]}, got %s", describe(n))
		return nil
	}
	var v any
	if err := n.Decode(&v); err != nil {
		l.errAt(n, e.path, "want true, false or {allow: [...], inject: [...]}: %v", err)
		return nil
	}
	raw, err := json.Marshal(v)
	if err != nil {
		l.errAt(n, e.path, "want true, false or {allow: [...], inject: [...]}: %v", err)
		return nil
	}
	var nw api.Network
	if err := json.Unmarshal(raw, &nw); err != nil {
		l.errAt(n, e.path, "%v", err)
		return nil
	}
	for i, in := range nw.Inject {
		if in.Value != "" {
			l.errAt(n, e.path, "inject[%d]: a pattern names a server secret (secret: NAME, the server's CELLBOX_SECRET_NAME), never a value: the file would carry the key", i)
			return nil
		}
	}
	if _, _, err := nw.Check(); err != nil {
		l.errAt(n, e.path, "%v", err)
		return nil
	}
	return &nw
}

// box reads the fields exec and sandbox share.
func (l *loader) box(f map[string]entry) (image Value, env, files map[string]Value) {
	if e, ok := f["image"]; ok {
		image = l.string(e)
	}
	if e, ok := f["env"]; ok {
		env = map[string]Value{}
		for _, v := range l.pairs(e.val, e.path, "variable names to values") {
			env[v.key.Value] = l.scalar(v, "a string")
		}
	}
	if e, ok := f["files"]; ok {
		files = map[string]Value{}
		for _, v := range l.pairs(e.val, e.path, "paths in the box to contents") {
			files[v.key.Value] = l.fileValue(v)
		}
	}
	return image, env, files
}

// command reads a string or a list of strings.
func (l *loader) command(e entry) []Value {
	n := deref(e.val)
	if n.Kind == yaml.SequenceNode {
		var out []Value
		for i, item := range n.Content {
			at := index(e.path, i)
			l.p.Source[at] = l.pos(item)
			out = append(out, l.commandItem(entry{val: item, path: at}))
		}
		if len(out) == 0 {
			l.errAt(n, e.path, "empty command list")
			return []Value{{err: errReported}}
		}
		return out
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		l.errAt(n, e.path, "want a command: a string or a list of strings, got %s", describe(n))
		return []Value{{err: errReported}}
	}
	return []Value{l.commandItem(e)}
}

// commandItem reads one command; one that is blank as written could only
// fail when it runs.
func (l *loader) commandItem(e entry) Value {
	v := l.string(e)
	if v.Kind == ValueLiteral && v.err == nil && strings.TrimSpace(v.Text) == "" {
		l.errAt(deref(e.val), e.path, "empty command: give a command for bash to run (e.g. python3 main.py)")
		return Value{err: errReported}
	}
	return v
}

// fileValue reads one entry of files.
func (l *loader) fileValue(e entry) Value {
	n := deref(e.val)
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str" && (n.Value == "text" || n.Value == "json") {
		return Value{Kind: ValueOutput, Format: n.Value}
	}
	if n.Kind != yaml.MappingNode {
		return l.scalar(e, "file content, a ${…} expression, {file: path}, or text/json for an output")
	}
	f, _ := l.fields(n, e.path, fileFields, "")
	if len(f) != 1 {
		if len(f) > 1 {
			l.errAt(n, e.path, "a file takes one of file, content, output")
		} else if len(n.Content) == 0 {
			l.errAt(n, e.path, "empty mapping: a file takes one of file, content, output")
		}
		return Value{err: errReported}
	}
	for k, fe := range f {
		s, ok := l.str(fe)
		if !ok {
			return Value{err: errReported}
		}
		switch k {
		case "file":
			return FromFile(s)
		case "content":
			return Literal(s)
		case "output":
			if s != "text" && s != "json" {
				l.errAt(fe.val, fe.path, "unknown output format %q (want text or json)", s)
				return Value{err: errReported}
			}
			return Value{Kind: ValueOutput, Format: s}
		}
	}
	return Value{err: errReported}
}

// str reads a string scalar.
func (l *loader) str(e entry) (string, bool) {
	n := deref(e.val)
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		l.errAt(n, e.path, "want a string, got %s", describe(n))
		return "", false
	}
	return n.Value, true
}

// string reads a string scalar by the ${…} rule.
func (l *loader) string(e entry) Value {
	s, ok := l.str(e)
	if !ok {
		return Value{err: errReported}
	}
	return l.parseStr(deref(e.val), e.path, s)
}

// scalar reads any non-null scalar as text, by the ${…} rule (env values,
// file contents: PORT: 8080 is "8080").
func (l *loader) scalar(e entry, want string) Value {
	n := deref(e.val)
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" {
		l.errAt(n, e.path, "want %s, got %s", want, describe(n))
		return Value{err: errReported}
	}
	return l.parseStr(n, e.path, n.Value)
}

func (l *loader) parseStr(n *yaml.Node, path, s string) Value {
	v, err := parseString(s)
	if err != nil {
		l.errAt(n, path, "%v", err)
		return Value{err: errReported}
	}
	return v
}

// json converts a YAML value to compact JSON.
func (l *loader) json(n *yaml.Node, path string, depth int) json.RawMessage {
	v, ok := l.value(n, path, depth)
	if !ok {
		return nil
	}
	b, err := marshal(v)
	if err != nil {
		l.errAt(n, path, "not representable as JSON: %v", err)
		return nil
	}
	return b
}

func (l *loader) value(n *yaml.Node, path string, depth int) (any, bool) {
	if n.Kind == yaml.AliasNode && l.expanding[deref(n)] {
		l.errAt(n, path, "alias *%s is inside the value it names: a value that contains itself never ends", n.Value)
		return nil, false
	}
	n = deref(n)
	if n.Anchor != "" && (n.Kind == yaml.SequenceNode || n.Kind == yaml.MappingNode) {
		if l.expanding == nil {
			l.expanding = map[*yaml.Node]bool{}
		}
		l.expanding[n] = true
		defer delete(l.expanding, n)
	}
	if l.budget <= 0 || depth > MaxDepth {
		if !l.tooBig {
			l.errAt(n, path, "value too large or too deep (more than %d nodes or %d levels, aliases expanded)", maxYAMLNodes, MaxDepth)
			l.tooBig = true
		}
		return nil, false
	}
	l.budget--
	switch n.Kind {
	case yaml.ScalarNode:
		switch tag := n.ShortTag(); tag {
		case "!!null":
			return nil, true
		case "!!str", "!!timestamp", "!!binary":
			return n.Value, true
		case "!!bool", "!!int", "!!float":
			var v any
			if err := n.Decode(&v); err != nil {
				l.errAt(n, path, "%v", err)
				return nil, false
			}
			if f, ok := v.(float64); ok && (math.IsInf(f, 0) || math.IsNaN(f)) {
				l.errAt(n, path, "%s is not a JSON number", n.Value)
				return nil, false
			}
			return v, true
		default:
			l.errAt(n, path, "unsupported YAML tag %s", tag)
			return nil, false
		}
	case yaml.SequenceNode:
		out := make([]any, 0, len(n.Content))
		for i, item := range n.Content {
			v, ok := l.value(item, index(path, i), depth+1)
			if !ok {
				return nil, false
			}
			out = append(out, v)
		}
		return out, true
	case yaml.MappingNode:
		out := map[string]any{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := deref(n.Content[i])
			if k.ShortTag() == "!!merge" {
				l.errAt(k, path, "merge keys (<<) are not supported; write the fields out (aliases such as *name are fine)")
				return nil, false
			}
			if k.Kind != yaml.ScalarNode {
				l.errAt(k, path, "a JSON object key must be a plain string, got %s", describe(k))
				return nil, false
			}
			if _, dup := out[k.Value]; dup {
				l.errAt(k, field(path, k.Value), "key %q is defined twice", k.Value)
				return nil, false
			}
			v, ok := l.value(n.Content[i+1], field(path, k.Value), depth+1)
			if !ok {
				return nil, false
			}
			out[k.Value] = v
		}
		return out, true
	}
	l.errAt(n, path, "unsupported YAML value: %s", describe(n))
	return nil, false
}

// describe names what a YAML node is, for errors.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "nothing (null)"
		case "!!str":
			if len(n.Value) > 40 {
				return fmt.Sprintf("the string %q…", n.Value[:40])
			}
			return fmt.Sprintf("the string %q", n.Value)
		case "!!int", "!!float":
			return "the number " + n.Value
		case "!!bool":
			return "the boolean " + n.Value
		}
		return fmt.Sprintf("%s %s", n.ShortTag(), n.Value)
	case yaml.AliasNode:
		return "an alias"
	}
	return "an empty document"
}

// marshal encodes a value as compact, canonical JSON (object keys sorted,
// no HTML escaping).
func marshal(v any) (json.RawMessage, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}
