package image

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// stopGrace is how long a build step has, once its context ends, to stop
// on SIGTERM before its whole process group is killed: debootstrap's trap
// unmounts what it mounted in the target (/proc, /sys, binds of the host's
// /dev) and exits, which takes it a few milliseconds.
const stopGrace = 1500 * time.Millisecond

// groupCommand is exec.CommandContext for a build step that stops as a
// whole. debootstrap is a shell script that forks subshells, wget, gpgv,
// chroot dpkg; killing it alone (what CommandContext does) left them
// running, and Wait waited for every one still holding its output pipe: a
// stop took from 10 s to forever (forks that read from the killed script
// waited for it), and a debootstrap killed before its exit trap left /proc
// mounted in the rootfs. So the step runs in a process group of its own,
// and when ctx ends the group gets SIGTERM (debootstrap's trap unmounts);
// WaitDelay bounds the wait, and runGroup kills what is left of the group.
func groupCommand(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &unix.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		err := unix.Kill(-cmd.Process.Pid, unix.SIGTERM)
		if errors.Is(err, unix.ESRCH) {
			return os.ErrProcessDone
		}
		return err
	}
	cmd.WaitDelay = stopGrace
	return cmd
}

// runGroup runs a groupCommand and, once it ended (done, failed or
// stopped), kills every process left in its group and waits until none
// runs: a build step leaves nothing behind that writes into the rootfs
// being removed or outlives the build.
func runGroup(cmd *exec.Cmd) error {
	if err := cmd.Start(); err != nil {
		return err
	}
	err := cmd.Wait()
	killGroup(cmd.Process.Pid)
	if errors.Is(err, exec.ErrWaitDelay) && cmd.ProcessState.Success() {
		// It succeeded; only output a process it left behind held back
		// (killed now) is lost.
		return nil
	}
	return err
}

// killGroup sends SIGKILL to process group pgid and waits (at most 5 s,
// for a process in uninterruptible sleep) until none of its processes
// runs. Zombies do not count: they run nothing, and whether they are
// reaped is up to their new parent.
func killGroup(pgid int) {
	if unix.Kill(-pgid, unix.SIGKILL) != nil {
		return // no process is left in the group
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && groupRuns(pgid); {
		time.Sleep(10 * time.Millisecond)
	}
}

// groupRuns reports whether a process of group pgid runs (is not a zombie).
func groupRuns(pgid int) bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces and parens.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) >= 3 && f[0] != "Z" && f[0] != "X" && f[2] == strconv.Itoa(pgid) {
			return true
		}
	}
	return false
}

// interruptedError is a build cut short by its context (Ctrl-C, SIGTERM).
// It unwraps to the context's error.
type interruptedError struct {
	msg string
	ctx error
}

func (e *interruptedError) Error() string { return e.msg }
func (e *interruptedError) Unwrap() error { return e.ctx }

// removeBuilding removes a rootfs under construction. A debootstrap killed
// before its exit trap ran (SIGKILL, or a machine that stopped) leaves
// /proc, /sys and binds of the host's /dev/pts, /dev/shm, /dev/null...
// mounted in it, and os.RemoveAll crosses mount points: it would empty the
// host's /dev/shm. So everything mounted below it is unmounted first, and
// nothing is removed while a mount is left.
func removeBuilding(dir string) error {
	if err := unmountUnder(dir); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// removeBudget is how long a stopped build spends removing its partial
// rootfs: some hundred megabytes of small files take seconds on a busy
// machine, and a stop is to be prompt.
const removeBudget = time.Second

// discard takes a stopped build's partial rootfs (rootfs.building) out of
// the way, renamed rootfs.removing-ID so that a build started next does not
// build where it is being removed, and removes it for at most
// removeBudget. It returns what is left ("": nothing), which the next
// Build removes (sweep).
func discard(rootfs string) (left string, err error) {
	tmp := rootfs + ".building"
	if err := unmountUnder(tmp); err != nil {
		return tmp, err
	}
	trash := rootfs + ".removing-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := os.Rename(tmp, trash); errors.Is(err, os.ErrNotExist) {
		return "", nil
	} else if err != nil {
		return tmp, err
	}
	done := make(chan error, 1)
	go func() { done <- os.RemoveAll(trash) }()
	select {
	case err := <-done:
		if err != nil {
			return trash, err
		}
		return "", nil
	case <-time.After(removeBudget):
		return trash, nil
	}
}

// sweep removes what stopped builds left of their partial rootfs.
func sweep(rootfs string) error {
	left, err := filepath.Glob(rootfs + ".removing-*")
	if err != nil {
		return err
	}
	for _, dir := range left {
		if err := removeBuilding(dir); err != nil {
			return err
		}
	}
	return nil
}

// unmountUnder detaches every mount at or below dir, deepest first.
func unmountUnder(dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	} else if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	for range 8 { // mounts stacked on one point go one per round
		points, err := mountsUnder(dir)
		if err != nil || len(points) == 0 {
			return err
		}
		sort.Sort(sort.Reverse(sort.StringSlice(points)))
		for _, p := range points {
			if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("unmount %s: %w", p, err)
			}
		}
	}
	return fmt.Errorf("mounts are left under %s", dir)
}

// mountsUnder lists the mount points at or below dir in this process's
// mount table.
func mountsUnder(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read the mount table: %w", err)
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		p := unescapeMount(f[4])
		if p == dir || strings.HasPrefix(p, dir+"/") {
			points = append(points, p)
		}
	}
	return points, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space, \011,
// \012, \134).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
