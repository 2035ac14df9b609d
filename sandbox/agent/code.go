package agent

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Code contexts: a long-running interpreter (python3, node or bash) per
// context, started by the agent like any command, that runs cells and
// keeps its variables, imports and definitions between them.
//
// Why this design: the interpreter is a plain child of the agent (so it is
// in the process table, killed on shutdown, reaped by PID 1), driven by a
// small driver program of its own language (drivers/, embedded here and
// passed on the command line, so nothing is installed in the box). The
// driver says it is ready on fd 4, then reads one JSON request per line on
// fd 3 and writes one JSON answer per line on fd 4; the code's own stdin is /dev/null. Its stdout and
// stderr (fd 1 and 2) are pipes the agent drains all the time, keeping the
// first MaxOutput bytes of each cell (so a cell printing without end costs
// neither memory nor disk); what subprocesses of the cell print is caught
// too. After a cell the driver writes a marker with the cell's number to
// both (a random token given to the driver only), which tells where the
// cell's output ends in each stream. The cell's source goes through a file
// (the answer pipe carries only its path), so no driver has to parse code
// out of JSON (bash cannot). A timeout sends SIGINT to the interpreter's
// process group: Python raises KeyboardInterrupt, node's vm stops the
// script (breakOnSigint), bash returns from the cell; the context lives
// on. An interpreter that does not answer within codeInterruptGrace of the
// SIGINT is killed, and its context ends.

// Code languages.
const (
	LangPython     = "python"
	LangJavaScript = "javascript"
	LangBash       = "bash"
)

// CodeLanguages lists the languages of code contexts.
var CodeLanguages = []string{LangPython, LangJavaScript, LangBash}

var (
	//go:embed drivers/driver.py
	driverPython string
	//go:embed drivers/driver.js
	driverJS string
	//go:embed drivers/driver.sh
	driverBash string
)

// codeInterpreter is the argv that starts a language's driver.
func codeInterpreter(lang string) ([]string, bool) {
	switch lang {
	case LangPython:
		return []string{"python3", "-c", driverPython}, true
	case LangJavaScript:
		return []string{"node", "--expose-internals", "-e", driverJS}, true
	case LangBash:
		return []string{"bash", "-c", driverBash}, true
	}
	return nil, false
}

const (
	// MaxCodeContexts is how many code contexts a box may have at once.
	MaxCodeContexts = 8
	// codeStartTimeout bounds an interpreter's start.
	codeStartTimeout = 30 * time.Second
	// codeInterruptGrace is how long an interrupted cell may take to stop.
	codeInterruptGrace = 3 * time.Second
	// maxCodeAnswer caps one answer line of a driver (rich outputs are
	// capped at 16 MiB in the drivers; base64 and JSON add a third).
	maxCodeAnswer = 32 << 20
	// markerWait bounds the wait for a cell's output markers after its
	// answer (the cell may have closed its stdout).
	markerWait = 2 * time.Second
	// markerEnv passes the marker prefix to the driver, which removes it
	// from its environment before the code runs.
	markerEnv = "CELLBOX_CODE_MARK"
	// maxEndedContexts is how many ended contexts are remembered, to say
	// why they ended.
	maxEndedContexts = 64
	// codeDirName, in the temp dir, holds a directory per boot of the
	// agent and in it one per context (cell source, output files).
	codeDirName = ".cellbox-code"
)

// CodeContextRequest creates a code context.
type CodeContextRequest struct {
	Language string            `json:"language"`
	Cwd      string            `json:"cwd,omitempty"` // default workspace
	Env      map[string]string `json:"env,omitempty"`
}

// CodeContext describes a code context.
type CodeContext struct {
	ID       string    `json:"id"`
	Language string    `json:"language"`
	PID      int       `json:"pid"`
	Created  time.Time `json:"created"`
	Cells    int       `json:"cells"` // cells run so far
	Busy     bool      `json:"busy"`  // a cell is running
}

// CodeRunRequest runs one cell in a context.
type CodeRunRequest struct {
	Code      string `json:"code"`
	TimeoutMs int    `json:"timeout_ms,omitempty"` // 0 = none; on timeout the cell is interrupted (SIGINT)
	MaxOutput int    `json:"max_output,omitempty"` // bytes kept per stream, and of the value (default 1 MiB)
}

// CodeOutput is one rich output of a cell: an image, SVG, HTML, JSON, ...
type CodeOutput struct {
	MIME     string `json:"mime"`
	Data     string `json:"data"`
	Encoding string `json:"encoding,omitempty"` // "base64" for binary data (PNG), else text
}

// CodeError is an exception (or error) a cell raised.
type CodeError struct {
	Name      string `json:"name"`
	Message   string `json:"message"`
	Traceback string `json:"traceback,omitempty"`
}

// CodeResult is the outcome of a cell.
type CodeResult struct {
	Stdout    string       `json:"stdout"`
	Stderr    string       `json:"stderr"`
	Truncated bool         `json:"truncated,omitempty"` // stdout, stderr or the value was cut at MaxOutput
	Value     *string      `json:"value,omitempty"`     // repr / util.inspect of the last expression; nil when none (or None/undefined)
	Outputs   []CodeOutput `json:"outputs,omitempty"`
	Error     *CodeError   `json:"error,omitempty"`
	ExitCode  *int         `json:"exit_code,omitempty"` // bash: the status of the cell's last command
	TimedOut  bool         `json:"timed_out,omitempty"`
	// Ended says why the context ended during this cell (the interpreter
	// exited or was killed); the context is gone.
	Ended      string `json:"ended,omitempty"`
	DurationMs int64  `json:"duration_ms"`
}

// driverAnswer is what a driver writes on fd 4 after a cell.
type driverAnswer struct {
	Value    *string      `json:"value"`
	Outputs  []CodeOutput `json:"outputs"`
	Error    *CodeError   `json:"error"`
	ExitCode *int         `json:"exit_code"`
	// Truncated: the value was cut (at the request's max, as the streams).
	Truncated bool `json:"truncated"`
	// TimedOut: the driver stopped the cell at the request's timeout
	// (JavaScript's does; see selfTimeout).
	TimedOut bool `json:"timed_out"`
}

// selfTimeout is how long the agent lets a driver that times its cells out
// itself (JavaScript's: node's vm takes its SIGINT listeners off while a
// script starts and ends, and a SIGINT then ends node) answer after the
// cell's timeout, before it interrupts it with SIGINT as it does the others.
var selfTimeout = map[string]time.Duration{LangJavaScript: time.Second}

// interruptAgain is how often a cell that has not answered an interrupt
// gets another SIGINT, within codeInterruptGrace.
const interruptAgain = 100 * time.Millisecond

// codeCtx is one running context.
type codeCtx struct {
	id, lang string
	dir      string
	p        *proc
	created  time.Time
	req      *os.File      // fd 3 of the driver, our end
	answers  chan []byte   // one per cell; closed when the driver's fd 4 closes
	stdout   *cellStream   // the driver's fd 1
	stderr   *cellStream   // the driver's fd 2
	turn     chan struct{} // one cell at a time
	gone     chan struct{} // closed when the table has forgotten it
	cells    int           // under codeTable.mu
	busy     bool          // under codeTable.mu

	endOnce sync.Once
	ended   string // why it ended: see end and why

	s         *server
	oomBefore atomic.Int64 // the box's oom_kill count before the latest cell (oomKills)
}

// codeTable holds the contexts of this agent. Context ids carry the boot id
// of the agent that made them, so an id from before a restart of the box is
// told apart from one that never existed.
type codeTable struct {
	s    *server
	boot string
	dir  string // this boot's directory of contexts

	mu        sync.Mutex
	next      int
	starting  int // contexts whose interpreter is starting (they count against the cap)
	byID      map[string]*codeCtx
	ended     map[string]string // id -> why it ended
	endedList []string          // oldest first
	cleaned   bool
}

func newCodeTable(s *server) *codeTable {
	b := make([]byte, 3)
	rand.Read(b)
	boot := hex.EncodeToString(b)
	return &codeTable{s: s, boot: boot, dir: filepath.Join(os.TempDir(), codeDirName, boot), byID: map[string]*codeCtx{}, ended: map[string]string{}}
}

func codeErr(op, id, code, format string, args ...any) *Error {
	return &Error{Op: op, Path: id, Code: code, Message: op + ": " + fmt.Sprintf(format, args...)}
}

// get finds a running context, or says why there is none.
func (t *codeTable) get(op, id string) (*codeCtx, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if c := t.byID[id]; c != nil {
		return c, nil
	}
	if why, ok := t.ended[id]; ok {
		return nil, codeErr(op, id, CodeNotFound, "code context %s ended: %s; create a new one", id, why)
	}
	parts := strings.Split(id, "-")
	if len(parts) == 3 && slices.Contains(CodeLanguages, parts[0]) && parts[1] != t.boot {
		return nil, codeErr(op, id, CodeNotFound, "no code context %s in this box: it was made in another box, or in this one before it restarted (or slept and woke), and interpreter state does not survive that; create a new one", id)
	}
	return nil, codeErr(op, id, CodeNotFound, "no code context %s in this box (list them, or create one)", id)
}

func (t *codeTable) create(ctx context.Context, req CodeContextRequest) (*codeCtx, error) {
	const op = "code context"
	argv, ok := codeInterpreter(req.Language)
	if !ok {
		return nil, codeErr(op, "", CodeInvalid, "unknown language %q: want one of %s", req.Language, strings.Join(CodeLanguages, ", "))
	}
	_, dir, env, err := t.s.prepare(op, ExecRequest{Argv: argv, Cwd: req.Cwd, Env: req.Env})
	if err != nil {
		return nil, err
	}
	env = withDefaultEnv(env, req.Language)
	mark := make([]byte, 8)
	rand.Read(mark)
	prefix := "\x1bcellbox-" + hex.EncodeToString(mark) + "-"
	env = append(slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, markerEnv+"=") }), markerEnv+"="+prefix)

	t.mu.Lock()
	if len(t.byID)+t.starting >= MaxCodeContexts {
		t.mu.Unlock()
		return nil, codeErr(op, "", CodeTooLarge, "this box has %d code contexts, the most it may have; delete one first", MaxCodeContexts)
	}
	if !t.cleaned && t.s.procs.reaper {
		// As the box's PID 1, this agent owns the temp dir: what is left
		// there is from an earlier boot of the box.
		old, _ := os.ReadDir(filepath.Dir(t.dir))
		for _, e := range old {
			if e.Name() != t.boot {
				os.RemoveAll(filepath.Join(filepath.Dir(t.dir), e.Name()))
			}
		}
		t.cleaned = true
	}
	t.next++
	id := fmt.Sprintf("%s-%s-%d", req.Language, t.boot, t.next)
	c := &codeCtx{id: id, lang: req.Language, dir: filepath.Join(t.dir, id), created: time.Now(),
		answers: make(chan []byte, 1), turn: make(chan struct{}, 1), gone: make(chan struct{}), s: t.s}
	c.oomBefore.Store(t.s.oomKills())
	t.starting++
	t.mu.Unlock()

	err = c.start(argv, dir, env, prefix)
	if err == nil {
		err = c.waitReady(ctx, argv[0])
	}
	t.mu.Lock()
	t.starting--
	if err == nil {
		t.byID[id] = c
	}
	t.mu.Unlock()
	if err != nil {
		if IsCode(err, CodeNotFound) {
			return nil, codeErr(op, "", CodeNotFound, "%s is not installed in this box (%v); use an image that has it", argv[0], err)
		}
		return nil, err
	}
	go func() {
		<-c.p.done
		t.forget(c)
	}()
	return c, nil
}

// withDefaultEnv adds what a language's driver needs unless env sets it.
func withDefaultEnv(env []string, lang string) []string {
	var add []string
	switch lang {
	case LangPython:
		// Agg draws plots without a display; the driver returns them as PNG.
		add = []string{"MPLBACKEND=Agg", "PYTHONUNBUFFERED=1"}
	}
	for _, kv := range add {
		k, _, _ := strings.Cut(kv, "=")
		if !slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, k+"=") }) {
			env = append(env, kv)
		}
	}
	return env
}

func (c *codeCtx) start(argv []string, dir string, env []string, prefix string) (err error) {
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return asError("code context", c.dir, err)
	}
	var toClose []*os.File
	defer func() {
		for _, f := range toClose {
			f.Close()
		}
		if err != nil {
			c.closeFiles()
			os.RemoveAll(c.dir)
		}
	}()
	outR, outW, err := os.Pipe()
	if err != nil {
		return asError("code context", "", err)
	}
	toClose = append(toClose, outR, outW)
	errR, errW, err := os.Pipe()
	if err != nil {
		return asError("code context", "", err)
	}
	toClose = append(toClose, errR, errW)
	null, err := os.Open(os.DevNull)
	if err != nil {
		return asError("code context", "", err)
	}
	toClose = append(toClose, null)
	reqR, reqW, err := os.Pipe()
	if err != nil {
		return asError("code context", "", err)
	}
	c.req = reqW
	toClose = append(toClose, reqR)
	ansR, ansW, err := os.Pipe()
	if err != nil {
		return asError("code context", "", err)
	}
	toClose = append(toClose, ansW)
	c.p, err = c.s.procs.start(argv, dir, env, []*os.File{null, outW, errW, reqR, ansW}, "code context "+c.id+" ("+argv[0]+")", false, false)
	if err != nil {
		ansR.Close()
		return err
	}
	toClose = slices.DeleteFunc(toClose, func(f *os.File) bool { return f == outR || f == errR })
	c.stdout = newCellStream(outR, prefix)
	c.stderr = newCellStream(errR, prefix)
	go c.readAnswers(ansR)
	return nil
}

// waitReady waits for the driver's first line, which says it is ready to
// run cells: a SIGINT before that would kill it rather than interrupt a
// cell. A driver that is not ready is killed, with what it printed.
func (c *codeCtx) waitReady(ctx context.Context, interp string) error {
	tm := time.NewTimer(codeStartTimeout)
	defer tm.Stop()
	var why string
	select {
	case a, ok := <-c.answers:
		if ok && string(a) == `{"ready":true}` {
			return nil
		}
		why = fmt.Sprintf("its first answer was %.100q, not ready", a)
	case <-c.p.done:
		why = fmt.Sprintf("it exited (exit code %d)", c.p.exitCode)
	case <-tm.C:
		why = fmt.Sprintf("it was not ready within %s", codeStartTimeout)
	case <-ctx.Done():
		why = ctx.Err().Error()
	}
	c.p.kill()
	<-c.p.done
	wait := make(chan struct{})
	time.AfterFunc(100*time.Millisecond, func() { close(wait) })
	stderr, _ := c.stderr.cell(0, wait)
	c.closeFiles()
	os.RemoveAll(c.dir)
	msg := fmt.Sprintf("code context: %s did not start: %s", interp, why)
	if stderr = strings.TrimSpace(stderr); stderr != "" {
		msg += "; its stderr: " + stderr[max(len(stderr)-2000, 0):]
	}
	return &Error{Op: "code context", Code: CodeInvalid, Message: msg}
}

// readAnswers hands each answer line of the driver to the running cell.
func (c *codeCtx) readAnswers(r *os.File) {
	defer r.Close()
	defer close(c.answers)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxCodeAnswer)
	for sc.Scan() {
		select {
		case c.answers <- slices.Clone(sc.Bytes()):
		case <-c.p.done: // nobody will read it (the code wrote to fd 4 itself)
			return
		}
	}
	if err := sc.Err(); err != nil {
		c.end(fmt.Sprintf("its interpreter sent a bad answer (%v)", err))
		c.p.kill()
	}
}

// end records why the context ended; the first reason wins.
func (c *codeCtx) end(why string) {
	c.endOnce.Do(func() { c.ended = why })
}

// why says why the context ended; call it after the interpreter exited.
// An interpreter the kernel killed for want of memory says so, as a shell
// command does (it said "exit code -1").
func (c *codeCtx) why() string {
	reason := fmt.Sprintf("its interpreter exited (exit code %d)", c.p.exitCode)
	switch {
	case c.p.killedBy != 0 && c.p.killed.Load():
		reason = fmt.Sprintf("its interpreter was killed by the agent (%s)", unix.SignalName(c.p.killedBy))
	case c.p.killedBy != 0:
		reason = fmt.Sprintf("its interpreter was killed by %s", unix.SignalName(c.p.killedBy))
	}
	if note := c.s.oomNotice(c.p, c.oomBefore.Load()); note != "" {
		reason += ": " + note
	}
	c.end(reason)
	return c.ended
}

func (c *codeCtx) closeFiles() {
	if c.req != nil {
		c.req.Close()
	}
}

// forget moves an ended context to the ended list.
func (t *codeTable) forget(c *codeCtx) {
	t.mu.Lock()
	if t.byID[c.id] == c {
		delete(t.byID, c.id)
		t.ended[c.id] = c.why()
		t.endedList = append(t.endedList, c.id)
		for len(t.endedList) > maxEndedContexts {
			delete(t.ended, t.endedList[0])
			t.endedList = t.endedList[1:]
		}
	}
	t.mu.Unlock()
	// Wait for a running cell to give its turn back before the files go.
	c.turn <- struct{}{}
	c.closeFiles()
	os.RemoveAll(c.dir)
	close(c.gone)
}

// endAll records why every running context is about to end (its
// interpreter is killed with every process of the box).
func (t *codeTable) endAll(why string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range t.byID {
		c.end(why)
	}
}

// remove ends a context: its interpreter is killed with its process group.
func (t *codeTable) remove(id string) error {
	c, err := t.get("delete code context", id)
	if err != nil {
		return err
	}
	c.end("it was deleted")
	c.p.kill()
	<-c.gone
	return nil
}

func (t *codeTable) info(c *codeCtx) CodeContext {
	return CodeContext{ID: c.id, Language: c.lang, PID: c.p.pid, Created: c.created, Cells: c.cells, Busy: c.busy}
}

func (t *codeTable) list() []CodeContext {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]CodeContext, 0, len(t.byID))
	for _, c := range t.byID {
		out = append(out, t.info(c))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}

// setBusy marks a context as running a cell (counting it) or idle, and
// returns the number of the cell.
func (t *codeTable) setBusy(c *codeCtx, busy bool) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	c.busy = busy
	if busy {
		c.cells++
	}
	return c.cells
}

// run runs one cell; ctx ending (the caller went away) interrupts it.
func (t *codeTable) run(ctx context.Context, id string, req CodeRunRequest) (CodeResult, error) {
	const op = "run code"
	c, err := t.get(op, id)
	if err != nil {
		return CodeResult{}, err
	}
	select {
	case c.turn <- struct{}{}:
	case <-c.p.done:
		return CodeResult{}, codeErr(op, id, CodeNotFound, "code context %s ended: %s; create a new one", id, c.why())
	case <-ctx.Done():
		return CodeResult{}, codeErr(op, id, CodeTimeout, "code context %s is busy with another cell: %v", id, ctx.Err())
	}
	defer func() { <-c.turn }()
	select {
	case <-c.p.done:
		return CodeResult{}, codeErr(op, id, CodeNotFound, "code context %s ended: %s; create a new one", id, c.why())
	default:
	}
	n := t.setBusy(c, true)
	defer t.setBusy(c, false)
	maxOut := outputLimit(req.MaxOutput)

	begin := time.Now()
	c.oomBefore.Store(t.s.oomKills())
	c.stdout.setMax(maxOut)
	c.stderr.setMax(maxOut)
	cell := filepath.Join(c.dir, "cell")
	if err := writeNoFollow(cell, []byte(req.Code)); err != nil {
		return CodeResult{}, asError(op, id, err)
	}
	line, _ := json.Marshal(map[string]any{"file": cell, "n": n, "max": maxOut, "timeout": max(req.TimeoutMs, 0)})
	if _, err := c.req.Write(append(line, '\n')); err != nil {
		// It is dying: of an end already recorded (a bad answer of the
		// last cell, whose kill may not have landed yet), which why
		// reports, or of this.
		c.end(fmt.Sprintf("its interpreter stopped reading (%v)", err))
		c.p.kill()
		<-c.p.done
		return CodeResult{}, codeErr(op, id, CodeNotFound, "code context %s ended: %s; create a new one", id, c.why())
	}

	var timeout <-chan time.Time
	if req.TimeoutMs > 0 {
		tm := time.NewTimer(time.Duration(req.TimeoutMs) * time.Millisecond)
		defer tm.Stop()
		timeout = tm.C
	}
	var res CodeResult
	var answer []byte
	var grace, again <-chan time.Time
	interrupt := func() {
		c.p.signal(syscall.SIGINT)
		if grace == nil {
			grace = time.After(codeInterruptGrace)
		}
		// A SIGINT that lands while the driver is between cells (it has
		// not begun this one yet) is ignored there: send it again until
		// the cell answers. Not to a driver that times its cells out
		// itself (node, which a SIGINT as it starts or ends a script
		// ends: see selfTimeout).
		if _, self := selfTimeout[c.lang]; !self {
			again = time.After(interruptAgain)
		}
	}
	quit := ctx.Done()
	serverDone := t.s.ctx.Done()
	selfGrace := selfTimeout[c.lang]
wait:
	for {
		select {
		case a, ok := <-c.answers:
			if !ok { // no answer can come any more
				select {
				case <-c.p.done: // it exited, closing the pipe
				case <-time.After(time.Second): // the code closed fd 4
					c.end("its interpreter's answer pipe was closed")
					c.p.kill()
				}
			}
			answer = a
			break wait
		case <-timeout:
			res.TimedOut = true
			timeout = nil
			if selfGrace > 0 { // the driver stops the cell; SIGINT if it has not within the grace
				timeout, selfGrace = time.After(selfGrace), 0
				continue
			}
			interrupt()
		case <-quit:
			quit = nil
			interrupt()
		case <-serverDone:
			serverDone = nil
			interrupt()
		case <-c.p.done:
			// An answer written just before the exit still counts,
			// however late its reader runs; the answers end when the
			// pipe does (unless something the cell left running holds
			// it: then not past markerWait).
			select {
			case a, ok := <-c.answers:
				if ok {
					answer = a
				}
			case <-time.After(markerWait):
			}
			break wait
		case <-again:
			interrupt()
		case <-grace:
			c.end(fmt.Sprintf("the interpreter did not stop within %s of an interrupt (SIGINT) and was killed", codeInterruptGrace))
			c.p.kill()
			break wait
		}
	}
	if answer == nil {
		<-c.p.done
		res.Ended = c.why()
	} else {
		var a driverAnswer
		if err := json.Unmarshal(answer, &a); err != nil {
			// Out of step with its driver (the code wrote to fd 4 itself).
			c.end(fmt.Sprintf("its interpreter sent a bad answer (%v)", err))
			c.p.kill()
			return res, codeErr(op, id, "", "code context %s ended: its interpreter sent a bad answer (%v); create a new one", id, err)
		}
		res.Value, res.Outputs, res.Error, res.ExitCode, res.Truncated = a.Value, a.Outputs, a.Error, a.ExitCode, a.Truncated
		res.TimedOut = res.TimedOut || a.TimedOut
	}
	// The markers come before the answer. After an end there are none,
	// and the output ends when the pipes close (unless something the cell
	// left running holds them).
	wait := make(chan struct{}) // closed, so that both streams see it
	tm := time.AfterFunc(markerWait, func() { close(wait) })
	defer tm.Stop()
	var cut1, cut2 bool
	res.Stdout, cut1 = c.stdout.cell(n, wait)
	res.Stderr, cut2 = c.stderr.cell(n, wait)
	res.Truncated = res.Truncated || cut1 || cut2
	res.DurationMs = time.Since(begin).Milliseconds()
	return res, nil
}

// writeNoFollow writes a file the code may have replaced by a link.
func writeNoFollow(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// cellStream drains one output pipe of an interpreter and cuts it into
// cells at the driver's markers: prefix followed by the cell number in 8
// digits. Of each cell it keeps the first max bytes and drops the rest.
// Output between cells (a background job of an earlier cell) counts as
// the next cell's.
type cellStream struct {
	prefix []byte

	mu      sync.Mutex
	max     int
	buf     []byte
	cut     bool
	pending []byte // read but not yet in buf: it may begin a marker
	ended   bool
	seen    chan struct{} // closed and replaced at each marker and at the end
	done    map[int]cellOut
	pipe    *outPipe
}

type cellOut struct {
	data []byte
	cut  bool
}

const markerDigits = 8

func newCellStream(r *os.File, prefix string) *cellStream {
	s := &cellStream{prefix: []byte(prefix), max: DefaultMaxOutput, seen: make(chan struct{}), done: map[int]cellOut{}}
	s.pipe = newOutPipe(r, s.scan)
	go func() {
		<-s.pipe.ended()
		s.mu.Lock()
		s.keep(s.pending)
		s.pending = nil
		s.ended = true
		close(s.seen)
		s.mu.Unlock()
	}()
	return s
}

func (s *cellStream) setMax(max int) {
	s.mu.Lock()
	s.max = max
	s.mu.Unlock()
}

// scan adds the output read to the cell up to the last byte that cannot
// begin a marker, handles whole markers, and keeps the rest pending.
func (s *cellStream) scan(read []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := append(s.pending, read...)
	whole := len(s.prefix) + markerDigits
	for {
		i := bytes.Index(p, s.prefix)
		if i < 0 {
			// Keep back a tail that may be the start of a marker.
			k := max(len(p)-(len(s.prefix)-1), 0)
			s.keep(p[:k])
			s.pending = append([]byte(nil), p[k:]...)
			return
		}
		if len(p) < i+whole {
			s.keep(p[:i])
			s.pending = append([]byte(nil), p[i:]...)
			return
		}
		s.keep(p[:i])
		if n, err := strconv.Atoi(string(p[i+len(s.prefix) : i+whole])); err == nil {
			s.done[n] = cellOut{data: s.buf, cut: s.cut}
			s.buf, s.cut = nil, false
			for k := range s.done { // only a late marker is ever left behind
				if k < n-4 {
					delete(s.done, k)
				}
			}
			close(s.seen)
			s.seen = make(chan struct{})
		}
		p = p[i+whole:]
	}
}

// keep adds b to the current cell's output, up to max bytes. Under mu.
func (s *cellStream) keep(b []byte) {
	room := s.max - len(s.buf)
	if len(b) > room {
		s.cut = true
		b = b[:max(room, 0)]
	}
	s.buf = append(s.buf, b...)
}

// cell returns cell n's output once its marker has come, or, when wait
// fires first (or the stream ended), what has come so far: everything
// written before wait fired, however slowly the pipe is read.
func (s *cellStream) cell(n int, wait <-chan struct{}) (string, bool) {
	for settled := false; ; {
		s.mu.Lock()
		if out, ok := s.done[n]; ok {
			delete(s.done, n)
			s.mu.Unlock()
			return toUTF8(out.data, out.cut), out.cut
		}
		if s.ended || settled {
			s.keep(s.pending)
			out, cut := s.buf, s.cut
			s.buf, s.cut, s.pending = nil, false, nil
			s.mu.Unlock()
			return toUTF8(out, cut), cut
		}
		seen := s.seen
		s.mu.Unlock()
		select {
		case <-seen:
		case <-wait:
			// The marker may be in the pipe still: read what it holds,
			// then look once more.
			s.pipe.settle(false)
			settled = true
		}
	}
}

// --- handlers ---

func (s *server) handleCodeCreate(w http.ResponseWriter, r *http.Request) {
	var req CodeContextRequest
	if !readJSON(w, r, "code context", &req) {
		return
	}
	c, err := s.code.create(r.Context(), req)
	if err != nil {
		writeError(w, asError("code context", "", err))
		return
	}
	writeJSON(w, s.code.info(c))
}

func (s *server) handleCodeList(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, s.code.list())
}

func (s *server) handleCodeDelete(w http.ResponseWriter, r *http.Request) {
	if err := s.code.remove(r.PathValue("id")); err != nil {
		writeError(w, asError("delete code context", "", err))
		return
	}
	writeJSON(w, struct{}{})
}

func (s *server) handleCodeRun(w http.ResponseWriter, r *http.Request) {
	var req CodeRunRequest
	if !readJSON(w, r, "run code", &req) {
		return
	}
	res, err := s.code.run(r.Context(), r.PathValue("id"), req)
	if err != nil {
		writeError(w, asError("run code", "", err))
		return
	}
	writeJSON(w, res)
}

// --- client ---

// CodeCreate starts a code context.
func (c *Client) CodeCreate(ctx context.Context, req CodeContextRequest) (CodeContext, error) {
	var out CodeContext
	err := c.call(ctx, http.MethodPost, "/v1/code", req, &out)
	return out, err
}

// CodeContexts lists the running code contexts, oldest first.
func (c *Client) CodeContexts(ctx context.Context) ([]CodeContext, error) {
	var out []CodeContext
	err := c.call(ctx, http.MethodGet, "/v1/code", nil, &out)
	return out, err
}

// CodeDelete ends a code context.
func (c *Client) CodeDelete(ctx context.Context, id string) error {
	return c.call(ctx, http.MethodDelete, "/v1/code/"+url.PathEscape(id), nil, nil)
}

// CodeRun runs a cell in a context. Cancelling ctx interrupts the cell
// (the context lives on).
func (c *Client) CodeRun(ctx context.Context, id string, req CodeRunRequest) (CodeResult, error) {
	var out CodeResult
	err := c.call(ctx, http.MethodPost, "/v1/code/"+url.PathEscape(id)+"/run", req, &out)
	return out, err
}
