package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// maxRequestBody caps JSON request bodies (a write of DefaultWriteBytes is
// well under it even base64-encoded).
const maxRequestBody = 64 << 20

// server is one running agent.
type server struct {
	log       *slog.Logger
	workspace string   // as configured, cleaned
	roots     []string // allowed roots, symlinks resolved
	procs     *procTable
	code      *codeTable
	ctx       context.Context // ends when Serve is asked to stop
	tunnels   sync.WaitGroup
	pulls     chan *pulled // connections the server lent for egress
	lent      atomic.Bool  // the server has lent one (GET /v1/egress/pull)
	limits    struct{ Pids, Memory int64 }
}

// Serve runs the agent until ctx ends: it creates the workspace, removes a
// stale socket, listens on opts.Socket and answers requests. When it runs as
// PID 1 it also reaps every zombie in the box. On return every process it
// started has been killed. A Socket that starts with '@' is an abstract
// unix socket (of the box's network namespace; no file).
func Serve(ctx context.Context, opts Options) error {
	s, err := newServer(ctx, opts)
	if err != nil {
		return err
	}
	if strings.HasPrefix(opts.Socket, "@") || strings.HasPrefix(opts.Socket, tcpPrefix) {
		return s.serve(ctx, opts)
	}
	if err := os.MkdirAll(filepath.Dir(opts.Socket), 0o755); err != nil {
		return fmt.Errorf("agent: create socket dir: %w", err)
	}
	if fi, err := os.Lstat(opts.Socket); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return fmt.Errorf("agent: %s exists and is not a socket; refusing to replace it", opts.Socket)
		}
		if err := os.Remove(opts.Socket); err != nil {
			return fmt.Errorf("agent: remove stale socket: %w", err)
		}
	}
	return s.serve(ctx, opts)
}

// serve listens on opts.Socket and answers until ctx ends.
func (s *server) serve(ctx context.Context, opts Options) error {
	ln, err := listen(opts)
	if err != nil {
		return err
	}
	// The host may run as another uid than the box; the per-box directory
	// holding the socket is what guards access.
	if !strings.HasPrefix(opts.Socket, "@") && !strings.HasPrefix(opts.Socket, tcpPrefix) {
		if err := os.Chmod(opts.Socket, 0o666); err != nil {
			ln.Close()
			return fmt.Errorf("agent: chmod socket: %w", err)
		}
	}
	srv := &http.Server{Handler: s.routes(), ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		ConnState: s.procs.connState}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	s.log.Info("agent listening", "socket", opts.Socket, "workspace", s.workspace, "pid", os.Getpid())
	fctx, stopForward := context.WithCancel(ctx)
	defer stopForward()
	if opts.EgressListen != "" {
		s.tunnels.Add(1)
		go func() {
			defer s.tunnels.Done()
			s.forwardEgress(fctx, opts.EgressListen, opts.EgressSocket)
		}()
	}
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	s.log.Info("agent stopping", "reason", context.Cause(ctx))
	srv.Close()
	stopForward()
	s.procs.shutdown(500 * time.Millisecond)
	s.tunnels.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

func newServer(ctx context.Context, opts Options) (*server, error) {
	if opts.Socket == "" {
		return nil, errors.New("agent: no socket path")
	}
	if opts.Workspace == "" {
		opts.Workspace = "/workspace"
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	ws, err := filepath.Abs(opts.Workspace)
	if err != nil {
		return nil, fmt.Errorf("agent: workspace %q: %w", opts.Workspace, err)
	}
	if err := os.MkdirAll(ws, 0o755); err != nil {
		return nil, fmt.Errorf("agent: create workspace: %w", err)
	}
	roots := opts.AllowedRoots
	if len(roots) == 0 {
		roots = []string{ws, "/tmp"}
	}
	var resolved []string
	for _, r := range roots {
		rr, err := filepath.EvalSymlinks(r)
		if err != nil {
			log.Warn("agent: allowed root unusable", "root", r, "err", err)
			continue
		}
		resolved = append(resolved, rr)
	}
	if os.Getenv("PATH") == "" {
		os.Setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	s := &server{log: log, workspace: ws, roots: resolved, ctx: ctx, pulls: make(chan *pulled, maxPulls)}
	s.limits.Pids, s.limits.Memory = opts.PidsLimit, opts.MemoryLimit
	s.procs = newProcTable(log, os.Getpid() == 1)
	if s.procs.reaper {
		reserveThreads(reservedThreads)
	}
	s.code = newCodeTable(s)
	return s, nil
}

func (s *server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/version", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, Version{Protocol: ProtocolVersion, PID: os.Getpid(), Workspace: s.workspace})
	})
	mux.HandleFunc("POST /v1/exec", s.handleExec)
	mux.HandleFunc("POST /v1/proc", s.handleStart)
	mux.HandleFunc("GET /v1/proc", s.handleProcesses)
	mux.HandleFunc("GET /v1/proc/{id}/logs", s.handleLogs)
	mux.HandleFunc("POST /v1/proc/{id}/signal", s.handleSignal)
	mux.HandleFunc("POST /v1/proc/{id}/wait", s.handleWait)
	mux.HandleFunc("POST /v1/proc/kill-all", s.handleKillAll)
	mux.HandleFunc("POST /v1/code", s.handleCodeCreate)
	mux.HandleFunc("GET /v1/code", s.handleCodeList)
	mux.HandleFunc("DELETE /v1/code/{id}", s.handleCodeDelete)
	mux.HandleFunc("POST /v1/code/{id}/run", s.handleCodeRun)
	mux.HandleFunc("POST /v1/fs/stat", s.handleStat)
	mux.HandleFunc("POST /v1/fs/read", s.handleRead)
	mux.HandleFunc("POST /v1/fs/write", s.handleWrite)
	mux.HandleFunc("GET /v1/fs/download", s.handleDownload)
	mux.HandleFunc("PUT /v1/fs/upload", s.handleUpload)
	mux.HandleFunc("POST /v1/fs/mkdir", s.handleMkdir)
	mux.HandleFunc("POST /v1/fs/remove", s.handleRemove)
	mux.HandleFunc("POST /v1/fs/tree", s.handleTree)
	mux.HandleFunc("POST /v1/fs/glob", s.handleGlob)
	mux.HandleFunc("POST /v1/fs/grep", s.handleGrep)
	mux.HandleFunc("GET /v1/fs/tar", s.handleTarOut)
	mux.HandleFunc("PUT /v1/fs/tar", s.handleTarIn)
	mux.HandleFunc("GET /v1/watch", s.handleWatch)
	mux.HandleFunc("GET /v1/port/{port}", s.handlePort)
	mux.HandleFunc("GET /v1/egress/pull", s.handleEgressPull)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &Error{Op: "agent", Code: CodeInvalid, Message: fmt.Sprintf("agent: no endpoint %s %s", r.Method, r.URL.Path)})
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(ProtocolHeader, strconv.Itoa(ProtocolVersion))
		mux.ServeHTTP(w, r)
	})
}

// wireError is the JSON body of an error response and of an error frame.
type wireError struct {
	Error *Error `json:"error"`
}

// errorTrailer carries an error that happened after a raw byte stream began.
const errorTrailer = "Cellbox-Error"

func statusOf(code string) int {
	switch code {
	case CodeNotFound:
		return http.StatusNotFound
	case CodeOutsideWorkspace:
		return http.StatusForbidden
	case CodeTooLarge:
		return http.StatusRequestEntityTooLarge
	case CodeExists:
		return http.StatusConflict
	case CodeTimeout:
		return http.StatusGatewayTimeout
	case CodeInvalid, CodeIsDir, CodeNotDir:
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

// asError turns any error into an *Error; errors that are not about the
// request keep an empty Code.
func asError(op, path string, err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	code := ""
	msg := err.Error()
	switch {
	case errors.Is(err, fs.ErrNotExist):
		code, msg = CodeNotFound, "no such file or directory"
	case errors.Is(err, syscall.EISDIR):
		code, msg = CodeIsDir, "is a directory"
	case errors.Is(err, syscall.ENOTDIR):
		code, msg = CodeNotDir, "not a directory"
	case errors.Is(err, syscall.ENOTEMPTY): // before ErrExist, which matches it too
		code, msg = CodeInvalid, "directory not empty (remove it recursively)"
	case errors.Is(err, fs.ErrExist):
		code, msg = CodeExists, "already exists"
	case errors.Is(err, fs.ErrPermission):
		code, msg = CodeInvalid, "permission denied"
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		code, msg = CodeTooLarge, "no space left on device: the box's disk (its limits.disk_bytes counts /workspace and /tmp) is full; remove files, or use a box with a larger disk"
	default:
		var pe *fs.PathError
		if errors.As(err, &pe) {
			msg = pe.Err.Error()
		}
	}
	if path != "" {
		msg = fmt.Sprintf("%s %s: %s", op, path, msg)
	} else {
		msg = fmt.Sprintf("%s: %s", op, msg)
	}
	return &Error{Op: op, Path: path, Code: code, Message: msg}
}

func writeError(w http.ResponseWriter, e *Error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(statusOf(e.Code))
	json.NewEncoder(w).Encode(wireError{Error: e})
}

func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, &Error{Op: "encode", Message: err.Error()})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.Write(b)
}

// readJSON decodes a capped request body; it reads to EOF so that the server
// notices at once when the client goes away (request context cancelled).
func readJSON(w http.ResponseWriter, r *http.Request, op string, v any) bool {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxRequestBody+1))
	if err == nil && len(b) > maxRequestBody {
		writeError(w, &Error{Op: op, Code: CodeTooLarge, Message: fmt.Sprintf("%s: request body over %d bytes", op, maxRequestBody)})
		return false
	}
	if err == nil {
		err = json.Unmarshal(b, v)
	}
	if err != nil {
		writeError(w, &Error{Op: op, Code: CodeInvalid, Message: fmt.Sprintf("%s: bad request body: %v", op, err)})
		return false
	}
	return true
}

// frameWriter writes NDJSON frames, flushing each; safe for concurrent use.
type frameWriter struct {
	mu  sync.Mutex
	w   http.ResponseWriter
	rc  *http.ResponseController
	enc *json.Encoder
	err error
}

func newFrameWriter(w http.ResponseWriter) *frameWriter {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	return &frameWriter{w: w, rc: http.NewResponseController(w), enc: json.NewEncoder(w)}
}

func (f *frameWriter) send(v any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	if f.err = f.enc.Encode(v); f.err == nil {
		f.err = f.rc.Flush()
	}
	return f.err
}
