package local

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// proc identifies a process across pid reuse: its pid and its start time
// (field 22 of /proc/PID/stat, clock ticks since boot).
type proc struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// procStart reads a live process's start time. A zombie or a missing
// process is an error.
func procStart(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// comm (field 2) may hold spaces and parentheses: fields resume after
	// the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 {
		return 0, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f))
	}
	if string(f[0]) == "Z" || string(f[0]) == "X" {
		return 0, fmt.Errorf("process %d has exited", pid)
	}
	return strconv.ParseUint(string(f[19]), 10, 64)
}

// currentProc identifies the live process pid.
func currentProc(pid int) (proc, error) {
	st, err := procStart(pid)
	if err != nil {
		return proc{}, err
	}
	return proc{PID: pid, Start: st}, nil
}

// alive reports whether p still runs (the same process, not a reused pid).
func (p proc) alive() bool {
	if p.PID <= 0 {
		return false
	}
	st, err := procStart(p.PID)
	return err == nil && st == p.Start
}

// signal sends sig to p if it is still the same process.
func (p proc) signal(sig syscall.Signal) {
	if p.alive() {
		_ = syscall.Kill(p.PID, sig)
	}
}

var errStillRunning = errors.New("still running")

// waitGone waits until p has exited or d has passed. It sleeps on a
// pidfd of p, which wakes the moment p exits (a box's teardown waited up
// to 5 ms per process polling /proc); where pidfds are missing (Linux
// before 5.3) it polls.
func (p proc) waitGone(d time.Duration) error {
	deadline := time.Now().Add(d)
	if fd, err := unix.PidfdOpen(p.PID, 0); err == nil {
		defer unix.Close(fd)
		// Opened by pid: it names p only if p is still the process
		// holding that pid (after the open, a pid cannot be reused).
		for p.alive() {
			left := time.Until(deadline)
			if left <= 0 {
				return errStillRunning
			}
			_, _ = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(left/time.Millisecond)+1)
		}
		return nil
	}
	for p.alive() {
		if time.Now().After(deadline) {
			return errStillRunning
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}
