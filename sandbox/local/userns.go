package local

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/cellbox/cellbox/sandbox/backend"
)

// Box identity on the host.
//
// Each box gets two host uids of its own (the same numbers as gids): the
// box user (backend.BoxUID inside) is host uid hostUID, and root of the
// box's user namespace is hostUID-1. No box process ever runs as that
// namespace root (bwrap switches to the box user before anything of the
// box runs; it is mapped only because devpts needs a root); it is there
// so that an escape lands on an unprivileged uid that owns nothing but
// the box's own files, and is not shared with any other box.
//
// The uids come from a range no real account uses: above the ranges
// useradd (1000–60000), subuid files (from 100000 up) and systemd-nspawn
// (524288–1879048191) hand out, below 2^31 (tools that read uids as
// signed ints) and systemd's foreign range (from 2147352576). A box's pair
// is reserved by the file Root/.uids/<slot> (created O_EXCL, so two
// backends over one Root never share a pair) and recorded in spec.json.
// Boxes under two different Roots may get the same pair, though hardly
// ever: the search starts at a hash of the box id.
const (
	uidBase  = 1_900_000_000
	uidSlots = 1 << 20 // pairs: host uids uidBase .. uidBase+2*uidSlots-1
	// uidProbes bounds the search for a free slot from the box's hash.
	uidProbes = 4096
)

// uidsDir holds one file per reserved slot, naming its box.
func (b *Backend) uidsDir() string { return filepath.Join(b.root, ".uids") }

func slotUID(slot int) int { return uidBase + 2*slot + 1 }

func uidSlot(uid int) (int, bool) {
	s := (uid - uidBase - 1) / 2
	return s, uid > uidBase && (uid-uidBase-1)%2 == 0 && s < uidSlots
}

// allocUID reserves a pair of host uids for box id and returns the box
// user's. Probing starts at a hash of the id so that the usual reservation
// takes one file create.
func (b *Backend) allocUID(id string) (int, error) {
	if err := os.MkdirAll(b.uidsDir(), 0o700); err != nil {
		return 0, fmt.Errorf("reserve host uid: %w", err)
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	start := int(h.Sum32() % uidSlots)
	for i := 0; i < uidProbes; i++ {
		slot := (start + i) % uidSlots
		f, err := os.OpenFile(filepath.Join(b.uidsDir(), strconv.Itoa(slot)), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			continue
		} else if err != nil {
			return 0, fmt.Errorf("reserve host uid: %w", err)
		}
		_, err = f.WriteString(id)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_ = os.Remove(f.Name())
			return 0, fmt.Errorf("reserve host uid: %w", err)
		}
		return slotUID(slot), nil
	}
	return 0, fmt.Errorf("reserve host uid: no free uid among %d tried in %s (too many boxes?)", uidProbes, b.uidsDir())
}

// freeUID releases box id's reservation of uid, if it holds it.
func (b *Backend) freeUID(id string, uid int) {
	slot, ok := uidSlot(uid)
	if !ok {
		return
	}
	p := filepath.Join(b.uidsDir(), strconv.Itoa(slot))
	if owner, err := os.ReadFile(p); err == nil && string(owner) == id {
		_ = os.Remove(p)
	}
}

// sweepUIDs frees the reservations of boxes without a directory (a
// process killed in Create or Remove). Create makes the directory before
// it reserves, so no Create in flight loses its reservation.
func (b *Backend) sweepUIDs() {
	ents, err := os.ReadDir(b.uidsDir())
	if err != nil {
		return
	}
	for _, e := range ents {
		p := filepath.Join(b.uidsDir(), e.Name())
		id, err := os.ReadFile(p)
		if err != nil || !validID(string(id)) {
			continue
		}
		if _, err := os.Lstat(b.dir(string(id))); errors.Is(err, fs.ErrNotExist) {
			_ = os.Remove(p)
		}
	}
}

// chownOwnedBy gives the files under dir (dir included) owned by uid 0
// to uid:uid, without following symlinks: the workspace of a box made
// before boxes had host uids of their own was written as host root.
func chownOwnedBy(dir string, uid int) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid == 0 {
			return os.Lchown(p, uid, uid)
		}
		return nil
	})
}

// rechown gives what the host uids from and from-1 (a box's user and its
// root) own under dir to to and to-1: a cloned disk's files to their new
// box.
func rechown(dir string, from, to int) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		switch int(st.Uid) {
		case from:
			return os.Lchown(p, to, to)
		case from - 1:
			return os.Lchown(p, to-1, to-1)
		}
		return nil
	})
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
func startStaged(cmd *exec.Cmd, binds []stageBind) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
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
	}()
	return <-errc
}

// uidRangeClashes names the entries of the host's account files whose ids
// fall in the box uid range: accounts and groups (/etc/passwd,
// /etc/group: name:x:id:...) and subordinate id ranges (/etc/subuid,
// /etc/subgid: name:start:count). A box escaping as such an id would be
// that account.
func uidRangeClashes(etc string) []string {
	lo, hi := uint64(uidBase), uint64(uidBase+2*uidSlots) // [lo, hi)
	var out []string
	for _, f := range []struct {
		name  string
		field int  // the id's field
		count bool // the next field is a count (subordinate ranges)
	}{{"passwd", 2, false}, {"group", 2, false}, {"subuid", 1, true}, {"subgid", 1, true}} {
		data, err := os.ReadFile(filepath.Join(etc, f.name))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			fields := strings.Split(line, ":")
			if len(fields) <= f.field+1 {
				continue
			}
			start, err := strconv.ParseUint(fields[f.field], 10, 32)
			if err != nil {
				continue
			}
			n := uint64(1)
			if f.count {
				if n, err = strconv.ParseUint(fields[f.field+1], 10, 32); err != nil {
					continue
				}
			}
			if start < hi && start+n > lo {
				out = append(out, filepath.Join(etc, f.name)+": "+fields[0])
			}
		}
	}
	return out
}
