package patterns

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cellbox/cellbox/builtins"
	"github.com/cellbox/cellbox/builtins/llm"
	"github.com/cellbox/cellbox/internal/suggest"
	"github.com/expr-lang/expr/builtin"
)

// maxFileSize caps a file of the pattern folder read into a cell or a box.
const maxFileSize = 32 << 20

var (
	identRE       = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	patternNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)
)

// What expressions may read of a node, by kind (see docs/patterns.md).
var (
	outputs = map[Kind][]string{
		KindExec:    {"pending", "result", "error"},
		KindSandbox: {"pending", "status", "box", "error", "history", "files", "previews", "server"},
		KindFetch:   {"pending", "result", "error"},
		KindLLM:     {"pending", "result", "error"},
	}
	// results: the fields of result, for the kinds that have one.
	results = map[Kind][]string{
		KindExec:  {"stdout", "stderr", "exit_code", "truncated", "files"},
		KindFetch: {"status", "headers", "body"},
		KindLLM:   {"text", "messages", "tool_calls", "usage", "stop_reason", "turns"},
	}
	previewFields = []string{"url", "host_url"}
	// inputKinds are the kinds of value a node's input field may be.
	inputKinds = []ValueKind{ValueLiteral, ValueExpr, ValueTemplate}
	// streams are each kind's event streams: what a read may name, and
	// the compiled node's Streams.
	streams = map[Kind][]string{KindSandbox: {"run", "destroy", "snapshot"}}
)

// checker validates a Pattern in place: it reads `file:` references from
// fsys, fills each node's Reads and reports every problem it finds.
type checker struct {
	p     *Pattern
	fsys  fs.FS
	e     *errs
	names map[string]string // cell or node name → "cell" or "node"
	// edges[a][b] is the path of the first expression of node a that
	// reads node b.
	edges map[string]map[string]string
}

func check(p *Pattern, fsys fs.FS, e *errs) {
	c := &checker{p: p, fsys: fsys, e: e, names: map[string]string{}, edges: map[string]map[string]string{}}
	if p.Name == "" {
		e.add("name", "missing: every pattern needs a name")
	} else if !patternNameRE.MatchString(p.Name) {
		e.add("name", "%q is not a valid pattern name: use letters, digits, '-', '_' and '.'", p.Name)
	}
	for i := range p.Cells {
		c.name(field("cells", p.Cells[i].Name), p.Cells[i].Name, "cell")
	}
	for i := range p.Nodes {
		c.name(field("nodes", p.Nodes[i].Name), p.Nodes[i].Name, "node")
	}
	for i := range p.Cells {
		c.cell(&p.Cells[i])
	}
	for i := range p.Nodes {
		c.node(&p.Nodes[i])
	}
	c.cycles()
}

// name checks a cell or node name and claims it.
// A rejected name is still claimed, so that expressions reading it do not
// add errors of their own.
func (c *checker) name(at, name, what string) {
	if prev, dup := c.names[name]; dup {
		c.e.add(at, "name %q is already used by a %s (%s); cells and nodes share one namespace", name, prev, c.p.Where(field(prev+"s", name)))
		return
	}
	c.names[name] = what
	switch {
	case !identRE.MatchString(name):
		c.e.add(at, "%q is not a valid %s name: use letters, digits and '_', not starting with a digit (expressions refer to it by name)", name, what)
	case isBuiltin(name):
		c.e.add(at, "%q is an expression built-in; choose another %s name", name, what)
	}
}

func (c *checker) cell(cell *Cell) {
	at := field("cells", cell.Name)
	if cell.File != "" {
		if text, ok := c.readFile(field(at, "file"), cell.File); ok {
			cell.Value, _ = json.Marshal(text)
		}
	}
	if bytes.Equal(cell.Value, []byte("null")) {
		cell.Value = nil
	}
	if cell.Schema != nil {
		if err := checkSchema(cell.Schema, cell.Value); err != nil {
			c.e.add(field(at, "schema"), "%v", err)
		}
	}
}

func (c *checker) node(n *Node) {
	at := field("nodes", n.Name)
	if n.Kind == "" || slices.Contains(planned, string(n.Kind)) {
		return // the loader reported what is wrong with it
	}
	set := 0
	for _, x := range []bool{!n.Computed.IsZero(), n.Exec != nil, n.Sandbox != nil, n.Fetch != nil, n.LLM != nil} {
		if x {
			set++
		}
	}
	if set != 1 || !slices.Contains(kinds, string(n.Kind)) {
		c.e.add(at, "a node has exactly one kind (%s); kind %q with %d specs set", list(kinds), n.Kind, set)
		return
	}
	reads := map[string]bool{}
	val := func(at string, v Value, allowed ...ValueKind) {
		c.value(n, reads, at, v, allowed...)
	}
	switch n.Kind {
	case KindComputed:
		at = field(at, "computed")
		if n.Computed.err == nil && (n.Computed.Kind == ValueLiteral || n.Computed.IsZero()) {
			c.e.add(at, "%q is not an expression: write ${…} around it (e.g. '${%s}')", n.Computed.Text, n.Computed.Text)
			break
		}
		val(at, n.Computed, ValueExpr, ValueTemplate)
	case KindExec:
		at = field(at, "exec")
		s := n.Exec
		if len(s.Command) == 0 {
			c.e.add(field(at, "command"), "missing: an exec node needs a command (a string or a list of strings)")
		}
		for i, v := range s.Command {
			val(index(field(at, "command"), i), v, inputKinds...)
		}
		if s.Timeout < 0 {
			c.e.add(field(at, "timeout"), "negative timeout %s", s.Timeout)
		}
		c.box(n, at, s.Image, s.Env, s.Files, val)
	case KindFetch:
		c.fetch(field(at, "fetch"), n.Fetch, val)
	case KindSandbox:
		at = field(at, "sandbox")
		c.box(n, at, n.Sandbox.Image, n.Sandbox.Env, n.Sandbox.Files, val)
		c.ports(field(at, "ports"), n.Sandbox.Ports)
		if st := n.Sandbox.Start; st != nil {
			sat := field(at, "start")
			if st.Command.IsZero() && st.Command.err == nil {
				c.e.add(field(sat, "command"), "missing: the command that starts the server (e.g. python3 server.py)")
			} else {
				val(field(sat, "command"), st.Command, inputKinds...)
			}
			switch {
			case st.Port == portReported:
			case st.Port != 0 && (st.Port < 1 || st.Port > 65535):
				c.e.add(field(sat, "port"), "port %d is out of range: want 1-65535", st.Port)
			case st.Port != 0 && !st.Ready.IsZero():
				c.e.add(field(sat, "ready"), "give port or ready, not both: the server is ready when its port accepts connections (port) or when the ready command exits 0 (ready)")
			}
			if !st.Ready.IsZero() {
				val(field(sat, "ready"), st.Ready, inputKinds...)
			}
		}
		if !n.Sandbox.Snapshot.IsZero() {
			val(field(at, "snapshot"), n.Sandbox.Snapshot, inputKinds...)
		}
	case KindLLM:
		c.llm(n, field(at, "llm"), reads, val)
	}
	n.Reads = slices.Sorted(maps.Keys(reads))
}

// llm checks an llm node: a known provider, a model, prompt or messages,
// and tools that name a sandbox node (which the node then reads).
func (c *checker) llm(n *Node, at string, reads map[string]bool, val func(string, Value, ...ValueKind)) {
	s := n.LLM
	if s.Provider == "?" {
		return // the loader reported it
	}
	if s.Provider != "" && !slices.Contains(llm.Providers, s.Provider) {
		c.e.add(field(at, "provider"), "unknown provider %q%s (providers: %s)", s.Provider, suggest.DidYouMean(s.Provider, llm.Providers), list(llm.Providers))
	}
	if s.Model.IsZero() {
		c.e.add(field(at, "model"), "missing: an llm node needs a model (e.g. gpt-4o, claude-sonnet-4-5, llama3.1)")
	}
	if s.Prompt.IsZero() == s.Messages.IsZero() {
		c.e.add(at, "give prompt (a user message) or messages (a conversation), one of the two")
	}
	for _, x := range s.fields() {
		if x.v.IsZero() {
			continue
		}
		val(field(at, x.name), *x.v, inputKinds...)
		if x.v.Kind != ValueLiteral {
			continue
		}
		if _, err := strconv.ParseFloat(strings.TrimSpace(x.v.Text), 64); x.number && err != nil {
			c.e.add(field(at, x.name), "%q is not a number (or write an expression, ${…})", x.v.Text)
		}
		if d, err := time.ParseDuration(x.v.Text); x.duration && (err != nil || d <= 0) {
			c.e.add(field(at, x.name), "want a positive duration such as 30s or 5m (or an expression, ${…}), got %q", x.v.Text)
		}
	}
	if s.Tools == nil {
		return
	}
	b, _ := c.p.Node(s.Tools.Sandbox)
	switch {
	case s.Tools.Sandbox == "":
		c.e.add(field(field(at, "tools"), "sandbox"), "missing: name the sandbox node whose box the tools act on")
	case b == nil || b.Kind != KindSandbox:
		c.e.add(field(field(at, "tools"), "sandbox"), "%q is not a sandbox node of this pattern: tools act on a sandbox node's box", s.Tools.Sandbox)
	default:
		reads[s.Tools.Sandbox] = true
		c.edge(n.Name, s.Tools.Sandbox, field(field(at, "tools"), "sandbox"))
	}
}

// edge records that node from reads node to, at the first place it does
// (for the cycle check's message).
func (c *checker) edge(from, to, at string) {
	if c.edges[from] == nil {
		c.edges[from] = map[string]string{}
	}
	if _, ok := c.edges[from][to]; !ok {
		c.edges[from][to] = at
	}
}

// box checks what exec and sandbox nodes share: image, env and files.
func (c *checker) box(n *Node, at string, image Value, env, files map[string]Value, val func(string, Value, ...ValueKind)) {
	if !image.IsZero() {
		val(field(at, "image"), image, inputKinds...)
	}
	for _, k := range sortedKeys(env) {
		if !identRE.MatchString(k) {
			c.e.add(field(field(at, "env"), k), "%q is not a valid environment variable name", k)
		}
		val(field(field(at, "env"), k), env[k], inputKinds...)
	}
	for _, k := range sortedKeys(files) {
		fat := field(field(at, "files"), k)
		if err := builtins.CheckBoxPath(k); err != nil {
			c.e.add(fat, "%s", err)
		}
		v := files[k]
		val(fat, v, ValueLiteral, ValueExpr, ValueTemplate, ValueFile, ValueOutput)
		if v.Kind == ValueFile {
			if text, ok := c.readFile(fat, v.Path); ok {
				v.Text = text
				files[k] = v
			}
		}
	}
}

// fetch checks a fetch node: a url, header and variable names, the format.
func (c *checker) fetch(at string, s *FetchSpec, val func(string, Value, ...ValueKind)) {
	if s.URL.IsZero() {
		c.e.add(field(at, "url"), "missing: a fetch node needs a url (http or https)")
	} else {
		val(field(at, "url"), s.URL, inputKinds...)
	}
	if !s.Method.IsZero() {
		val(field(at, "method"), s.Method, inputKinds...)
	}
	if !s.Body.IsZero() {
		val(field(at, "body"), s.Body, inputKinds...)
	}
	for _, k := range sortedKeys(s.Headers) {
		if !headerRE.MatchString(k) {
			c.e.add(field(field(at, "headers"), k), "%q is not a valid HTTP header name", k)
		}
		val(field(field(at, "headers"), k), s.Headers[k], inputKinds...)
	}
	for _, k := range sortedKeys(s.SecretHeaders) {
		hat := field(field(at, "secret_headers"), k)
		if !headerRE.MatchString(k) {
			c.e.add(hat, "%q is not a valid HTTP header name", k)
		}
		if _, dup := s.Headers[k]; dup {
			c.e.add(hat, "header %q is set in both headers and secret_headers", k)
		}
		if err := builtins.CheckSecretVar(s.SecretHeaders[k]); err != nil {
			c.e.add(hat, "%v", err)
		}
	}
	if s.Format != "" && s.Format != builtins.FetchText && s.Format != builtins.FetchJSON {
		c.e.add(field(at, "format"), "unknown format %q (want text or json)", s.Format)
	}
	if s.Timeout < 0 {
		c.e.add(field(at, "timeout"), "negative timeout %s", s.Timeout)
	}
	if s.MaxBytes < 0 {
		c.e.add(field(at, "max_bytes"), "negative max_bytes %d", s.MaxBytes)
	}
}

// headerRE is what an HTTP header name may be (RFC 9110 token).
var headerRE = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

// ports checks a sandbox node's ports: in range, each listed once.
func (c *checker) ports(at string, ports []int) {
	for i, p := range ports {
		switch {
		case p == portReported:
		case p < 1 || p > 65535:
			c.e.add(index(at, i), "port %d is out of range: want 1-65535", p)
		case slices.Index(ports, p) < i:
			c.e.add(index(at, i), "port %d is listed twice", p)
		}
	}
}

// value checks one field value: its kind, its expressions and what they
// read.
func (c *checker) value(n *Node, reads map[string]bool, at string, v Value, allowed ...ValueKind) {
	switch {
	case v.err == errReported:
		return
	case v.err != nil:
		c.e.add(at, "%v", v.err)
		return
	case v.IsZero():
		c.e.add(at, "missing value")
		return
	case !slices.Contains(allowed, v.Kind):
		c.e.add(at, "a %s value is not allowed here", v.Kind)
		return
	case v.Kind == ValueOutput && v.Format != "text" && v.Format != "json":
		c.e.add(at, "unknown output format %q (want text or json)", v.Format)
	}
	for _, src := range v.Exprs() {
		refs, err := builtins.Analyze(src)
		if err != nil {
			c.e.add(at, "bad expression %q: %v", src, err)
			continue
		}
		if !slices.ContainsFunc(refs, func(r builtins.Read) bool { return r.Call && !isBuiltin(r.Name) }) {
			// What the runtime refuses (the clock, $env, ...), it says why.
			if _, err := builtins.Parse(src); err != nil {
				c.e.add(at, "%v", err)
				continue
			}
		}
		for _, r := range refs {
			if msg := c.ref(r); msg != "" {
				c.e.add(at, "%s", msg)
				continue
			}
			reads[r.Name] = true
			if c.names[r.Name] == "node" {
				c.edge(n.Name, r.Name, at)
			}
		}
	}
}

// ref checks one name an expression reads; it returns what is wrong, or "".
func (c *checker) ref(r builtins.Read) string {
	if r.Call {
		if isBuiltin(r.Name) {
			return ""
		}
		return fmt.Sprintf("unknown function %q%s", r.Name, suggest.DidYouMean(r.Name, builtin.Names))
	}
	switch c.names[r.Name] {
	case "cell":
		return ""
	case "node":
		n, _ := c.p.Node(r.Name)
		return checkOutput(n, r.Path)
	}
	var cells, nodes []string
	for name, what := range c.names {
		if what == "cell" {
			cells = append(cells, name)
		} else {
			nodes = append(nodes, name)
		}
	}
	sort.Strings(cells)
	sort.Strings(nodes)
	if s := suggest.Nearest(r.Name, append(slices.Clone(cells), nodes...)); s != "" {
		return fmt.Sprintf("unknown %s %q (did you mean %q?)", c.names[s], r.Name, s)
	}
	return fmt.Sprintf("unknown cell or node %q (cells: %s; nodes: %s)", r.Name, orNone(cells), orNone(nodes))
}

// checkOutput checks a path read from a node's output.
func checkOutput(n *Node, p []string) string {
	outs, ok := outputs[n.Kind]
	if !ok || len(p) == 0 {
		return ""
	}
	if slices.Contains(streams[n.Kind], p[0]) {
		return fmt.Sprintf("%s.%s is a stream of %s node %q: send events to it, expressions cannot read it", n.Name, p[0], n.Kind, n.Name)
	}
	if !slices.Contains(outs, p[0]) {
		return fmt.Sprintf("%s node %q has no output %q%s (outputs: %s)", n.Kind, n.Name, p[0], suggest.DidYouMean(p[0], outs), list(outs))
	}
	var files map[string]Value
	var rest []string
	switch {
	case p[0] == "result" && len(p) > 1 && results[n.Kind] != nil:
		if r := results[n.Kind]; !slices.Contains(r, p[1]) {
			return fmt.Sprintf("%s node %q has no output \"result.%s\"%s (result has: %s)", n.Kind, n.Name, p[1], suggest.DidYouMean(p[1], r), list(r))
		}
		if n.Kind == KindExec && p[1] == "files" {
			files, rest = n.Exec.Files, p[2:]
		}
	case n.Kind == KindSandbox && p[0] == "files":
		files, rest = n.Sandbox.Files, p[1:]
	case n.Kind == KindSandbox && p[0] == "previews" && len(p) > 1:
		return checkPreview(n, p[1:])
	}
	if len(rest) == 0 {
		return ""
	}
	var outFiles []string
	for _, k := range sortedKeys(files) {
		if files[k].Kind == ValueOutput {
			outFiles = append(outFiles, k)
		}
	}
	if slices.Contains(outFiles, rest[0]) {
		return ""
	}
	if v, ok := files[rest[0]]; ok {
		return fmt.Sprintf("file %q of %s node %q is an input (%s), not an output: declare it as text or json to read it back", rest[0], n.Kind, n.Name, v.Kind)
	}
	return fmt.Sprintf("%s node %q has no output file %q%s (output files: %s)", n.Kind, n.Name, rest[0], suggest.DidYouMean(rest[0], outFiles), orNone(outFiles))
}

// checkPreview checks a path read from a sandbox node's previews: a
// declared port, then url or host_url.
func checkPreview(n *Node, p []string) string {
	var ports []string
	for _, port := range n.Sandbox.Ports {
		ports = append(ports, strconv.Itoa(port))
	}
	switch {
	case len(ports) == 0:
		return fmt.Sprintf("sandbox node %q declares no ports, so it has no previews (add ports: [%s])", n.Name, p[0])
	case !slices.Contains(ports, p[0]):
		return fmt.Sprintf("sandbox node %q has no preview of port %q%s (ports: %s)", n.Name, p[0], suggest.DidYouMean(p[0], ports), list(ports))
	case len(p) > 1 && !slices.Contains(previewFields, p[1]):
		return fmt.Sprintf("a preview of sandbox node %q has no field %q%s (fields: %s)", n.Name, p[1], suggest.DidYouMean(p[1], previewFields), list(previewFields))
	}
	return ""
}

// readFile reads a file of the pattern folder as text.
func (c *checker) readFile(at, name string) (string, bool) {
	if c.fsys == nil {
		c.e.add(at, "cannot read %q: this pattern has no folder (load it from a file, or set the builder's Dir)", name)
		return "", false
	}
	if !fs.ValidPath(name) || name == "." {
		c.e.add(at, "%q is not a path inside the pattern folder (use a relative path without ..)", name)
		return "", false
	}
	st, err := fs.Stat(c.fsys, name)
	switch {
	case err != nil && strings.Contains(err.Error(), "path escapes from parent"): // os.Root's refusal
		c.e.add(at, "%q links out of the pattern folder %s; a file: reference reads only files inside it (copy the file in)", name, c.dirName())
		return "", false
	case errors.Is(err, fs.ErrNotExist):
		var siblings []string
		ents, _ := fs.ReadDir(c.fsys, path.Dir(name))
		for _, e := range ents {
			siblings = append(siblings, path.Join(path.Dir(name), e.Name()))
		}
		c.e.add(at, "file %q not found in the pattern folder %s%s", name, c.dirName(), suggest.DidYouMean(name, siblings))
		return "", false
	case err != nil:
		c.e.add(at, "read %q: %v", name, err)
		return "", false
	case st.IsDir():
		c.e.add(at, "%q is a folder, not a file", name)
		return "", false
	case !st.Mode().IsRegular():
		c.e.add(at, "%q is %s, not a regular file", name, fileKind(st))
		return "", false
	case st.Size() > maxFileSize:
		c.e.add(at, "file %q is %d bytes, more than the %d a pattern file may have", name, st.Size(), maxFileSize)
		return "", false
	}
	f, err := c.fsys.Open(name)
	if err != nil {
		c.e.add(at, "read %q: %v", name, err)
		return "", false
	}
	defer f.Close()
	b, err := readCapped(f, maxFileSize)
	if err != nil {
		c.e.add(at, "read %q: %v", name, err)
		return "", false
	}
	if !utf8.Valid(b) {
		c.e.add(at, "file %q is not UTF-8 text (binary files are not supported yet)", name)
		return "", false
	}
	return string(b), true
}

func (c *checker) dirName() string {
	if c.p.Dir == "" {
		return "(in memory)"
	}
	return c.p.Dir
}

// cycles reports each dependency cycle among nodes once, with where each
// edge of it was written.
func (c *checker) cycles() {
	const (
		white = iota
		grey
		black
	)
	color := map[string]int{}
	var stack []string
	var visit func(n string)
	visit = func(n string) {
		color[n] = grey
		stack = append(stack, n)
		for _, m := range sortedKeys(c.edges[n]) {
			switch color[m] {
			case white:
				visit(m)
			case grey:
				cyc := append(slices.Clone(stack[slices.Index(stack, m):]), m)
				var where []string
				for i := 0; i+1 < len(cyc); i++ {
					where = append(where, fmt.Sprintf("%s reads %s at %s", cyc[i], cyc[i+1], c.p.Where(c.edges[cyc[i]][cyc[i+1]])))
				}
				c.e.add(c.edges[cyc[0]][cyc[1]], "dependency cycle %s (%s)", strings.Join(cyc, " -> "), strings.Join(where, "; "))
			}
		}
		stack = stack[:len(stack)-1]
		color[n] = black
	}
	for _, n := range c.p.Nodes {
		if color[n.Name] == white {
			visit(n.Name)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

func orNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return list(names)
}
