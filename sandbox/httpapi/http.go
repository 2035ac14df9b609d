// Package httpapi is the HTTP face of a sandbox.Service: the tool API,
// the box endpoints (exec, files, watch), MCP over Streamable HTTP, the
// preview proxy, /healthz and /metrics. It holds no state of its own
// beyond MCP's HTTP sessions: every route is a thin adapter onto the
// Service's exported methods, which own sessions, boxes and tools.
//
// Routes and the credential each takes:
//
//	POST   /v1/sessions  body: {"allowed_commands"} or none -> 201 {"id","token"}   server key
//	GET    /v1/sessions                                   -> [{"id","created","boxes"}]  server key
//	DELETE /v1/sessions/{id}                              session token, or the server key (any session)
//	GET    /v1/tools?profile=                             -> [{"name","description","input_schema"}]  none
//	POST   /v1/sessions/{id}/tools/{name}?profile=        session token; body: input -> 200 result object
//	POST   /v1/sessions/{id}/boxes/{box}/exec             session token; body: api.ExecRequest -> NDJSON api.ExecFrame
//	GET    /v1/sessions/{id}/boxes/{box}/files/{path...}  session token; raw bytes
//	PUT    /v1/sessions/{id}/boxes/{box}/files/{path...}  session token; raw bytes -> {"path","bytes"}
//	GET    /v1/sessions/{id}/boxes/{box}/watch?path=&debounce_ms=  session token; server-sent events
//	POST|GET|DELETE /v1/sessions/{id}/mcp                 session token; MCP in this session (mcp.go)
//	POST|GET|DELETE /v1/mcp                               server key; MCP, a new session per MCP session (mcp.go)
//	GET    /healthz                                       none
//	GET    /metrics                                       server key
//	ANY    Host: {pid}.localhost                          none (the unguessable id); preview proxy, a preview's own origin (preview.go)
//	ANY    /preview/{pid}/...                             none; 308 to http://{pid}.localhost:PORT/...
//
// A session token is checked here (Authorization: Bearer TOKEN against
// the session in the path: none 401, wrong 403, unknown session 404). The
// server key is NOT: the routes marked with it are open in Handler, and
// the server in front of it guards them — server.Guard asks for the key,
// and checks Host and Origin on every request against DNS rebinding and
// cross-site pages (docs/api.md "Who may call", docs/security.md). That
// server marks a request that carried the right key (WithServerKey), and
// DELETE /v1/sessions/{id} takes that instead of the session's token, so
// an operator can remove a session whose token is lost.
//
// File paths in URLs are relative to /workspace; an absolute path is
// written with its leading slash escaped (files/%2Ftmp/x). Errors are JSON
// {"error": "..."}; tool failures are 200 results with is_error: true.
package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cellbox/cellbox/internal/fastjson"
	"github.com/cellbox/cellbox/internal/readall"

	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/previews"
	"github.com/cellbox/cellbox/sandbox/tools"
)

// MaxToolBody caps the body of a tool call and of a streaming exec request.
const MaxToolBody = 8 << 20

// bodies and results keep tool call bodies and results up to a write_file
// of the largest content (2 MiB, escaped) for the next call (see
// readall.BufferPool).
var bodies, results = readall.BufferPool{Max: 5 << 20}, readall.BufferPool{Max: 5 << 20}

// DefaultMCPIdleTTL is how long an MCP session of /v1/mcp may go without
// a request before it is closed and its boxes deleted: an IDE agent's
// client seldom ends its session (DELETE), and boxes kept for the
// server's SessionTTL (a day) after the editor was closed cost memory and
// disk, while a pause of a user in the middle of work is shorter.
const DefaultMCPIdleTTL = 30 * time.Minute

// Options are the choices of a Handler beyond its service's Config.
type Options struct {
	// MCPIdleTTL is how long an MCP session of /v1/mcp may go without a
	// request (a running call counts as one) before it is closed and its
	// cellbox session deleted with its boxes; never longer than the
	// service's SessionTTL. 0 means DefaultMCPIdleTTL, a negative value
	// no limit of its own. cellbox serve and run set it with
	// --mcp-idle-ttl.
	MCPIdleTTL time.Duration
}

// Handler returns the HTTP API of svc (the routes above) with the default
// Options.
func Handler(svc *sandbox.Service) http.Handler { return HandlerWith(svc, Options{}) }

// HandlerWith returns the HTTP API of svc (the routes above) with opts.
func HandlerWith(svc *sandbox.Service, opts Options) http.Handler {
	s := &server{svc: svc}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sessions", s.handleNewSession)
	mux.HandleFunc("GET /v1/sessions", s.handleListSessions)
	mux.HandleFunc("DELETE /v1/sessions/{id}", s.handleDeleteSession)
	mux.HandleFunc("GET /v1/tools", s.handleTools)
	mux.HandleFunc("POST /v1/sessions/{id}/tools/{name}", s.authed(s.handleTool))
	m := newMCPHTTP(svc, opts.mcpIdleTTL(svc.Config().SessionTTL)) // mcp.go
	mux.Handle("/v1/mcp", m.keyed)
	mux.HandleFunc("/v1/sessions/{id}/mcp", s.authed(m.serveSession))
	mux.HandleFunc("POST /v1/sessions/{id}/boxes/{box}/exec", s.authed(s.handleExec))
	mux.HandleFunc("GET /v1/sessions/{id}/boxes/{box}/files/{path...}", s.authed(s.handleDownload))
	mux.HandleFunc("PUT /v1/sessions/{id}/boxes/{box}/files/{path...}", s.authed(s.handleUpload))
	mux.HandleFunc("GET /v1/sessions/{id}/boxes/{box}/watch", s.authed(s.handleWatch))
	mux.HandleFunc("GET /healthz", s.handleHealth)
	mux.HandleFunc("GET /metrics", s.handleMetrics)
	mux.HandleFunc("/preview/{pid}", s.handlePreview)
	mux.HandleFunc("/preview/{pid}/{rest...}", s.handlePreview)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id, ok := previews.IDFromHost(r.Host); ok {
			s.servePreview(w, r, id)
			return
		}
		if _, pattern := mux.Handler(r); pattern == "" {
			// Answer the mux's own 404/405 as JSON.
			rec := &statusRecorder{header: http.Header{}}
			h, _ := mux.Handler(r)
			h.ServeHTTP(rec, r)
			if allow := rec.header.Get("Allow"); allow != "" {
				w.Header().Set("Allow", allow)
			}
			if rec.status == http.StatusMethodNotAllowed {
				writeError(w, rec.status, fmt.Sprintf("method %s not allowed on %s", r.Method, r.URL.Path))
				return
			}
			writeError(w, http.StatusNotFound, fmt.Sprintf("no endpoint %s %s; see GET /v1/tools and POST /v1/sessions", r.Method, r.URL.Path))
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// mcpIdleTTL is the SDK's SessionTTL of /v1/mcp's MCP sessions (0:
// never) under a service whose sessions expire after sessionTTL
// (negative: never).
func (o Options) mcpIdleTTL(sessionTTL time.Duration) time.Duration {
	ttl := o.MCPIdleTTL
	switch {
	case ttl == 0:
		ttl = DefaultMCPIdleTTL
	case ttl < 0:
		ttl = 0
	}
	if sessionTTL > 0 && (ttl == 0 || sessionTTL < ttl) {
		ttl = sessionTTL
	}
	return ttl
}

type statusRecorder struct {
	header http.Header
	status int
}

func (r *statusRecorder) Header() http.Header         { return r.header }
func (r *statusRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (r *statusRecorder) WriteHeader(status int)      { r.status = status }

// server serves the routes of one Service.
type server struct {
	svc *sandbox.Service
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, api.ErrorBody{Error: msg})
}

// writeBoxError answers a failed box operation: its status, its message and
// its code (the same code a tool result or the in-process client gives).
func writeBoxError(w http.ResponseWriter, err error) {
	writeJSON(w, errorStatus(err), api.ErrorBody{Error: err.Error(), Code: sandbox.ErrorCode(err)})
}

// serverKeyCtx marks a request context whose server key the server in
// front checked (WithServerKey).
type serverKeyCtx struct{}

// WithServerKey returns r marked as carrying the right server key. Only
// the server that checks the key calls it (server.Guard); a client
// cannot set a context value. Of the session routes, only
// DELETE /v1/sessions/{id} honours it.
func WithServerKey(r *http.Request) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), serverKeyCtx{}, true))
}

func hasServerKey(r *http.Request) bool {
	ok, _ := r.Context().Value(serverKeyCtx{}).(bool)
	return ok
}

// authed checks the bearer token against the session in the path.
func (s *server) authed(h func(http.ResponseWriter, *http.Request, *sandbox.Session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if sess, ok := s.authenticate(w, r); ok {
			h(w, r, sess)
		}
	}
}

// authenticate returns the session in the path if the request's bearer
// token is its token; otherwise it answers 401, 403 or 404 itself.
func (s *server) authenticate(w http.ResponseWriter, r *http.Request) (*sandbox.Session, bool) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		w.Header().Set("WWW-Authenticate", `Bearer realm="cellbox"`)
		writeError(w, http.StatusUnauthorized, "missing bearer token: send Authorization: Bearer TOKEN (the token of POST /v1/sessions)")
		return nil, false
	}
	sess, err := s.svc.Authenticate(r.PathValue("id"), token)
	switch {
	case errors.Is(err, sandbox.ErrNoSession):
		writeBoxError(w, err) // 404 no_session
	case err != nil:
		writeError(w, http.StatusForbidden, fmt.Sprintf("session %s: %v", r.PathValue("id"), err))
	default:
		return sess, true
	}
	return nil, false
}

func (s *server) handleNewSession(w http.ResponseWriter, r *http.Request) {
	body, ok := readJSONBody(w, r, nil)
	if !ok {
		return
	}
	var opts api.NewSessionRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&opts); err != nil {
		writeError(w, http.StatusBadRequest, "POST /v1/sessions takes {\"allowed_commands\": [\"prefix\", ...], \"env\": {...}, \"workspace_dir\": \"/workspace/...\", \"destroy_on_close\": true} (all optional) or no body: "+err.Error())
		return
	}
	id, token, err := s.svc.NewSessionWith(r.Context(), opts)
	if err != nil { // a bad allowed_commands list or default (400), the cap on sessions (429)
		writeBoxError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, api.NewSessionResult{ID: id, Token: token})
}

func (s *server) handleListSessions(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.svc.Sessions())
}

// handleDeleteSession deletes the session in the path, with its token or
// the server key (an operator removing a session whose token is lost).
func (s *server) handleDeleteSession(w http.ResponseWriter, r *http.Request) {
	if !hasServerKey(r) {
		if _, ok := s.authenticate(w, r); !ok {
			return
		}
	}
	if err := s.svc.DeleteSessionForClient(r.Context(), r.PathValue("id")); err != nil {
		writeBoxError(w, err) // no_session 404, the server's own 403
		return
	}
	writeJSON(w, http.StatusOK, api.OKOutput{OK: true})
}

// handleTools serves GET /v1/tools[?profile=NAME]: the tools of a profile
// (profiles.go), cellbox's own by default.
func (s *server) handleTools(w http.ResponseWriter, r *http.Request) {
	infos, err := sandbox.ToolInfosFor(r.URL.Query().Get("profile"))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, infos)
}

func (s *server) handleHealth(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "backend": s.svc.Backend().Name()})
}

// readJSONBody reads a capped body that must be JSON (empty means {})
// into buf (nil: a new one), answering 400/413 itself when it is not.
func readJSONBody(w http.ResponseWriter, r *http.Request, buf *bytes.Buffer) ([]byte, bool) {
	// Sized from Content-Length up front: a megabyte read in growing
	// slices is copied over and over.
	if buf == nil {
		buf = new(bytes.Buffer)
	}
	buf.Grow(int(min(max(r.ContentLength, 0), MaxToolBody)) + bytes.MinRead)
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, MaxToolBody))
	body := buf.Bytes()
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is larger than %d bytes; move large files with the files endpoint or transfer", MaxToolBody))
		return nil, false
	case err != nil:
		writeError(w, http.StatusBadRequest, "read request body: "+err.Error())
		return nil, false
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return []byte("{}"), true
	}
	if !fastjson.Valid(body) {
		var v any // only to say where the syntax breaks
		err := json.Unmarshal(body, &v)
		writeError(w, http.StatusBadRequest, "malformed JSON in request body: "+describeJSONError(body, err))
		return nil, false
	}
	return body, true
}

// describeJSONError says where in body a JSON syntax error is.
func describeJSONError(body []byte, err error) string {
	var se *json.SyntaxError
	if !errors.As(err, &se) {
		return err.Error()
	}
	off := max(int(se.Offset)-1, 0) // Offset counts the offending byte
	if strings.HasPrefix(se.Error(), "unexpected end of JSON input") {
		off = len(body) // where more was wanted: the end, not the last byte read
	}
	line, col := 1, 1
	for _, c := range body[:min(off, len(body))] {
		if c == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
	}
	return fmt.Sprintf("%s at offset %d (line %d, column %d)", se.Error(), off, line, col)
}

func (s *server) handleTool(w http.ResponseWriter, r *http.Request, sess *sandbox.Session) {
	profile, name := r.URL.Query().Get("profile"), r.PathValue("name")
	if _, err := sandbox.LookupToolIn(profile, name); err != nil {
		status := http.StatusNotFound
		if errors.Is(err, tools.ErrUnknownProfile) {
			status = http.StatusBadRequest
		}
		writeError(w, status, err.Error())
		return
	}
	// The body (a write_file content may be a megabyte) is read into a
	// kept buffer: the call copies what it keeps of its input.
	buf := bodies.Get()
	defer bodies.Put(buf)
	body, ok := readJSONBody(w, r, buf)
	if !ok {
		return
	}
	res, err := s.svc.AppendToolResult(r.Context(), results.Get().AvailableBuffer(), sess.ID, profile, name, body)
	if err != nil { // the session went meanwhile
		writeError(w, http.StatusNotFound, err.Error())
		return
	}
	res = append(res, '\n')     // in the same write: one system call less
	defer results.PutSlice(res) // written below, then free
	w.Header().Set("Content-Type", "application/json")
	// Announced, so that a large result is not sent in chunks and the
	// client reads it into one buffer of its size.
	w.Header().Set("Content-Length", strconv.Itoa(len(res)))
	w.Write(res)
}

// codeStatus is the HTTP status of each error code of a box operation;
// a code not here (internal, or a newer one) is 502: the box or backend
// failed, not the request.
var codeStatus = map[string]int{
	api.CodeInvalidInput:     http.StatusBadRequest,
	api.CodeNotFound:         http.StatusNotFound,
	api.CodeNoBox:            http.StatusNotFound,
	api.CodeNoSession:        http.StatusNotFound,
	api.CodeOutsideWorkspace: http.StatusForbidden,
	api.CodeRefused:          http.StatusForbidden,
	api.CodeExists:           http.StatusConflict,
	api.CodeTooLarge:         http.StatusRequestEntityTooLarge,
	api.CodeLimit:            http.StatusTooManyRequests,
	api.CodeTimeout:          http.StatusGatewayTimeout,
	api.CodeUnavailable:      http.StatusServiceUnavailable, // shutting down: call again once it is back
}

// errorStatus maps an error of a box operation to an HTTP status through
// its code (sandbox.ErrorCode), the same code the body carries.
func errorStatus(err error) int {
	if errors.Is(err, fs.ErrNotExist) {
		return http.StatusNotFound
	}
	if st, ok := codeStatus[sandbox.ErrorCode(err)]; ok {
		return st
	}
	return http.StatusBadGateway
}

func (s *server) handleExec(w http.ResponseWriter, r *http.Request, sess *sandbox.Session) {
	body, ok := readJSONBody(w, r, nil)
	if !ok {
		return
	}
	req, err := sandbox.DecodeExecRequest(body)
	if err != nil {
		writeBoxError(w, err)
		return
	}
	// The stream (200) begins when the command starts or a frame comes,
	// whichever is first: a failure before it (a bad box name, a refused
	// command, no box to be had) is answered with its code's status, as
	// the other box endpoints do; one after ends the stream with a frame.
	rc := http.NewResponseController(w)
	var mu sync.Mutex
	begun := false
	enc := json.NewEncoder(w)
	begin := func() { // mu held
		if !begun {
			begun = true
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(http.StatusOK)
		}
	}
	send := func(f api.ExecFrame) {
		mu.Lock()
		defer mu.Unlock()
		begin()
		enc.Encode(f)
		rc.Flush()
	}
	started := func() {
		mu.Lock()
		defer mu.Unlock()
		begin()
		rc.Flush()
	}
	res, err := s.svc.Exec(r.Context(), sess, r.PathValue("box"), req, started,
		func(stream string, data []byte) { send(api.ExecFrame{Stream: stream, Data: data}) },
		func(n string) { send(api.ExecFrame{Notice: n}) })
	if err != nil {
		mu.Lock()
		early := !begun
		mu.Unlock()
		if early {
			writeBoxError(w, err)
			return
		}
		send(api.ExecFrame{Error: err.Error(), Code: sandbox.ErrorCode(err)})
		return
	}
	send(api.ExecFrame{Result: &res})
}

// filePath is the box path of a files URL: relative to the workspace, or
// absolute when its leading slash was escaped.
func filePath(r *http.Request) string {
	p := r.PathValue("path")
	if p == "" {
		return "."
	}
	return p
}

func (s *server) handleDownload(w http.ResponseWriter, r *http.Request, sess *sandbox.Session) {
	started := false
	notice := func(n string) { w.Header().Add("X-Cellbox-Notice", n) }
	_, err := s.svc.Download(r.Context(), sess, r.PathValue("box"), filePath(r), w, func(fi agent.FileInfo) error {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size, 10))
		w.Header().Set("Last-Modified", fi.ModTime.UTC().Format(http.TimeFormat))
		w.Header().Set("X-Cellbox-Mode", strconv.FormatUint(uint64(fi.Mode), 8))
		started = true
		return nil
	}, notice)
	if err != nil && !started {
		writeBoxError(w, err)
		return
	}
	if err != nil {
		s.svc.Logger().Warn("download cut short", "session", sess.ID, "path", filePath(r), "err", err)
		panic(http.ErrAbortHandler) // the client must not take a cut file for whole
	}
}

func (s *server) handleUpload(w http.ResponseWriter, r *http.Request, sess *sandbox.Session) {
	var mode uint32
	if m := r.URL.Query().Get("mode"); m != "" {
		v, err := strconv.ParseUint(m, 8, 32)
		if err != nil || v > 0o7777 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("mode %q: want octal permission bits like 644 or 755", m))
			return
		}
		mode = uint32(v)
	}
	n, err := s.svc.Upload(r.Context(), sess, r.PathValue("box"), filePath(r), r.Body, mode, func(n string) { w.Header().Add("X-Cellbox-Notice", n) })
	if err != nil {
		writeBoxError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, api.UploadResult{Path: filePath(r), Bytes: n})
}

func (s *server) handleWatch(w http.ResponseWriter, r *http.Request, sess *sandbox.Session) {
	q := r.URL.Query()
	var debounce time.Duration
	if d := q.Get("debounce_ms"); d != "" {
		ms, err := strconv.Atoi(d)
		if err != nil || ms < 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("debounce_ms %q: want a number of milliseconds", d))
			return
		}
		debounce = time.Duration(ms) * time.Millisecond
	}
	ctx := r.Context()
	ch, err := s.svc.Watch(ctx, sess, r.PathValue("box"), q.Get("path"), debounce, func(n string) { w.Header().Add("X-Cellbox-Notice", n) })
	if err != nil {
		writeBoxError(w, err)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	io.WriteString(w, ": watching\n\n")
	rc.Flush()
	ping := time.NewTicker(15 * time.Second)
	defer ping.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ping.C:
			io.WriteString(w, ": ping\n\n")
		case evs, ok := <-ch:
			if !ok {
				io.WriteString(w, "event: end\ndata: {}\n\n")
				rc.Flush()
				return
			}
			data, _ := json.Marshal(evs)
			fmt.Fprintf(w, "event: changes\ndata: %s\n\n", data)
		}
		if err := rc.Flush(); err != nil {
			return
		}
	}
}
