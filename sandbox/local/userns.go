package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/backend/boxdisk"
	"github.com/cellbox/cellbox/sandbox/backend/boxuid"
)

// Box identity on the host.
//
// Each box gets two host uids of its own (a slot of boxuid.Local, the same
// numbers as gids): the box user (backend.BoxUID inside) is host uid
// hostUID, and root of the box's user namespace is hostUID-1. No box
// process ever runs as that namespace root (bwrap switches to the box user
// before anything of the box runs; it is mapped only because devpts needs
// a root); it is there so that an escape lands on an unprivileged uid that
// owns nothing but the box's own files, and is not shared with any other
// box. The reservation is the file Root/.uids/<slot>, recorded in
// spec.json.

// uids is the backend's block of host uids.
func (b *Backend) uids() boxuid.Range {
	r := boxuid.Local
	r.Dir = filepath.Join(b.root, ".uids")
	return r
}

func (b *Backend) allocUID(id string) (int, error) { return b.uids().Alloc(id) }

func (b *Backend) freeUID(id string, uid int) { b.uids().Free(id, uid) }

// sweepUIDs frees the reservations of boxes without a directory (a
// process killed in Create or Remove). Create makes the directory before
// it reserves, and none is in flight (sweepHalfMade).
func (b *Backend) sweepUIDs() {
	b.uids().Sweep(0, func(id string) bool {
		if !validID(id) {
			return false
		}
		_, err := os.Lstat(b.dir(id))
		return errors.Is(err, fs.ErrNotExist)
	})
}

// chownOwnedBy gives the files under dir (dir included) owned by uid 0
// to uid:uid, without following symlinks: the workspace of a box made
// before boxes had host uids of their own was written as host root.
func chownOwnedBy(dir string, uid int) error {
	return boxdisk.Rechown(dir, map[int]int{0: uid})
}

// rechown gives what the host uids from and from-1 (a box's user and its
// root) own under dir to to and to-1: a cloned disk's files to their new
// box.
func rechown(dir string, from, to int) error {
	return boxdisk.Rechown(dir, map[int]int{from: to, from - 1: to - 1})
}

// newUserns makes the user namespace a box runs in, and returns it open
// (the fd keeps it alive; bwrap joins it with --userns). It maps
// backend.BoxUID/BoxGID to uid (and gid) and 0 to uid-1, nothing else, and
// lets no further user namespace be made in it (max_user_namespaces 0,
// written by its root: bwrap's --disable-userns needs --unshare-user,
// which would map the box user to bwrap's own uid, host root).
//
// A short-lived helper makes it: a process cloned into it as its root,
// which sets the sysctl and waits for its stdin to close.
func newUserns(ctx context.Context, uid int) (*os.File, error) {
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", "echo 0 > /proc/sys/user/max_user_namespaces || exit 1; read x; exit 0")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		Credential:  &syscall.Credential{Uid: 0, Gid: 0, Groups: []uint32{}},
		UidMappings: idMap(backend.BoxUID, uid),
		GidMappings: idMap(backend.BoxGID, uid),
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("user namespace: %w", err)
	}
	ns, err := os.Open("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/user")
	stdin.Close()
	if werr := cmd.Wait(); err == nil && werr != nil {
		err = fmt.Errorf("%w (%s)", werr, strings.TrimSpace(stderr.String()))
	}
	if err != nil {
		if ns != nil {
			ns.Close()
		}
		return nil, fmt.Errorf("user namespace: %w", err)
	}
	return ns, nil
}

// idMap maps root to hostID-1 and id to hostID.
func idMap(id, hostID int) []syscall.SysProcIDMap {
	return []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostID - 1, Size: 1}, {ContainerID: id, HostID: hostID, Size: 1}}
}

// stageDir is the host directory over which each box's launcher mounts,
// in a mount namespace of its own, a tmpfs holding the box's bind
// sources. bwrap makes the box's mounts as the box user (the host uid
// joined with --userns), which cannot reach the sources where they are
// (Root, under the server's 0700 data directory, and the host dir); it
// can reach them here: / and /run are searchable by all, the tmpfs is
// mode 0711 and visible only to that box's launcher and bwrap.
const stageDir = "/run/cellbox-stage"

// stageBind is one bind source staged at stageDir/name.
type stageBind struct {
	name, src string
	file      bool // a file, not a directory
}

func staged(name string) string { return filepath.Join(stageDir, name) }

// startStaged starts cmd in a new mount namespace (a slave of the
// host's: host mounts reach it, none of its mounts reach the host) in
// which binds are mounted under stageDir.
//
// The mounts are made by a locked OS thread that unshares its mount
// namespace and forks cmd (a child inherits its thread's namespaces).
// That thread is never unlocked, so the Go runtime ends it when the
// goroutine returns instead of running other goroutines in that
// namespace.
//
// Except the main thread: Go cannot end it, and parks it for good instead,
// in that namespace, where it would keep the box's disk binds (and so its
// filesystem) mounted after the host unmounted the disk; a second mount of
// the image when the box wakes would then corrupt it. A goroutine that
// finds itself on the main thread keeps it (so that no other goroutine
// runs there) while another thread does the work.
func startStaged(cmd *exec.Cmd, binds []stageBind) error {
	errc := make(chan error, 1)
	go stage(cmd, binds, errc)
	return <-errc
}

// stage is startStaged's goroutine.
func stage(cmd *exec.Cmd, binds []stageBind, errc chan<- error) {
	runtime.LockOSThread()
	if syscall.Gettid() == syscall.Getpid() { // the main thread
		inner := make(chan error, 1)
		go stage(cmd, binds, inner)
		err := <-inner
		runtime.UnlockOSThread() // nothing changed on this thread
		errc <- err
		return
	}
	errc <- func() error {
		if err := syscall.Unshare(syscall.CLONE_NEWNS); err != nil {
			return fmt.Errorf("unshare mount namespace: %w", err)
		}
		if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_SLAVE, ""); err != nil {
			return fmt.Errorf("make / a slave mount: %w", err)
		}
		if err := syscall.Mount("cellbox-stage", stageDir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "mode=0711,size=64k"); err != nil {
			return fmt.Errorf("mount tmpfs at %s: %w", stageDir, err)
		}
		for _, bd := range binds {
			dst := staged(bd.name)
			var err error
			if bd.file {
				err = os.WriteFile(dst, nil, 0o600)
			} else {
				err = os.Mkdir(dst, 0o700)
			}
			if err == nil {
				err = syscall.Mount(bd.src, dst, "", syscall.MS_BIND|syscall.MS_REC, "")
			}
			if err != nil {
				return fmt.Errorf("stage %s at %s: %w", bd.src, dst, err)
			}
		}
		return cmd.Start()
	}()
}
