package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// maxFinished is how many finished background processes the table keeps.
const maxFinished = 64

// proc is one process the agent started (the leader of its process group).
type proc struct {
	id         string
	command    string
	pid        int
	started    time.Time
	background bool
	keep       bool     // KeepLeftovers: what it leaves running is owned by its group
	log        *ring    // combined output; background processes only
	out        *outPipe // the pipe that fills log

	done     chan struct{}  // closed when the process has exited
	ended    time.Time      // valid after done
	exitCode int            // valid after done; -1 if killed by a signal
	killedBy syscall.Signal // valid after done: the signal that ended it, if one did
	killed   atomic.Bool    // the agent killed it (timeout, cancel, kill)
}

func (p *proc) info() Process {
	out := Process{ID: p.id, Command: p.command, PID: p.pid, Started: p.started, Running: true}
	select {
	case <-p.done:
		code, ended := p.exitCode, p.ended
		out.Running, out.ExitCode, out.Ended = false, &code, &ended
	default:
	}
	return out
}

// signal sends sig to the process's whole group.
func (p *proc) signal(sig syscall.Signal) error {
	return syscall.Kill(-p.pid, sig)
}

// kill SIGKILLs the process's whole group until no member is left. One
// kill(2) is not enough for a fork bomb: a member in the middle of fork can
// still add a child after the signal went out. Bounded, so a group that
// cannot die (uninterruptible sleep) does not hold the caller forever.
func (p *proc) kill() {
	p.killed.Store(true)
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(-p.pid, syscall.SIGKILL); errors.Is(err, syscall.ESRCH) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// procTable owns every child the agent starts. As PID 1 it reaps all
// children itself (wait4(-1)) and hands exit statuses to the table; otherwise
// it waits for each child by pid, so that it never steals another part of
// the process's exit statuses.
type procTable struct {
	log    *slog.Logger
	reaper bool

	mu       sync.Mutex
	next     int
	byID     map[string]*proc
	byPID    map[int]*proc
	finished []string // ids of finished background processes, oldest first
	kept     []int    // process groups of finished execs whose leftovers are kept (KeepLeftovers), newest last
	// peers counts the open connections of processes of the box connected
	// to the agent's socket, by pid: `cellbox agent --connect`, the pipe a
	// remote engine's exec stream reaches the agent through, is such a
	// process; sweeps spare them (that pid only, not its children).
	peers map[int]int
}

// maxKept bounds procTable.kept.
const maxKept = 64

func newProcTable(log *slog.Logger, reaper bool) *procTable {
	t := &procTable{log: log, reaper: reaper, byID: map[string]*proc{}, byPID: map[int]*proc{}, peers: map[int]int{}}
	if reaper {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGCHLD)
		go func() {
			for range ch {
				t.reap()
			}
		}()
		t.reap()
	}
	return t
}

// reap collects every exited child (PID 1 only): the ones the table started
// and orphans re-parented to init.
func (t *procTable) reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
		// start holds mu from fork until the pid is registered, so a child
		// that exits at once is found here.
		t.mu.Lock()
		p := t.byPID[pid]
		delete(t.byPID, pid)
		t.mu.Unlock()
		if p != nil {
			t.exited(p, ws)
		}
	}
}

func (t *procTable) exited(p *proc, ws syscall.WaitStatus) {
	p.ended = time.Now()
	p.exitCode = -1
	if ws.Exited() {
		p.exitCode = ws.ExitStatus()
	} else if ws.Signaled() {
		p.killedBy = ws.Signal()
	}
	// The table is updated before done is closed, so a caller whose Wait
	// returned sees the table as it stands after this exit.
	defer close(p.done)
	t.mu.Lock()
	defer t.mu.Unlock()
	if !p.background {
		delete(t.byID, p.id)
		if p.keep {
			t.kept = append(t.kept, p.pid)
			if len(t.kept) > maxKept {
				t.kept = t.kept[1:]
			}
		}
		return
	}
	t.finished = append(t.finished, p.id)
	for len(t.finished) > maxFinished {
		delete(t.byID, t.finished[0])
		t.finished = t.finished[1:]
	}
}

// start starts one process in a new process group with the given stdio.
func (t *procTable) start(argv []string, dir string, env []string, files []*os.File, command string, background, keep bool) (*proc, error) {
	path := argv[0]
	if !strings.Contains(path, "/") {
		lp, err := exec.LookPath(path)
		if err != nil {
			return nil, &Error{Op: "exec", Code: CodeNotFound, Message: fmt.Sprintf("exec %s: executable file not found in $PATH", path)}
		}
		path = lp
	} else if !filepath.IsAbs(path) {
		path = filepath.Join(dir, path)
	}
	attr := &os.ProcAttr{Dir: dir, Env: env, Files: files, Sys: &syscall.SysProcAttr{Setpgid: true}}
	t.mu.Lock()
	inherited := raiseOwnOOMScore()
	op, err := os.StartProcess(path, argv, attr)
	restoreOwnOOMScore()
	if err != nil {
		t.mu.Unlock()
		if errors.Is(err, syscall.EAGAIN) {
			return nil, err // the caller may end runaway processes and retry
		}
		return nil, asError("exec", argv[0], err)
	}
	if !inherited {
		raiseOOMScore(op.Pid)
	}
	t.next++
	p := &proc{
		id: "p" + strconv.Itoa(t.next), command: command, pid: op.Pid, started: time.Now(),
		background: background, keep: keep, done: make(chan struct{}),
	}
	t.byID[p.id] = p
	if t.reaper {
		t.byPID[p.pid] = p
	}
	t.mu.Unlock()
	op.Release() // the table waits for it, by pid
	if !t.reaper {
		go func() {
			var ws syscall.WaitStatus
			for {
				_, err := syscall.Wait4(p.pid, &ws, 0, nil)
				if !errors.Is(err, syscall.EINTR) {
					break
				}
			}
			t.exited(p, ws)
		}()
	}
	return p, nil
}

// CommandOOMScoreAdj is the oom_score_adj of every command the agent
// starts: the most, so that when a box runs out of memory the kernel kills
// one of its commands (the biggest first), however small, and never the
// agent while a command is left (the kernel's score is the process's size
// plus adj/1000 of the memory limit; the agent keeps what it inherited,
// 0 by default). Raising needs no privilege; lowering the agent instead
// would (CAP_SYS_RESOURCE, which neither the server nor dockerd may have).
// On a host-wide OOM, box commands go first too.
const CommandOOMScoreAdj = 1000

// agentOOMScore is the agent's own oom_score_adj, read at the first start.
var agentOOMScore = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
})

// raiseOwnOOMScore sets the agent's own oom_score_adj to
// CommandOOMScoreAdj for the instant of a fork, so the command inherits it
// from its first instruction on (raised after the start, a command could
// fork or be read before the raise). start holds procTable.mu, so no other
// command starts meanwhile; restoreOwnOOMScore lowers it back, which needs
// no privilege: an unprivileged process may go back down to the lowest
// value a privileged writer gave it (oom_score_adj_min). It reports
// whether the raise took.
func raiseOwnOOMScore() bool {
	if agentOOMScore() == "" {
		return false
	}
	return os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(CommandOOMScoreAdj)), 0) == nil
}

func restoreOwnOOMScore() {
	if v := agentOOMScore(); v != "" {
		_ = os.WriteFile("/proc/self/oom_score_adj", []byte(v), 0)
	}
}

// raiseOOMScore gives a started command CommandOOMScoreAdj when the agent
// could not hand it down at the fork (best effort: a child the command
// forks before this keeps the agent's value).
func raiseOOMScore(pid int) {
	_ = os.WriteFile("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", []byte(strconv.Itoa(CommandOOMScoreAdj)), 0)
}

func (t *procTable) get(id string) (*proc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.byID[id]; p != nil {
		return p, nil
	}
	return nil, &Error{Op: "process", Path: id, Code: CodeNotFound, Message: fmt.Sprintf("process %s: no such process (list processes to see the ids)", id)}
}

func (t *procTable) list() []Process {
	t.mu.Lock()
	ps := make([]*proc, 0, len(t.byID))
	for _, p := range t.byID {
		ps = append(ps, p)
	}
	t.mu.Unlock()
	sort.Slice(ps, func(i, j int) bool { return ps[i].started.Before(ps[j].started) })
	out := make([]Process, len(ps))
	for i, p := range ps {
		out[i] = p.info()
	}
	return out
}

// shutdown sends SIGTERM to every running process group, waits up to grace,
// then SIGKILLs the ones left.
func (t *procTable) shutdown(grace time.Duration) {
	running := t.running()
	for _, p := range running {
		p.signal(syscall.SIGTERM)
	}
	deadline := time.After(grace)
	for _, p := range running {
		select {
		case <-p.done:
		case <-deadline:
		}
	}
	for _, p := range running {
		p.signal(syscall.SIGKILL)
	}
}
