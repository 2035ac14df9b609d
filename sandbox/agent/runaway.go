package agent

// Runaway processes. Every process of a box, the agent's threads included,
// counts against the box's one pids limit, so a fork bomb can take every
// slot and leave the agent unable to start the next command (EAGAIN) or,
// worse, the Go runtime unable to start a thread (a fatal error). The agent
// stays in control three ways, all only when it is PID 1 of its pid
// namespace (a box), never when it runs on a host:
//
//   - reserveThreads starts its OS threads before any command runs, so the
//     runtime rarely needs a new one later (idle threads are kept, not
//     ended);
//   - sweep ends, after every foreground command, the processes that no
//     running command and no background job owns: what a shell call left
//     behind (`cmd &`, a setsid'd bomb) dies with the call;
//   - a fork that fails for want of processes sweeps the leftovers, then
//     every process of the box but the agent, and tries again, saying so.

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// reservedThreads is how many OS threads the agent holds from its start:
// enough for the HTTP server, the reaper and a few blocking file
// operations at once.
const reservedThreads = 12

// reserveThreads makes the Go runtime start n OS threads now: n goroutines
// each lock a thread and wait until all are running, then unlock. The
// runtime keeps the threads idle for later use.
func reserveThreads(n int) {
	var ready, release sync.WaitGroup
	ready.Add(n)
	release.Add(1)
	for range n {
		go func() {
			runtime.LockOSThread()
			ready.Done()
			release.Wait()
			runtime.UnlockOSThread()
		}()
	}
	ready.Wait()
	release.Done()
}

// procStat is what sweep reads of /proc/PID/stat.
type procStat struct {
	ppid, pgrp, session int
	zombie              bool
}

func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	// pid (comm) state ppid pgrp session ...; comm may hold anything.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 4 {
		return procStat{}, false
	}
	var st procStat
	st.zombie = f[0] == "Z" || f[0] == "X"
	st.ppid, _ = strconv.Atoi(f[1])
	st.pgrp, _ = strconv.Atoi(f[2])
	st.session, _ = strconv.Atoi(f[3])
	return st, true
}

// listPIDs lists the processes (thread group leaders) of the pid namespace.
func listPIDs() []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	pids := make([]int, 0, len(names))
	for _, n := range names {
		if n[0] < '0' || n[0] > '9' {
			continue
		}
		if pid, err := strconv.Atoi(n); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// victimsLocked lists the live processes a sweep ends: with all, every
// process but the agent; otherwise the ones no running command and no
// background job owns. A process is owned when it is a running command, is
// in the process group or session of a running command or of a background
// job (one the table still lists, running or not: what a job started with
// `&` keeps its group), or descends from an owned process. Called with t.mu
// held, so that no command is between its fork and its registration.
func (t *procTable) victimsLocked(all bool) []int {
	self := os.Getpid()
	roots := map[int]bool{}
	groups := map[int]bool{}
	for _, p := range t.byID {
		select {
		case <-p.done:
			if p.background {
				groups[p.pid] = true
			}
		default:
			roots[p.pid] = true
			groups[p.pid] = true
		}
	}
	for _, g := range t.kept {
		groups[g] = true
	}
	stats := map[int]procStat{}
	for _, pid := range listPIDs() {
		if pid == self || (!all && roots[pid]) {
			continue
		}
		if st, ok := readStat(pid); ok && !st.zombie {
			stats[pid] = st
		}
	}
	if len(stats) == 0 {
		return nil
	}
	var owned func(pid int, depth int) bool
	owned = func(pid int, depth int) bool {
		if roots[pid] {
			return true
		}
		st, ok := stats[pid]
		if !ok || depth > 64 { // the agent, a zombie, gone, or a cycle of reused pids
			return false
		}
		return groups[st.pgrp] || groups[st.session] || owned(st.ppid, depth+1)
	}
	var out []int
	for pid := range stats {
		if t.peers[pid] > 0 {
			continue // a connection to the agent itself (see peers)
		}
		if all || !owned(pid, 0) {
			out = append(out, pid)
		}
	}
	return out
}

// sweep SIGKILLs the processes victimsLocked names until none is left
// (a process in the middle of a fork can still add a child after the
// signal) or 2 s have passed, and returns how many it ended. It does
// nothing unless the agent is PID 1 (reaper): on a host it would end the
// host's processes.
func (t *procTable) sweep(all bool) int {
	if !t.reaper {
		return 0
	}
	ended := map[int]bool{}
	deadline := time.Now().Add(2 * time.Second)
	for {
		t.mu.Lock()
		if all {
			// The agent's own commands die too, and must not be told
			// that something else (the OOM killer) sent the SIGKILL.
			for _, p := range t.byID {
				select {
				case <-p.done:
				default:
					p.killed.Store(true)
				}
			}
		}
		victims := t.victimsLocked(all)
		for _, pid := range victims {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				ended[pid] = true
			}
		}
		t.mu.Unlock()
		t.reap() // free the pids of the dead at once, for the next fork
		if len(victims) == 0 || time.Now().After(deadline) {
			return len(ended)
		}
		time.Sleep(time.Millisecond)
	}
}

// start starts a command (procTable.start). When the box is out of
// processes it ends the leftovers of earlier calls, then, if that is not
// enough, every process of the box but the agent, and tries again; the
// notices say so.
func (s *server) start(argv []string, dir string, env []string, files []*os.File, command string, background, keep bool) (*proc, []string, error) {
	p, err := s.procs.start(argv, dir, env, files, command, background, keep)
	if err == nil || !errors.Is(err, syscall.EAGAIN) {
		return p, nil, err
	}
	ended := 0
	for _, all := range []bool{false, true} {
		if !s.procs.reaper {
			break
		}
		ended += s.procs.sweep(all)
		for try := 0; try < 3 && errors.Is(err, syscall.EAGAIN); try++ {
			// A killed process frees its pid when reaped.
			time.Sleep(time.Duration(try) * 5 * time.Millisecond)
			s.procs.reap()
			p, err = s.procs.start(argv, dir, env, files, command, background, keep)
		}
		if err == nil {
			s.log.Warn("agent: box out of processes; ended runaway processes", "ended", ended, "all", all)
			return p, []string{s.outOfPIDsNotice(ended)}, nil
		}
		if !errors.Is(err, syscall.EAGAIN) {
			return nil, nil, err
		}
	}
	return nil, nil, &Error{Op: "exec", Code: CodeInvalid, Message: fmt.Sprintf("exec %s: the box is out of processes%s even after ending %d processes: %v; destroy and recreate the box", argv[0], s.pidsLimitNote(), ended, err)}
}

// killAll ends every process of the box but the agent (the process tool's
// kill_all); ended says how many. The code contexts, whose interpreters it
// ends too, say so.
func (s *server) killAll() (ended int) {
	s.code.endAll("its interpreter was killed by process kill_all, which ends every process of the box")
	if !s.procs.reaper {
		// Not PID 1: end only the agent's own commands' groups.
		for _, p := range s.procs.running() {
			p.kill()
			ended++
		}
		return ended
	}
	return s.procs.sweep(true)
}

// running lists the table's processes that have not exited.
func (t *procTable) running() []*proc {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*proc
	for _, p := range t.byID {
		select {
		case <-p.done:
		default:
			out = append(out, p)
		}
	}
	return out
}

// boxLimit reads a cgroup limit of the box (cgroup v1 or v2 file inside
// the box, as Docker mounts them; a backend may pass it instead, see
// Options) for messages; "" if unknown or unlimited.
func boxLimit(paths ...string) string {
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		v := strings.TrimSpace(string(b))
		if v == "max" || v == "" || len(v) > 15 { // v1 "unlimited" is a huge number
			return ""
		}
		return v
	}
	return ""
}

func (s *server) pidsLimit() string {
	if s.limits.Pids > 0 {
		return strconv.FormatInt(s.limits.Pids, 10)
	}
	return boxLimit("/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/pids.max")
}

// outOfPIDsNotice says what the agent did to start a command in a box that
// was out of processes.
func (s *server) outOfPIDsNotice(ended int) string {
	return fmt.Sprintf("the box was out of processes%s: ended %d processes left running (a fork bomb or runaway job) to run this command", s.pidsLimitNote(), ended)
}

// pidsLimitNote is " (pids limit N)" for the messages of a box out of
// processes, or "" when the limit is unknown.
func (s *server) pidsLimitNote() string {
	if lim := s.pidsLimit(); lim != "" {
		return " (pids limit " + lim + ")"
	}
	return ""
}

// leftoverNotice says that a foreground command's leftovers were ended.
func leftoverNotice(n int) string {
	what := "processes"
	if n == 1 {
		what = "process"
	}
	return fmt.Sprintf("ended %d %s the command left running; a shell call's processes end with it: run servers and long jobs with background: true", n, what)
}

// oomKills is the box's count of processes the kernel killed for want of
// memory (the memory cgroup's oom_kill counter as Docker shows it inside
// the box), or -1 when the box cannot see it (bubblewrap boxes).
func (s *server) oomKills() int64 {
	if !s.procs.reaper {
		return -1
	}
	for _, f := range []struct{ path, key string }{
		{"/sys/fs/cgroup/memory/memory.oom_control", "oom_kill "},
		{"/sys/fs/cgroup/memory.events", "oom_kill "},
	} {
		b, err := os.ReadFile(f.path)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, f.key); ok {
				if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
					return n
				}
			}
		}
	}
	return -1
}

// oomNotice tells that a command (or a process it ran) was killed for want
// of memory: for sure when the box's oom_kill counter grew since before
// (counted by oomKills), or, where the box cannot see the counter, as the
// likely cause of a SIGKILL the agent did not send.
func (s *server) oomNotice(p *proc, before int64) string {
	lim := ""
	if m := s.memoryLimit(); m > 0 {
		lim = fmt.Sprintf(" (memory limit %d MiB)", m>>20)
	}
	if before >= 0 {
		if n := s.oomKills() - before; n > 0 {
			return fmt.Sprintf("the box ran out of memory%s: the kernel killed %d process(es) of it; use less memory, or create the sandbox with a higher memory limit", lim, n)
		}
		return ""
	}
	if p.killed.Load() || (p.killedBy != syscall.SIGKILL && p.exitCode != 128+int(syscall.SIGKILL)) {
		return ""
	}
	return fmt.Sprintf("the command (or a process it ran) was killed by SIGKILL, which in a box is most often the kernel's out-of-memory killer%s; use less memory, or create the sandbox with a higher memory limit", lim)
}

func (s *server) memoryLimit() int64 {
	if s.limits.Memory > 0 {
		return s.limits.Memory
	}
	v, _ := strconv.ParseInt(boxLimit("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory.max"), 10, 64)
	return v
}

// maxPeers bounds the processes of the box that sweeps spare for being
// connected to the agent: a bomb connecting to the socket does not make
// itself immune.
const maxPeers = 64

// connState counts the connections of processes of the box to the agent
// (http.Server.ConnState): their pid comes from the socket's peer
// credentials; a peer outside the box's pid namespace (the host) has none.
func (t *procTable) connState(c net.Conn, state http.ConnState) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return
	}
	var add int
	switch state {
	case http.StateNew:
		add = 1
	case http.StateClosed, http.StateHijacked:
		add = -1
	default:
		return
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return
	}
	var cred *unix.Ucred
	rc.Control(func(fd uintptr) { cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if err != nil || cred == nil || cred.Pid <= 0 {
		return
	}
	pid := int(cred.Pid)
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case add > 0 && (t.peers[pid] > 0 || len(t.peers) < maxPeers):
		t.peers[pid]++
	case add < 0 && t.peers[pid] > 0:
		if t.peers[pid]--; t.peers[pid] == 0 {
			delete(t.peers, pid)
		}
	}
}
