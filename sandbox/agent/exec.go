package agent

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"
)

const (
	// maxOutputCap bounds ExecRequest.MaxOutput.
	maxOutputCap = 8 << 20
	// exitGrace is how long output is still collected after the command
	// exited while something it started in the background holds its pipes.
	exitGrace = 100 * time.Millisecond
	chunkSize = 32 << 10
)

// execFrame is one NDJSON frame of a streamed exec: an output chunk, the
// result (without the output, which the chunks carried) or an error.
type execFrame struct {
	Stream string      `json:"stream,omitempty"`
	Data   []byte      `json:"data,omitempty"`
	Result *ExecResult `json:"result,omitempty"`
	Error  *Error      `json:"error,omitempty"`
}

var shellPath = sync.OnceValue(func() string {
	if _, err := os.Stat("/bin/bash"); err == nil {
		return "/bin/bash"
	}
	return "/bin/sh"
})

// prepare validates req and returns argv, the working directory and env.
func (s *server) prepare(op string, req ExecRequest) (argv []string, dir string, env []string, err error) {
	switch {
	case req.Command != "" && len(req.Argv) > 0:
		return nil, "", nil, &Error{Op: op, Code: CodeInvalid, Message: op + ": give either command or argv, not both"}
	case req.Command != "":
		argv = []string{shellPath(), "-c", req.Command}
	case len(req.Argv) > 0 && req.Argv[0] != "":
		argv = req.Argv
	default:
		return nil, "", nil, &Error{Op: op, Code: CodeInvalid, Message: op + ": command is empty"}
	}
	dir = s.workspace
	if req.Cwd != "" {
		dir = req.Cwd
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(s.workspace, dir)
		}
		dir = filepath.Clean(dir)
	}
	if fi, err := os.Stat(dir); err != nil {
		return nil, "", nil, &Error{Op: op, Path: dir, Code: CodeNotFound, Message: fmt.Sprintf("%s: working directory %s does not exist", op, dir)}
	} else if !fi.IsDir() {
		return nil, "", nil, &Error{Op: op, Path: dir, Code: CodeNotDir, Message: fmt.Sprintf("%s: working directory %s is not a directory", op, dir)}
	}
	for _, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return nil, "", nil, &Error{Op: op, Code: CodeInvalid, Message: op + ": the command contains a NUL byte"}
		}
	}
	env = os.Environ()
	if len(req.Env) > 0 {
		env = slices.DeleteFunc(env, func(kv string) bool {
			k, _, _ := strings.Cut(kv, "=")
			_, set := req.Env[k]
			return set
		})
		for k, v := range req.Env {
			if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
				return nil, "", nil, &Error{Op: op, Code: CodeInvalid, Message: fmt.Sprintf("%s: bad environment variable %q", op, k)}
			}
			env = append(env, k+"="+v)
		}
	}
	return argv, dir, env, nil
}

// stdinFile returns the child's stdin: /dev/null, or a pipe fed with data.
func stdinFile(data []byte) (*os.File, error) {
	if len(data) == 0 {
		return os.Open(os.DevNull)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	go func() {
		w.Write(data) // EPIPE if the child does not read it all: fine
		w.Close()
	}()
	return r, nil
}

// collector keeps the first max bytes of one output stream, optionally
// streams them, and drains (drops) the rest.
type collector struct {
	name string
	max  int
	emit func(stream string, data []byte) // may be nil
	// follow: emit every chunk, keep none (max is ignored; emit is set).
	follow bool
	buf    []byte
	cut    bool
	held   bool // something the command left running held the pipe: later output was cut
	pipe   *outPipe
}

func newCollector(name string, max int, follow bool, pipe *os.File, emit func(string, []byte)) *collector {
	c := &collector{name: name, max: max, follow: follow, emit: emit}
	c.pipe = newOutPipe(pipe, c.add)
	return c
}

// add takes a chunk; it runs on the pipe's goroutine.
func (c *collector) add(b []byte) {
	keep := min(len(b), c.max-len(c.buf))
	if keep < len(b) {
		c.cut = true
	}
	if c.follow {
		c.emit(c.name, b)
	} else if keep > 0 {
		c.buf = append(c.buf, b[:keep]...)
		if c.emit != nil {
			c.emit(c.name, b[:keep])
		}
	}
}

// finishOutput ends the collection of a command's output once the command
// has exited: everything it wrote is collected, however slow this agent
// is. A pipe that something the command left running still holds is
// waited for a moment (exitGrace), then cut, what it held buffered
// collected too; the cut is said in the collector's held.
func finishOutput(cs ...*collector) {
	grace := time.NewTimer(exitGrace)
	defer grace.Stop()
	for _, c := range cs {
		select {
		case <-c.pipe.ended():
		case <-grace.C:
			grace.Reset(0) // spent: the other pipes are only settled
		}
		c.held = !c.pipe.settle(true)
	}
}

// heldNotice is the notice of a result whose output was cut because the
// command left something running that holds its output open.
func heldNotice(cs ...*collector) string {
	var held []string
	for _, c := range cs {
		if c.held {
			held = append(held, c.name)
		}
	}
	if len(held) == 0 {
		return ""
	}
	return fmt.Sprintf("%s: a process the command left running still holds it open; what it wrote after the command exited is not in this result (start it with background: true, or redirect its output)", strings.Join(held, " and "))
}

// outputLimit is the bytes kept per stream for a request's MaxOutput:
// DefaultMaxOutput when unset, at most maxOutputCap.
func outputLimit(n int) int {
	if n <= 0 {
		n = DefaultMaxOutput
	}
	return min(n, maxOutputCap)
}

// toUTF8 converts output to valid UTF-8; a rune cut by truncation is dropped.
func toUTF8(b []byte, truncated bool) string {
	if truncated {
		for i := 1; i < utf8.UTFMax && i <= len(b); i++ {
			if utf8.RuneStart(b[len(b)-i]) {
				if !utf8.FullRune(b[len(b)-i:]) {
					b = b[:len(b)-i]
				}
				break
			}
		}
	}
	if utf8.Valid(b) {
		return string(b)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

func (s *server) handleExec(w http.ResponseWriter, r *http.Request) {
	var req ExecRequest
	if !readJSON(w, r, "exec", &req) {
		return
	}
	argv, dir, env, err := s.prepare("exec", req)
	if err != nil {
		writeError(w, asError("exec", "", err))
		return
	}
	max := outputLimit(req.MaxOutput)
	var frames *frameWriter
	var emit func(string, []byte)
	if r.URL.Query().Get("stream") == "1" {
		frames = newFrameWriter(w)
		emit = func(stream string, data []byte) { frames.send(execFrame{Stream: stream, Data: data}) }
	}
	fail := func(e *Error) {
		if frames != nil {
			frames.send(execFrame{Error: e})
		} else {
			writeError(w, e)
		}
	}

	stdin, err := stdinFile(req.Stdin)
	if err != nil {
		fail(asError("exec", "", err))
		return
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		stdin.Close()
		fail(asError("exec", "", err))
		return
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		stdin.Close()
		outR.Close()
		outW.Close()
		fail(asError("exec", "", err))
		return
	}
	begin := time.Now()
	p, notices, err := s.start(argv, dir, env, []*os.File{stdin, outW, errW}, commandLine(req), false, req.KeepLeftovers)
	stdin.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		fail(asError("exec", "", err))
		return
	}
	follow := req.Follow && emit != nil
	stdout := newCollector("stdout", max, follow, outR, emit)
	stderr := newCollector("stderr", max, follow, errR, emit)

	var timeout <-chan time.Time
	if req.TimeoutMs > 0 {
		t := time.NewTimer(time.Duration(req.TimeoutMs) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	res := ExecResult{ProcessID: p.id, Notices: notices}
	oomBefore := s.oomKills()
	select {
	case <-p.done:
	case <-timeout:
		res.TimedOut = true
		p.kill()
	case <-r.Context().Done():
		p.kill()
	case <-s.ctx.Done():
		p.kill()
	}
	<-p.done
	// What the command left running ends with it (background: true is
	// how to keep a process); its pipes close, and what it wrote stays
	// readable.
	if !req.KeepLeftovers {
		if n := s.procs.sweep(false); n > 0 {
			res.Notices = append(res.Notices, leftoverNotice(n))
		}
	}
	finishOutput(stdout, stderr)
	if msg := heldNotice(stdout, stderr); msg != "" {
		res.Notices = append(res.Notices, msg)
	}
	if msg := s.oomNotice(p, oomBefore); msg != "" {
		res.Notices = append(res.Notices, msg)
	}
	res.ExitCode = p.exitCode
	res.Truncated = stdout.cut || stderr.cut
	res.DurationMs = time.Since(begin).Milliseconds()
	if frames != nil {
		frames.send(execFrame{Result: &res})
		return
	}
	res.Stdout = toUTF8(stdout.buf, stdout.cut)
	res.Stderr = toUTF8(stderr.buf, stderr.cut)
	writeJSON(w, res)
}

func commandLine(req ExecRequest) string {
	if req.Command != "" {
		return req.Command
	}
	return strings.Join(req.Argv, " ")
}

// --- background processes ---

func (s *server) handleStart(w http.ResponseWriter, r *http.Request) {
	var req ExecRequest
	if !readJSON(w, r, "start", &req) {
		return
	}
	argv, dir, env, err := s.prepare("start", req)
	if err != nil {
		writeError(w, asError("start", "", err))
		return
	}
	stdin, err := stdinFile(req.Stdin)
	if err != nil {
		writeError(w, asError("start", "", err))
		return
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		stdin.Close()
		writeError(w, asError("start", "", err))
		return
	}
	p, notices, err := s.start(argv, dir, env, []*os.File{stdin, outW, outW}, commandLine(req), true, false)
	stdin.Close()
	outW.Close()
	if err != nil {
		outR.Close()
		writeError(w, asError("start", "", err))
		return
	}
	p.log = newRing(DefaultLogBuffer)
	for _, n := range notices {
		p.log.Write([]byte("cellbox: " + n + "\n"))
	}
	p.out = newOutPipe(outR, func(b []byte) { p.log.Write(b) })
	go func() {
		<-p.out.ended()
		p.log.close()
	}()
	if req.TimeoutMs > 0 {
		t := time.AfterFunc(time.Duration(req.TimeoutMs)*time.Millisecond, func() { p.kill() })
		go func() { <-p.done; t.Stop() }()
	}
	writeJSON(w, p.info())
}

func (s *server) handleProcesses(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, s.procs.list())
}

func (s *server) handleSignal(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Signal int `json:"signal"`
	}
	if !readJSON(w, r, "signal", &req) {
		return
	}
	p, err := s.procs.get(r.PathValue("id"))
	if err != nil {
		writeError(w, asError("signal", "", err))
		return
	}
	if req.Signal <= 0 || req.Signal > 64 {
		writeError(w, &Error{Op: "signal", Code: CodeInvalid, Message: fmt.Sprintf("signal: bad signal number %d", req.Signal)})
		return
	}
	select {
	case <-p.done:
		writeError(w, &Error{Op: "signal", Path: p.id, Code: CodeInvalid, Message: fmt.Sprintf("signal %s: process has already exited with code %d", p.id, p.exitCode)})
		return
	default:
	}
	if syscall.Signal(req.Signal) == syscall.SIGKILL {
		p.kill()
	} else if err := p.signal(syscall.Signal(req.Signal)); err != nil {
		writeError(w, asError("signal", p.id, err))
		return
	}
	writeJSON(w, struct{}{})
}

func (s *server) handleWait(w http.ResponseWriter, r *http.Request) {
	p, err := s.procs.get(r.PathValue("id"))
	if err != nil {
		writeError(w, asError("wait", "", err))
		return
	}
	select {
	case <-p.done:
	case <-r.Context().Done():
		return
	case <-s.ctx.Done():
		return
	}
	writeJSON(w, p.info())
}

// logOffsetHeader tells the client where the logs it gets start (the ring
// may have dropped what it asked for).
const logOffsetHeader = "Cellbox-Log-Offset"

func (s *server) handleLogs(w http.ResponseWriter, r *http.Request) {
	p, err := s.procs.get(r.PathValue("id"))
	if err != nil {
		writeError(w, asError("logs", "", err))
		return
	}
	if p.log == nil {
		writeError(w, &Error{Op: "logs", Path: p.id, Code: CodeInvalid, Message: fmt.Sprintf("logs %s: a foreground exec has no log; its output comes with the exec result", p.id)})
		return
	}
	offset, _ := strconv.ParseInt(r.URL.Query().Get("offset"), 10, 64)
	follow := r.URL.Query().Get("follow") == "1"
	data, off, changed, closed := p.log.read(offset)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set(logOffsetHeader, strconv.FormatInt(off, 10))
	if !follow {
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		w.Write(data)
		return
	}
	rc := http.NewResponseController(w)
	exited := p.done
	for {
		if len(data) > 0 {
			if _, err := w.Write(data); err != nil {
				return
			}
		}
		if err := rc.Flush(); err != nil || closed {
			return
		}
		select {
		case <-changed:
		case <-exited:
			// What it wrote before it exited may still be in the pipe,
			// however slowly the pipe's reader runs; something the
			// process left behind may hold the pipe open: what that
			// writes after a moment is not followed.
			exited = nil
			select {
			case <-p.out.ended():
			case <-time.After(exitGrace):
			}
			p.out.settle(false)
			closed = true
		case <-r.Context().Done():
			return
		case <-s.ctx.Done():
			return
		}
		off += int64(len(data))
		var eof bool
		data, off, changed, eof = p.log.read(off)
		closed = closed || eof
	}
}

// ring keeps the last size bytes written to it; offsets count every byte
// ever written.
type ring struct {
	mu      sync.Mutex
	buf     []byte
	size    int
	end     int64 // total bytes written
	closed  bool
	changed chan struct{} // closed and replaced on every write
}

func newRing(size int) *ring { return &ring{size: size, changed: make(chan struct{})} }

func (r *ring) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(p)
	if len(r.buf) < r.size && r.end+int64(n) <= int64(r.size) {
		r.buf = append(r.buf, p...) // still growing: byte o is at buf[o]
		r.end += int64(n)
	} else {
		if len(r.buf) < r.size {
			full := make([]byte, r.size)
			copy(full, r.buf)
			r.buf = full
		}
		if n > r.size {
			r.end += int64(n - r.size)
			p = p[n-r.size:]
		}
		for len(p) > 0 { // full: byte o is at buf[o % size]
			c := copy(r.buf[r.end%int64(r.size):], p)
			r.end += int64(c)
			p = p[c:]
		}
	}
	close(r.changed)
	r.changed = make(chan struct{})
	return n, nil
}

// close marks the writer done.
func (r *ring) close() {
	r.mu.Lock()
	r.closed = true
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

// read returns the bytes from offset on (from the oldest kept byte if offset
// was dropped), the offset they start at, a channel closed on the next write,
// and whether the writer is done.
func (r *ring) read(offset int64) ([]byte, int64, <-chan struct{}, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	start := r.end - int64(len(r.buf))
	offset = max(min(offset, r.end), start)
	out := make([]byte, 0, r.end-offset)
	for o := offset; o < r.end; {
		at := int(o % int64(r.size))
		c := min(int64(len(r.buf)-at), r.end-o)
		out = append(out, r.buf[at:at+int(c)]...)
		o += c
	}
	return out, offset, r.changed, r.closed
}

// KillAllResult is the answer of kill-all.
type KillAllResult struct {
	Ended int `json:"ended"` // processes ended
}

func (s *server) handleKillAll(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, KillAllResult{Ended: s.killAll()})
}
