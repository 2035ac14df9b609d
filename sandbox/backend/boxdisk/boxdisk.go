// Package boxdisk gives each box a disk of its own, so that a box filling
// its disk gets ENOSPC inside and the host's disk is untouched.
//
// A disk is a sparse file formatted ext4 and loop-mounted on the host
// (mount -o loop, which detaches the loop device on unmount). It holds
// workspace/ and tmp/, which the backends bind into the box at
// backend.Workspace and /tmp: both count against the one cap. The file takes
// host space only for what the box wrote (sparse; mounted with discard, so
// deleted files give their blocks back).
//
// This needs root (mount), mkfs.ext4 (e2fsprogs) and loop devices; without
// them Make fails with an error that says so. A per-box filesystem was
// chosen over project quotas (need a host filesystem mounted with prjquota)
// and over Docker's --storage-opt size (overlay2 on xfs only): it works on
// any host filesystem, on both backends, and also caps /tmp.
package boxdisk

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cellbox/cellbox/internal/crashpoint"
)

// Disk is one box's disk: the image File mounted at Dir.
type Disk struct {
	File string
	Dir  string
	// Templates is the directory of the templates Make copies ("": File's
	// directory).
	Templates string
}

// Workspace is the directory bound at backend.Workspace.
func (d Disk) Workspace() string { return filepath.Join(d.Dir, "workspace") }

// Tmp is the directory bound at /tmp.
func (d Disk) Tmp() string { return filepath.Join(d.Dir, "tmp") }

// Make creates the image of size bytes (an error wrapping fs.ErrExist if
// the file exists), formats it, mounts it and makes workspace/ (owned by
// uid:gid, the host ids the box user writes as) and tmp/ (mode 1777). On
// error nothing is left.
func (d Disk) Make(ctx context.Context, size int64, uid, gid int) (err error) {
	mkfs, lerr := exec.LookPath("mkfs.ext4")
	if lerr != nil {
		return fmt.Errorf("box disk: mkfs.ext4 not found (install e2fsprogs; every box gets a disk of its own, formatted ext4): %w", lerr)
	}
	if err := os.MkdirAll(filepath.Dir(d.File), 0o700); err != nil {
		return fmt.Errorf("box disk: %w", err)
	}
	f, err := os.OpenFile(d.File, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("box disk %s: %w", d.File, err)
	}
	tpl, tplErr := template(ctx, mkfs, cmp.Or(d.Templates, filepath.Dir(d.File)), size)
	defer func() {
		if err != nil {
			_ = d.Remove(context.WithoutCancel(ctx))
		}
	}()
	if tplErr == nil {
		err = copySparse(tpl, f, size)
	} else {
		err = f.Truncate(size) // sparse, formatted below
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("box disk %s: size %d: %w", d.File, size, err)
	}
	crashpoint.Hit("disk.file", d.File)
	if tplErr != nil {
		if err := format(ctx, mkfs, d.File); err != nil {
			return err
		}
	}
	crashpoint.Hit("disk.formatted", d.File)
	if err := d.Mount(ctx); err != nil {
		return err
	}
	crashpoint.Hit("disk.mounted", d.File)
	for _, dir := range []struct {
		path     string
		mode     fs.FileMode
		uid, gid int
	}{{d.Workspace(), 0o755, uid, gid}, {d.Tmp(), 0o777 | fs.ModeSticky, 0, 0}} {
		if err := os.Mkdir(dir.path, 0o700); err != nil {
			return fmt.Errorf("box disk: %w", err)
		}
		if err := os.Chown(dir.path, dir.uid, dir.gid); err != nil {
			return fmt.Errorf("box disk: %w", err)
		}
		if err := os.Chmod(dir.path, dir.mode); err != nil {
			return fmt.Errorf("box disk: %w", err)
		}
	}
	// lost+found is root's (mode 0700) and stays: fsck wants it.
	return nil
}

// format makes an ext4 filesystem in the image file: -m 0, no blocks
// reserved for root; lazy init and nodiscard: in milliseconds, without
// writing the whole file.
func format(ctx context.Context, mkfs, file string) error {
	if err := run(ctx, mkfs, "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", file); err != nil {
		return fmt.Errorf("box disk %s: format: %w", file, err)
	}
	return nil
}

// Templates. A disk is a copy of a template of its size: an image
// formatted once (by mkfs.ext4) and kept as .template-SIZE.img in
// Disk.Templates — by the backends, SharedTemplates, one directory for
// every data dir of the user —, copied block for block where it was
// written (a few hundred KiB for a GiB: copy_file_range, a millisecond)
// instead of running mkfs.ext4 for every box (a process: tens of
// milliseconds, on the path of every box made; `cellbox bench`
// pipeline's first run). The copies share the template's filesystem
// UUID, which nothing here looks at (disks are mounted by file). At most
// maxTemplates sizes are kept per directory: making another removes the
// one used longest ago (each use touches its template).
const maxTemplates = 8

const templatePrefix = ".template-"

var templateMu sync.Mutex // one template made at a time, per process

// SharedTemplates is the directory of the disk templates every data dir
// of this user shares: $XDG_CACHE_HOME/cellbox/disk-templates, else
// ~/.cache/cellbox/disk-templates ("" without a home). A template is the
// same for every disk of its size, so the first box of a new data dir
// copies one instead of formatting it (about 10 ms of a first run). It
// is a cache: removing it costs the next box one mkfs.ext4.
func SharedTemplates() string {
	d, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "cellbox", "disk-templates")
}

// template returns the template of size in dir, making it if need be.
func template(ctx context.Context, mkfs, dir string, size int64) (*os.File, error) {
	path := filepath.Join(dir, fmt.Sprintf("%s%d.img", templatePrefix, size))
	if f, err := useTemplate(path); err == nil {
		return f, nil
	}
	templateMu.Lock()
	defer templateMu.Unlock()
	if f, err := useTemplate(path); err == nil {
		return f, nil // made meanwhile
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("box disk: templates: %w", err)
	}
	evictTemplates(dir)
	// Made under another name and renamed into place, so that no process
	// copies a template half made (one a killed process left is removed
	// here, an hour on).
	if left, _ := filepath.Glob(filepath.Join(dir, templatePrefix+"new-*")); len(left) > 0 {
		for _, f := range left {
			if fi, err := os.Stat(f); err == nil && time.Since(fi.ModTime()) > time.Hour {
				os.Remove(f)
			}
		}
	}
	tmp, err := os.CreateTemp(dir, templatePrefix+"new-")
	if err != nil {
		return nil, fmt.Errorf("box disk: template: %w", err)
	}
	defer os.Remove(tmp.Name())
	err = tmp.Truncate(size)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = format(ctx, mkfs, tmp.Name())
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return nil, fmt.Errorf("box disk: template: %w", err)
	}
	return os.Open(path)
}

// useTemplate opens the template at path and marks it used now (its
// modification time, which evictTemplates goes by).
func useTemplate(path string) (*os.File, error) {
	f, err := os.Open(path)
	if err == nil {
		now := time.Now()
		_ = os.Chtimes(path, now, now)
	}
	return f, err
}

// evictTemplates removes the templates of dir used longest ago until
// there is room for one more. A process copying one keeps its open file.
func evictTemplates(dir string) {
	tpls, _ := filepath.Glob(filepath.Join(dir, templatePrefix+"[0-9]*.img"))
	if len(tpls) < maxTemplates {
		return
	}
	type tpl struct {
		path string
		used time.Time
	}
	var all []tpl
	for _, p := range tpls {
		if fi, err := os.Stat(p); err == nil {
			all = append(all, tpl{p, fi.ModTime()})
		}
	}
	slices.SortFunc(all, func(a, b tpl) int { return a.used.Compare(b.used) })
	for _, t := range all[:max(0, len(all)-maxTemplates+1)] {
		os.Remove(t.path)
	}
}

// copySparse copies the data of src (of size bytes) into the empty file
// dst, leaving holes where src has them, and closes src.
func copySparse(src, dst *os.File, size int64) error {
	defer src.Close()
	if err := dst.Truncate(size); err != nil {
		return err
	}
	sfd := int(src.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(sfd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // holes to the end
		}
		if err != nil {
			return fmt.Errorf("copy the template: %w", err)
		}
		hole, err := unix.Seek(sfd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("copy the template: %w", err)
		}
		if _, err := src.Seek(data, io.SeekStart); err != nil {
			return fmt.Errorf("copy the template: %w", err)
		}
		if _, err := dst.Seek(data, io.SeekStart); err != nil {
			return fmt.Errorf("copy the template: %w", err)
		}
		// os.File.ReadFrom copies with copy_file_range, and through this
		// process where the kernel does not copy across filesystems
		// (SharedTemplates in the home, the disk in the data dir).
		n, err := dst.ReadFrom(io.LimitReader(src, hole-data))
		if err == nil && n != hole-data {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return fmt.Errorf("copy the template: %w", err)
		}
		off = hole
	}
	return nil
}

// Mounted reports whether Dir is a mount point.
func (d Disk) Mounted() bool { return IsMountPoint(d.Dir) }

// IsMountPoint reports whether dir is a mount point: its device differs
// from its parent's.
func IsMountPoint(dir string) bool {
	var st, parent syscall.Stat_t
	if syscall.Lstat(dir, &st) != nil || syscall.Lstat(filepath.Dir(dir), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}

// Mount mounts the image at Dir unless it is mounted: after Make, and
// again on Start after a host reboot.
func (d Disk) Mount(ctx context.Context) error {
	if d.Mounted() {
		d.thaw() // a server killed while it copied the disk left it frozen
		return nil
	}
	if _, err := os.Stat(d.File); err != nil {
		return fmt.Errorf("box disk: %w", err)
	}
	if err := os.Mkdir(d.Dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("box disk: %w", err)
	}
	loopErr, err := mountLoop(d.File, d.Dir)
	if loopErr != nil { // the way that works wherever mount does
		err = run(ctx, "mount", "-t", "ext4", "-o", "loop,nodev,nosuid,discard", d.File, d.Dir)
	}
	if err != nil {
		return fmt.Errorf("box disk %s: mount at %s (needs root and loop devices): %w", d.File, d.Dir, err)
	}
	return nil
}

// Unmount unmounts the disk and keeps it: a stopped box holds no mount, so
// nothing is left mounted when a server stops its boxes and exits, and its
// data dir can be moved or deleted. Start mounts it again. The loop device
// clears itself (mountLoop).
//
// A cancelled ctx does not stop it: an unmount abandoned halfway leaves a
// mount nobody owns (a ctrl-C during teardown did). A disk still busy
// after 2 s is detached lazily, freed when its last user lets go.
func (d Disk) Unmount(ctx context.Context) error {
	for i := 0; d.Mounted(); i++ {
		switch {
		case i < 20:
			if unix.Unmount(d.Dir, 0) != nil {
				time.Sleep(100 * time.Millisecond)
			}
		case i == 20:
			if err := unix.Unmount(d.Dir, unix.MNT_DETACH); err != nil {
				return fmt.Errorf("box disk: unmount %s: %w", d.Dir, err)
			}
		default:
			return fmt.Errorf("box disk: %s still mounted", d.Dir)
		}
	}
	return nil
}

// Remove unmounts the disk and deletes it. A missing disk is not an error.
//
// What the disk holds is going: its filesystem is shut down first, without
// writing back its journal or its data (shutdown), so that the unmount
// writes nothing into the file about to be deleted. A clean unmount's
// flush reaches the file through the loop device as an fsync of the host
// file: it was most of a box's teardown (BenchmarkRemove).
func (d Disk) Remove(ctx context.Context) error {
	d.shutdown() // a no-op unless the disk is mounted
	if err := d.Unmount(ctx); err != nil {
		return err
	}
	// os.Remove, not RemoveAll: Dir is an empty mount point now, and a
	// mistake must not descend into a disk still mounted.
	if err := os.Remove(d.Dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("box disk: %w", err)
	}
	if err := os.Remove(d.File); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("box disk: %w", err)
	}
	return nil
}

func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if msg == "" {
			msg = "no output"
		}
		return fmt.Errorf("%s %s: %w (%s)", name, strings.Join(args, " "), err, msg)
	}
	return nil
}

// shutdown stops the mounted filesystem at once: every later read or
// write in it fails, nothing pending is written (ext4's and xfs's
// "going down" ioctl with NOLOGFLUSH; linux/fs.h, 4.10 on). Only for a
// disk being deleted. Where the kernel or the filesystem has no such call,
// nothing happens and the unmount flushes as ever.
//
// The call stops whichever filesystem the open file is on, so the file is
// checked, not its path: it must be on a loop device (the disk's) other
// than its parent directory's, or nothing is done — never the host's
// filesystem, even if the disk was unmounted under it meanwhile.
func (d Disk) shutdown() {
	f, err := os.Open(d.Dir)
	if err != nil {
		return
	}
	defer f.Close()
	var st, parent unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil || unix.Lstat(filepath.Dir(d.Dir), &parent) != nil {
		return
	}
	if st.Dev == parent.Dev || unix.Major(st.Dev) != loopMajor {
		return
	}
	_ = unix.IoctlSetPointerInt(int(f.Fd()), ioctlShutdown, shutdownNoLogFlush)
}

// loopMajor is the block major of loop devices (linux/major.h LOOP_MAJOR).
const loopMajor = 7

// Linux's FS_IOC_SHUTDOWN (EXT4_IOC_SHUTDOWN: _IOR('X', 125, __u32)) and
// its flag that skips the journal's flush (EXT4_GOING_FLAGS_NOLOGFLUSH).
const (
	ioctlShutdown      = 0x8004587D
	shutdownNoLogFlush = 0x2
)

// Linux's FIFREEZE and FITHAW ioctls (linux/fs.h: _IOWR('X', 119/120, int)).
const (
	ioctlFreeze = 0xC0045877
	ioctlThaw   = 0xC0045878
)

// freezeMu serializes the clones of the host: a filesystem frozen twice
// answers EBUSY, so concurrent clones of one box take turns (copies of
// several are bound by the same disk and memory anyway).
var freezeMu sync.Mutex

// CopyImages copies the image of disk src, which may be mounted and in
// use, to each of files (which must not exist), all at one instant: src's
// filesystem is frozen while the first copy is made (writes in it wait),
// the others are copies of that first one. Images are copied with cp
// --reflink=auto --sparse=always: copy-on-write where the host filesystem
// does reflinks (xfs, btrfs), the written blocks only otherwise. The
// copies are not mounted: a box's disk takes one with Adopt. On error no
// file is left.
func CopyImages(ctx context.Context, src Disk, files []string) (err error) {
	if len(files) == 0 {
		return nil
	}
	if _, err := os.Stat(src.File); err != nil {
		return fmt.Errorf("box disk: clone source: %w", err)
	}
	var made []string
	defer func() {
		if err != nil {
			for _, f := range made {
				os.Remove(f)
			}
		}
	}()
	for _, f := range files {
		fd, err := os.OpenFile(f, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return fmt.Errorf("box disk: %w", err)
		}
		fd.Close()
		made = append(made, f)
	}
	if err := src.copyFrozen(ctx, files[0]); err != nil {
		return err
	}
	errs := make([]error, len(files))
	var wg sync.WaitGroup
	for i, f := range files[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = run(ctx, "cp", "--reflink=auto", "--sparse=always", files[0], f)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("box disk: copy %s: %w", src.File, err)
	}
	return nil
}

// Adopt makes the image file (a copy CopyImages made) d's disk: it is
// moved to d.File (an existing d.File is an error wrapping fs.ErrExist),
// mounted, and its tmp/ emptied (a clone starts with an empty /tmp). On
// error d is removed.
func (d Disk) Adopt(ctx context.Context, file string) (err error) {
	if err := os.MkdirAll(filepath.Dir(d.File), 0o700); err != nil {
		return fmt.Errorf("box disk: %w", err)
	}
	// A hard link, not a rename: it fails when d.File exists.
	if err := os.Link(file, d.File); err != nil {
		return fmt.Errorf("box disk: %w", err)
	}
	os.Remove(file)
	defer func() {
		if err != nil {
			_ = d.Remove(context.WithoutCancel(ctx))
		}
	}()
	if err := d.Mount(ctx); err != nil {
		return err
	}
	ents, err := os.ReadDir(d.Tmp())
	if err != nil {
		return fmt.Errorf("box disk: %w", err)
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(d.Tmp(), e.Name())); err != nil {
			return fmt.Errorf("box disk: empty tmp of the clone: %w", err)
		}
	}
	return nil
}

// copyFrozen copies d's image to dst, d's filesystem frozen meanwhile if
// it is mounted.
func (d Disk) copyFrozen(ctx context.Context, dst string) error {
	freezeMu.Lock()
	defer freezeMu.Unlock()
	if d.Mounted() {
		dir, err := os.Open(d.Dir)
		if err != nil {
			return fmt.Errorf("box disk: %w", err)
		}
		defer dir.Close()
		if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, dir.Fd(), ioctlFreeze, 0); e != 0 {
			return fmt.Errorf("box disk: freeze %s for a consistent copy: %w", d.Dir, e)
		}
		// Thawed whatever happens, also when ctx ends: a frozen disk
		// hangs every writer of the box (and Mount thaws a disk a killed
		// server left frozen).
		defer syscall.Syscall(syscall.SYS_IOCTL, dir.Fd(), ioctlThaw, 0)
	}
	if err := run(ctx, "cp", "--reflink=auto", "--sparse=always", d.File, dst); err != nil {
		return fmt.Errorf("box disk: copy %s: %w", d.File, err)
	}
	return nil
}

// thaw thaws the mounted disk if it is frozen (EINVAL when it is not,
// ignored).
func (d Disk) thaw() {
	if dir, err := os.Open(d.Dir); err == nil {
		syscall.Syscall(syscall.SYS_IOCTL, dir.Fd(), ioctlThaw, 0)
		dir.Close()
	}
}

// Rechown gives the files under dir (dir included) owned by a host uid in
// ids to ids[uid] (as owner and group): a cloned disk's files to the host
// uids of their new box. Links are changed, never followed.
func Rechown(dir string, ids map[int]int) error {
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
		if to, ok := ids[int(st.Uid)]; ok {
			return os.Lchown(p, to, to)
		}
		return nil
	})
}
