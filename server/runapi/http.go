package runapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/internal/fastjson"
	"github.com/cellbox/cellbox/internal/jsonschema"
	"github.com/cellbox/cellbox/patterns"
	"github.com/cellbox/cellbox/runtime"
)

// maxBody caps request bodies (a pattern's files are at most 32 MiB).
const maxBody = 64 << 20

// paths are the path prefixes the API answers; Owns tells a server that
// mounts it next to other handlers which requests are its.
var paths = []string{"/v1/patterns", "/v1/cells", "/v1/watch", "/v1/send", "/v1/retry", "/v1/graph"}

// endpoints lists the API's routes, for the answer to a path it has not.
const endpoints = "POST/GET /v1/patterns, GET/DELETE /v1/patterns/{name}, GET /v1/cells, GET/PUT /v1/cells/{addr}, GET /v1/watch, POST /v1/send/{node}.{stream}, POST /v1/retry/{node}, GET /v1/graph/{name}"

// Owns reports whether path is one of the API's.
func Owns(path string) bool {
	for _, p := range paths {
		if path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}
	return false
}

func (s *Server) routes() *http.ServeMux {
	m := http.NewServeMux()
	m.HandleFunc("POST /v1/patterns", s.handleLoad)
	m.HandleFunc("GET /v1/patterns", s.handlePatterns)
	m.HandleFunc("GET /v1/patterns/{name...}", s.handlePattern)
	m.HandleFunc("DELETE /v1/patterns/{name...}", s.handleStop)
	m.HandleFunc("GET /v1/cells", s.handleCells)
	m.HandleFunc("GET /v1/cells/{addr...}", s.handleGet)
	m.HandleFunc("PUT /v1/cells/{addr...}", s.handleSet)
	m.HandleFunc("GET /v1/watch", s.handleWatch)
	m.HandleFunc("POST /v1/send/{addr...}", s.handleSend)
	m.HandleFunc("POST /v1/retry/{addr...}", s.handleRetry)
	m.HandleFunc("GET /v1/graph/{name...}", s.handleGraph)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		status, what := 404, "no endpoint"
		if Owns(r.URL.Path) {
			status, what = 405, "method not allowed:"
		}
		writeErr(w, errorf(status, "%s %s %s; the runtime API has: %s", what, r.Method, r.URL.Path, endpoints))
	})
	return m
}

// ServeHTTP serves the API. It does no authentication of its own: its
// servers guard it (package server: on TCP, the server key and the Host
// and Origin checks of every request, server.Guard; the unix socket: its
// file mode).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mux.ServeHTTP(w, r)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// writeErr answers err as JSON: an *Error with its status, a schema
// violation as 422, anything else as 500.
func writeErr(w http.ResponseWriter, err error) {
	var e *Error
	var se *cells.SchemaError
	switch {
	case errors.As(err, &e):
	case errors.Is(err, runtime.ErrEventRefused):
		e = &Error{Status: http.StatusBadRequest, Message: err.Error()}
	case errors.Is(err, runtime.ErrNotLoaded):
		e = &Error{Status: http.StatusConflict, Message: err.Error()}
	case errors.As(err, &se):
		e = &Error{Status: http.StatusUnprocessableEntity, Message: err.Error()}
		var ve *jsonschema.ValidationError
		if errors.As(se.Err, &ve) {
			for _, v := range ve.Violations {
				e.Violations = append(e.Violations, Violation{Path: v.Path, Reason: v.Message})
			}
		}
		if len(e.Violations) == 0 {
			e.Violations = []Violation{{Reason: se.Err.Error()}}
		}
		e.Path, e.Reason = &e.Violations[0].Path, e.Violations[0].Reason
	default:
		e = &Error{Status: http.StatusInternalServerError, Message: err.Error()}
	}
	writeJSON(w, e.Status, e)
}

// readBody reads a request body, capped.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, errorf(413, "request body is larger than %d bytes", mbe.Limit)
		}
		return nil, errorf(400, "read request body: %v", err)
	}
	return b, nil
}

// readValue reads a JSON value from the body.
func readValue(w http.ResponseWriter, r *http.Request, what string) (json.RawMessage, error) {
	b, err := readBody(w, r)
	if err != nil {
		return nil, err
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return nil, errorf(400, "empty body: send the %s as JSON (a string needs quotes: \"hello\")", what)
	}
	if err := CheckJSON(b); err != nil {
		return nil, &Error{Status: 400, Message: fmt.Sprintf("the %s is not JSON: %v", what, err)}
	}
	return b, nil
}

// CheckJSON checks that b is one JSON value; for text that is not JSON it
// says how to write it (a bare word is a string that needs quotes).
func CheckJSON(b []byte) error {
	var v any
	err := json.Unmarshal(b, &v)
	if err == nil {
		if d, _ := fastjson.Depth(b); d > patterns.MaxDepth { // valid: checked just now
			return fmt.Errorf("it nests %d levels deep; a cell's value may nest at most %d, as in a pattern", d, patterns.MaxDepth)
		}
		return nil
	}
	t := strings.TrimSpace(string(b))
	if t != "" && !strings.ContainsAny(t[:1], `{["-0123456789`) && !strings.HasPrefix(t, "true") && !strings.HasPrefix(t, "false") && !strings.HasPrefix(t, "null") {
		q, _ := json.Marshal(t)
		return fmt.Errorf("%q is not a JSON value; a string needs quotes: '%s'", t, q)
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && strings.HasPrefix(te.Value, "number") { // into any, only a number past float64 fails so
		return fmt.Errorf("the %s is out of range: numbers must fit a 64-bit float (at most about 1.8e308)", te.Value)
	}
	return err
}

// loadRequest is the JSON form of POST /v1/patterns.
type loadRequest struct {
	Path  string `json:"path"`
	YAML  string `json:"yaml"`
	Name  string `json:"name"`
	Space string `json:"space"`
}

func (s *Server) handleLoad(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(w, r)
	if err != nil {
		writeErr(w, err)
		return
	}
	var req loadRequest
	var te *json.UnmarshalTypeError
	if err := json.Unmarshal(body, &req); errors.As(err, &te) {
		// A JSON request with a field of the wrong type, not YAML.
		writeErr(w, errorf(400, `%q must be a %s (got %s): send {"path": "/abs/pattern/folder"} or {"yaml": "name: …"}`, te.Field, te.Type, te.Value))
		return
	} else if err != nil || req.Path == "" && req.YAML == "" {
		req = loadRequest{YAML: string(body)}
	} else if unknown := unknownFields(body, "path", "yaml", "name", "space"); len(unknown) > 0 {
		// A misspelt "name" or "space" would load under the defaults.
		writeErr(w, errorf(400, `unknown field %q: the request takes "path" or "yaml", and "name" and "space"`, unknown[0]))
		return
	}
	var p *patterns.Pattern
	source := req.Path
	switch {
	case req.Path != "" && req.YAML != "":
		err = errorf(400, `give either "path" or "yaml", not both`)
	case req.Path != "":
		if !filepath.IsAbs(req.Path) {
			err = errorf(400, "pattern path %q is relative: give an absolute path (the server resolves paths on its own machine)", req.Path)
			break
		}
		p, err = patterns.Load(req.Path)
	default:
		if strings.TrimSpace(req.YAML) == "" {
			err = errorf(400, `empty body: send {"path": "/abs/pattern/folder"} or the pattern's YAML`)
			break
		}
		source = "request"
		p, err = patterns.Parse("request.yaml", []byte(req.YAML), nil)
	}
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			err = &Error{Status: 400, Message: err.Error()}
		}
		writeErr(w, err)
		return
	}
	opts := LoadOptions{Space: req.Space, Name: req.Name, Source: source}
	if req.Path == "" {
		opts.YAML = req.YAML
	}
	in, err := s.Load(r.Context(), p, opts)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, in)
}

func (s *Server) handlePatterns(w http.ResponseWriter, r *http.Request) {
	cut, err := cutterOf(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	ins, err := s.Instances()
	if err != nil {
		writeErr(w, err)
		return
	}
	for i := range ins {
		cut.cells(ins[i].Cells)
	}
	writeJSON(w, http.StatusOK, ins)
}

func (s *Server) handlePattern(w http.ResponseWriter, r *http.Request) {
	cut, err := cutterOf(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	name := r.PathValue("name")
	s.mu.Lock()
	in := s.lookup(name)
	s.mu.Unlock()
	if in == nil {
		writeErr(w, s.notLoaded(name))
		return
	}
	d, err := s.describe(in)
	if err != nil {
		writeErr(w, err)
		return
	}
	cut.cells(d.Cells)
	writeJSON(w, http.StatusOK, d)
}

func (s *Server) handleStop(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := s.Stop(r.Context(), name); err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"stopped": name})
}

func (s *Server) handleCells(w http.ResponseWriter, r *http.Request) {
	cut, err := cutterOf(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	prefix, err := ResolvePrefix(s.store, s.loaded(), r.URL.Query().Get("prefix"))
	if err != nil {
		writeErr(w, err)
		return
	}
	list := CellList{Cells: []Cell{}}
	err = s.store.View(r.Context(), func(tx cells.Tx) error {
		cs, err := tx.List(prefix)
		for _, c := range cs {
			cell := CellOf(c)
			cut.cell(&cell)
			list.Cells = append(list.Cells, cell)
		}
		list.Version = tx.Version()
		return err
	})
	if err != nil {
		writeErr(w, fmt.Errorf("list cells: %w", err))
		return
	}
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) handleGet(w http.ResponseWriter, r *http.Request) {
	c, err := Lookup(s.store, s.loaded(), r.PathValue("addr"))
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, CellOf(c))
}

func (s *Server) handleSet(w http.ResponseWriter, r *http.Request) {
	c, err := Lookup(s.store, s.loaded(), r.PathValue("addr"))
	if err != nil {
		writeErr(w, err)
		return
	}
	if c.Stream {
		writeErr(w, errorf(400, "%s is a stream: send it events (POST /v1/send/%s, `cellbox send %s JSON`)", c.Addr, c.Addr, c.Addr))
		return
	}
	if s.forwarded(w, r, c.Addr) {
		return
	}
	if node := s.nodeOf(c.Addr); node != "" {
		writeErr(w, errorf(409, "%s is the output of node %s: set the cells it reads instead", c.Addr, node))
		return
	}
	v, err := readValue(w, r, "cell value")
	if err != nil {
		writeErr(w, err)
		return
	}
	if err := s.rt.Set(r.Context(), c.Addr, v); err != nil {
		writeErr(w, err)
		return
	}
	s.writeCellBack(w, http.StatusOK, c.Addr)
}

// writeCellBack answers with cell a as it stands after a change.
func (s *Server) writeCellBack(w http.ResponseWriter, status int, a cells.Address) {
	c, err := s.store.Get(context.Background(), a)
	if err != nil {
		writeErr(w, fmt.Errorf("read %s back: %w", a, err))
		return
	}
	writeJSON(w, status, CellOf(c))
}

// nodeOf returns the node whose output a is, in a loaded instance, or "".
func (s *Server) nodeOf(a cells.Address) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.find(a.Space + "/" + a.Pattern)
	if in == nil {
		return ""
	}
	if _, ok := in.pattern.Node(a.Name); ok {
		return a.Name
	}
	return ""
}

func (s *Server) handleSend(w http.ResponseWriter, r *http.Request) {
	c, err := Lookup(s.store, s.loaded(), r.PathValue("addr"))
	if err != nil {
		writeErr(w, err)
		return
	}
	if s.forwarded(w, r, c.Addr) {
		return
	}
	if !c.Stream {
		writeErr(w, s.notStream(c.Addr))
		return
	}
	v, err := readValue(w, r, "event")
	if err != nil {
		writeErr(w, err)
		return
	}
	ev, err := s.rt.Send(r.Context(), c.Addr, v)
	if err != nil {
		if !strings.Contains(err.Error(), c.Addr.String()) { // most already say "send to <addr>: …"
			err = fmt.Errorf("send to %s: %w", c.Addr, err)
		}
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, Sent{Address: c.Addr.String(), Event: eventJSON(ev)})
}

// notStream is the 400 for a send to a cell that is not a stream: a
// node's output names the node's streams (or says it has none), an input
// cell is set instead.
func (s *Server) notStream(a cells.Address) error {
	var streams []string
	_ = s.store.View(context.Background(), func(tx cells.Tx) error {
		cs, err := tx.List(a.String() + ".")
		for _, c := range cs {
			if c.Stream {
				streams = append(streams, c.Addr.Name)
			}
		}
		return err
	})
	node := s.nodeOf(a) // "" also for a node of an instance not loaded
	switch {
	case len(streams) > 0:
		what := "not a stream"
		if node != "" {
			what = "the output of node " + node + ", not a stream"
		}
		example := streams[0] // the run stream, rather than destroy
		if i := slices.Index(streams, a.Name+".run"); i >= 0 {
			example = streams[i]
		}
		return errorf(400, "%s is %s: send events to one of its streams: %s (e.g. `cellbox send %s JSON`, POST /v1/send/%s)",
			a, what, strings.Join(streams, ", "), example, a.Prefix()+example)
	case node != "":
		return errorf(400, "%s is the output of node %s, not a stream, and the node has no streams: only a sandbox node takes events (its streams are NODE.run, NODE.snapshot, NODE.destroy)", a, node)
	}
	return errorf(400, "%s is not a stream: streams are named node.stream (e.g. repl.run); set a cell with PUT /v1/cells/%s", a, a)
}

func (s *Server) handleGraph(w http.ResponseWriter, r *http.Request) {
	p, err := s.Pattern(r.PathValue("name"))
	if err != nil {
		writeErr(w, err)
		return
	}
	format := r.URL.Query().Get("format")
	text, err := Graph(p, format)
	if err != nil {
		writeErr(w, &Error{Status: 400, Message: err.Error()})
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, text)
}

// unknownFields lists the keys of the JSON object body other than known,
// sorted.
func unknownFields(body []byte, known ...string) []string {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return nil
	}
	var out []string
	for k := range m {
		if !slices.Contains(known, k) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}
