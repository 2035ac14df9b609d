// Package local is the Backend that runs boxes under bubblewrap (bwrap), with
// no daemon.
//
// A box is a directory Root/<id> holding spec.json (the Spec and creation
// time), its disk (disk.img mounted at disk/, see boxdisk: disk/workspace
// bound at backend.Workspace, disk/tmp at /tmp), state.json (the running
// bwrap process) and box.log (the agent's stdout and stderr). Start launches
// bwrap detached (own session, no --die-with-parent), so a box outlives the
// server that started it; a new server finds it with List and Inspect, which
// tell a live box from a dead one by pid and process start time.
//
// Confinement of every box: every namespace unshared (user, pid, mount, ipc,
// uts, cgroup, and net unless Spec.Network), the agent as PID 1 of the new
// pid namespace (--as-pid-1), uid/gid backend.BoxUID/BoxGID inside a user
// namespace that maps them to an unprivileged host uid and gid of the box's
// own (Root/<id>/spec.json "uid"; see userns.go: the backend makes that
// namespace and bwrap joins it), every capability dropped, no
// supplementary groups, no further user namespaces, a read-only root: the
// host's /usr plus a generated /etc (backend.DefaultImage) or an image
// rootfs made by `cellbox image build` (cellbox/NAME), and /workspace, /tmp
// (both on the box's own disk, capped at Limits.DiskBytes) and /run/cellbox
// the only writable paths. Host files are the box user's only as "other"
// permissions allow: a host root file mode 0600 stays unreadable even
// where it is bound in.
//
// Limits: cgroup memory (swap included when accounted), pids and cpu (CFS
// quota) in cgroups cellbox/<id> (v1: /sys/fs/cgroup/<ctrl>/cellbox/<id>;
// v2: /sys/fs/cgroup/cellbox/<id>, untested so far) when this process may
// create them; bwrap starts inside them. Otherwise memory falls back to a per-process RLIMIT_DATA of
// at least 128 MiB (RLIMIT_AS would break V8 and other runtimes that reserve
// large address ranges; the agent's Go runtime needs ~80 MiB), and pids
// and CPU are not enforced: RLIMIT_NPROC counts every process of the host
// uid, not the box's. Enforcement reports what holds on this host.
//
// Seccomp: the filter of package seccomp (the same calls refused as in
// Docker boxes), loaded by bwrap (--seccomp) before it runs the agent.
package local

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cellbox/cellbox/internal/crashpoint"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/backend/boxdisk"
	"github.com/cellbox/cellbox/sandbox/backend/seccomp"
	"github.com/cellbox/cellbox/sandbox/image"
)

// Options configure New.
type Options struct {
	// Root holds one directory per box. Required. New removes what a
	// Create cut short by its process's death left in it, however fresh
	// (a Create in flight in a live process is left alone).
	Root string
	// ImagesDir holds the images built by `cellbox image build`:
	// cellbox/NAME is ImagesDir/NAME/rootfs. Empty: only DefaultImage.
	ImagesDir string
	// Bwrap is the bubblewrap binary; default "bwrap" from PATH.
	Bwrap string
	// CgroupRoot is where cgroups are mounted; default /sys/fs/cgroup.
	// "-" disables cgroups (rlimits only).
	CgroupRoot string
	Logger     *slog.Logger
}

// etcBinds are the host directories a DefaultImage box sees read-only in
// its generated /etc, besides the host's /usr.
var etcBinds = []string{"/etc/alternatives", "/etc/ssl/certs"}

// minDataLimit is the least RLIMIT_DATA of the fallback: the agent's Go
// runtime maps 64 MiB heap arenas and does not start under about 80 MiB.
const minDataLimit = 128 << 20

// stopGrace is how long Stop waits for the agent to exit on SIGTERM.
const stopGrace = 2 * time.Second

// Backend runs boxes under bubblewrap. Safe for concurrent use; boxes of
// the same Root must not be managed by two Backends in two processes at
// once.
type Backend struct {
	root, images, bwrap, etc string
	cg                       *cgroups
	enf                      backend.Enforcement
	log                      *slog.Logger
	dialer                   *backend.SocketDialer

	mu    sync.Mutex
	locks map[string]*boxLock // per box: Create, Start, Stop, Remove

	digestsMu sync.Mutex
	digests   map[string]localDigest // image name → its build, as last read (imagedigest.go)
}

// boxLock serializes the operations on one box. It stays in Backend.locks
// only while some operation holds or waits for it (refs > 0), so the map
// does not grow with every box ever made.
type boxLock struct {
	sync.Mutex
	refs int
}

var (
	_ backend.Backend       = (*Backend)(nil)
	_ backend.ImageDigester = (*Backend)(nil)
)

// New prepares Root (and the shared /etc of DefaultImage boxes in
// Root/.etc), finds bwrap and the cgroups it may use.
func New(opts Options) (*Backend, error) {
	if opts.Root == "" || !filepath.IsAbs(opts.Root) {
		return nil, fmt.Errorf("local backend: root %q: want an absolute directory", opts.Root)
	}
	bw := opts.Bwrap
	if bw == "" {
		bw = "bwrap"
	}
	bwPath, err := exec.LookPath(bw)
	if err != nil {
		return nil, fmt.Errorf("local backend: bubblewrap: %w (install the bubblewrap package)", err)
	}
	b := &Backend{root: opts.Root, images: opts.ImagesDir, bwrap: bwPath, etc: filepath.Join(opts.Root, ".etc"),
		log: opts.Logger, locks: map[string]*boxLock{}}
	b.dialer = backend.NewSocketDialer(func(ctx context.Context, id string) (string, error) {
		bf, _, err := b.load(id)
		return bf.Spec.HostDir, err
	})
	if b.log == nil {
		b.log = slog.Default()
	}
	if err := os.MkdirAll(b.root, 0o700); err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	if err := writeEtc(b.etc); err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	if err := os.MkdirAll(stageDir, 0o755); err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	for _, c := range b.uids().Clashes("/etc") {
		b.log.Warn("local backend: an account uses the host uids of boxes; a box escaping its namespaces would be that account", "entry", c, "range", fmt.Sprintf("%d-%d", b.uids().Base, b.uids().Last()))
	}
	b.sweepHalfMade()
	cgRoot := opts.CgroupRoot
	if cgRoot == "" {
		cgRoot = "/sys/fs/cgroup"
	}
	b.cg = &cgroups{}
	if cgRoot != "-" {
		b.cg = newCgroups(cgRoot)
	}
	b.enf = backend.Enforcement{Memory: true, CPU: b.cg.has("cpu"), Pids: b.cg.has("pids"), Disk: true}
	if !b.cg.has("memory") {
		b.enf.Warnings = append(b.enf.Warnings, "memory: no writable cgroup memory controller; each process limited by RLIMIT_DATA (at least 128 MiB; heap only, not page cache or shared memory)")
	}
	if !b.enf.Pids {
		b.enf.Warnings = append(b.enf.Warnings, "pids: no writable cgroup pids controller; not enforced (RLIMIT_NPROC counts all processes of the host uid)")
	}
	if !b.enf.CPU {
		b.enf.Warnings = append(b.enf.Warnings, "cpu: no writable cgroup cpu controller; not enforced")
	}
	for _, w := range b.enf.Warnings {
		b.log.Warn("local backend: limit not enforced", "detail", w)
	}
	return b, nil
}

// writeEtc writes the /etc of DefaultImage boxes, with mount points for the
// host directories bound into it.
func writeEtc(dir string) error {
	for _, d := range []string{"alternatives", "ssl/certs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	for name, body := range image.BoxEtc {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			return err
		}
	}
	for name, target := range image.BoxEtcLinks {
		p := filepath.Join(dir, name)
		_ = os.Remove(p)
		if err := os.Symlink(target, p); err != nil {
			return err
		}
	}
	return nil
}

// Name is "local".
func (b *Backend) Name() string { return "local" }

// Capabilities: disks are copied whole (Clone), boxes run here with no
// network but loopback in a namespace of their own; which limits hold
// depends on the cgroups this process may make.
func (b *Backend) Capabilities() backend.Capabilities {
	return backend.Capabilities{Clone: true, Limits: b.enf, Network: backend.NetworkNamespace, MaxCPUs: runtime.NumCPU()}
}

// Dial connects to box id's agent, on its socket in the box's host dir.
func (b *Backend) Dial(ctx context.Context, id string) (net.Conn, error) {
	return b.dialer.Dial(ctx, id)
}

type boxFile struct {
	Spec    backend.Spec `json:"spec"`
	Created time.Time    `json:"created"`
	// UID is the host uid (and gid) of the box user; 0 in a box made
	// before boxes had one (Start gives it one).
	UID int `json:"uid,omitempty"`
}

// running is state.json: the bwrap process and the agent (PID 1 inside).
type running struct {
	Bwrap proc `json:"bwrap"`
	Agent proc `json:"agent"`
}

// alive: a box runs while its agent or its bwrap does.
func (r *running) alive() bool { return r.Agent.alive() || r.Bwrap.alive() }

func (b *Backend) dir(id string) string { return filepath.Join(b.root, id) }

// lock takes the box's lock and returns its release, which drops the
// entry when no one else holds or waits for it.
func (b *Backend) lock(id string) func() {
	b.mu.Lock()
	l, ok := b.locks[id]
	if !ok {
		l = &boxLock{}
		b.locks[id] = l
	}
	l.refs++
	b.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		b.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(b.locks, id)
		}
		b.mu.Unlock()
	}
}

var imageName = regexp.MustCompile(`^cellbox/([a-z0-9][a-z0-9_.-]*?)(:latest)?$`)

// rootfs is the image rootfs of a spec's image, "" for DefaultImage.
func (b *Backend) rootfs(img string) (string, error) {
	if img == backend.DefaultImage {
		return "", nil
	}
	m := imageName.FindStringSubmatch(img)
	if m == nil {
		return "", fmt.Errorf("image %q: the local backend runs %q or cellbox/NAME built by `cellbox image build NAME`: %w", img, backend.DefaultImage, backend.ErrNoImage)
	}
	if b.images == "" {
		return "", fmt.Errorf("image %q: this local backend has no images directory: %w", img, backend.ErrNoImage)
	}
	if other := image.Unbuildable(m[1]); other != "" {
		if _, err := os.Lstat(image.RootfsDir(b.images, m[1])); err != nil {
			return "", fmt.Errorf("image %q: no such image (%s): %w", img, other, backend.ErrNoImage)
		}
	}
	dir := image.RootfsDir(b.images, m[1])
	for _, p := range []string{"usr", strings.TrimPrefix(backend.Workspace, "/"), strings.TrimPrefix(backend.SocketDir, "/"), strings.TrimPrefix(backend.AgentPath, "/")} {
		if _, err := os.Lstat(filepath.Join(dir, p)); err != nil {
			return "", fmt.Errorf("image %q: %s is not a cellbox image rootfs (%v); build it: `cellbox image build %s --images %s`: %w", img, dir, err, m[1], b.images, backend.ErrNoImage)
		}
	}
	return dir, nil
}

// Create makes the box directory and its workspace.
func (b *Backend) Create(ctx context.Context, spec backend.Spec) (backend.Info, error) {
	return b.create(ctx, spec, func(d boxdisk.Disk, uid int) error {
		// Templates of every box's disk shared by the user's data dirs,
		// else beside the boxes (a dot: not a box).
		d.Templates = cmp.Or(boxdisk.SharedTemplates(), filepath.Join(b.root, ".disk-templates"))
		return d.Make(ctx, spec.Limits.Defaults().DiskBytes, uid, uid)
	})
}

// Clone makes boxes specs with copies of box src's disk
// (backend.Cloner). The copies' files are given to each new box's host
// uid (the box user and its root are other host uids in every box, see
// userns.go).
func (b *Backend) Clone(ctx context.Context, src string, specs []backend.Spec) ([]backend.Info, error) {
	sbf, _, err := b.load(src)
	if err != nil {
		return nil, fmt.Errorf("clone box %s: %w", src, err)
	}
	if sbf.UID == 0 {
		return nil, fmt.Errorf("clone box %s: it has no host uid yet (start it once): %w", src, errors.ErrUnsupported)
	}
	// The copies wait in the source's directory (the same filesystem as
	// the boxes', so Adopt links them into place).
	return backend.CloneAll(ctx, b, diskOf(b.dir(src)), b.dir(src), specs, func(spec backend.Spec, image string) (backend.Info, error) {
		return b.create(ctx, spec, func(d boxdisk.Disk, uid int) error {
			if err := d.Adopt(ctx, image); err != nil {
				return err
			}
			return rechown(d.Dir, sbf.UID, uid)
		})
	})
}

// create makes a box whose disk makeDisk makes for the box's host uid.
func (b *Backend) create(ctx context.Context, spec backend.Spec, makeDisk func(d boxdisk.Disk, uid int) error) (backend.Info, error) {
	if err := spec.Validate(b.Capabilities()); err != nil {
		return backend.Info{}, err
	}
	spec.Image = spec.ImageOrDefault()
	if _, err := b.rootfs(spec.Image); err != nil {
		return backend.Info{}, fmt.Errorf("create box %s: %w", spec.ID, err)
	}
	defer b.lock(spec.ID)()
	dir := b.dir(spec.ID)
	if err := b.makeBoxDir(dir); errors.Is(err, os.ErrExist) {
		return backend.Info{}, fmt.Errorf("create box %s: %w", spec.ID, backend.ErrExists)
	} else if err != nil {
		return backend.Info{}, fmt.Errorf("create box %s: %w", spec.ID, err)
	}
	crashpoint.Hit("local.dir", spec.ID)
	bf := boxFile{Spec: spec, Created: time.Now().UTC()}
	// spec.json last: it marks a whole box (sweepHalfMade).
	uid, err := b.allocUID(spec.ID)
	if err == nil {
		crashpoint.Hit("local.uid", spec.ID)
		bf.UID = uid
		err = makeDisk(diskOf(dir), uid)
	}
	if err == nil {
		crashpoint.Hit("local.disk", spec.ID)
		err = b.writeBoxFile(bf)
	}
	if err != nil {
		_ = b.removeDir(context.WithoutCancel(ctx), dir)
		b.freeUID(spec.ID, uid)
		return backend.Info{}, fmt.Errorf("create box %s: %w", spec.ID, err)
	}
	_ = os.Remove(filepath.Join(dir, makerFile)) // whole now: spec.json says so
	b.dialer.Remember(spec.ID, spec.HostDir)
	return b.info(bf, nil), nil
}

// makerFile, in a box directory without spec.json, names the process
// making the box (a proc): sweepHalfMade tells a Create cut short by its
// process's death from one in flight.
const makerFile = "maker.json"

// makeBoxDir makes a box's directory, with its maker file already in it
// (made aside, then renamed into place; os.ErrExist if dir exists), so
// that no box directory is ever without one of maker or spec.
func (b *Backend) makeBoxDir(dir string) error {
	me, err := currentProc(os.Getpid())
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(b.root, ".making-") // not a box id: List skips it
	if err != nil {
		return err
	}
	data, _ := json.Marshal(me)
	err = os.WriteFile(filepath.Join(tmp, makerFile), data, 0o600)
	if err == nil {
		err = os.Chmod(tmp, 0o700)
	}
	if err == nil {
		err = unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dir, unix.RENAME_NOREPLACE)
		if errors.Is(err, unix.EEXIST) {
			err = os.ErrExist
		}
	}
	if err != nil {
		os.RemoveAll(tmp)
	}
	return err
}

// madeByTheLiving reports whether the half-made box directory dir is
// being made by a live process (its maker file names one).
func madeByTheLiving(dir string) bool {
	data, err := os.ReadFile(filepath.Join(dir, makerFile))
	var maker proc
	return err == nil && json.Unmarshal(data, &maker) == nil && maker.alive()
}

func (b *Backend) writeBoxFile(bf boxFile) error {
	data, _ := json.MarshalIndent(bf, "", "  ")
	return writeFileAtomic(filepath.Join(b.dir(bf.Spec.ID), "spec.json"), data)
}

// ensureUID gives a box made before boxes had host uids of their own a
// uid, and its workspace to that uid.
func (b *Backend) ensureUID(bf *boxFile) error {
	if bf.UID != 0 {
		return nil
	}
	uid, err := b.allocUID(bf.Spec.ID)
	if err != nil {
		return err
	}
	bf.UID = uid
	if err = chownOwnedBy(diskOf(b.dir(bf.Spec.ID)).Workspace(), uid); err == nil {
		err = b.writeBoxFile(*bf)
	}
	if err != nil {
		bf.UID = 0
		b.freeUID(bf.Spec.ID, uid)
		return fmt.Errorf("give the box a host uid: %w", err)
	}
	return nil
}

// diskOf is the disk of the box in dir: disk.img mounted at disk/.
func diskOf(dir string) boxdisk.Disk {
	return boxdisk.Disk{File: filepath.Join(dir, "disk.img"), Dir: filepath.Join(dir, "disk")}
}

// removeDir unmounts and deletes a box's disk, then its directory.
func (b *Backend) removeDir(ctx context.Context, dir string) error {
	if err := diskOf(dir).Remove(ctx); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// load reads a box's spec.json and state.json (nil when never started).
func (b *Backend) load(id string) (boxFile, *running, error) {
	var bf boxFile
	if !validID(id) {
		return bf, nil, fmt.Errorf("box %s: %w", id, backend.ErrNotFound)
	}
	data, err := os.ReadFile(filepath.Join(b.dir(id), "spec.json"))
	if errors.Is(err, os.ErrNotExist) {
		return bf, nil, fmt.Errorf("box %s: %w", id, backend.ErrNotFound)
	} else if err != nil {
		return bf, nil, fmt.Errorf("box %s: %w", id, err)
	}
	if err := json.Unmarshal(data, &bf); err != nil {
		return bf, nil, fmt.Errorf("box %s: spec.json: %w", id, err)
	}
	data, err = os.ReadFile(filepath.Join(b.dir(id), "state.json"))
	if errors.Is(err, os.ErrNotExist) {
		return bf, nil, nil
	} else if err != nil {
		return bf, nil, fmt.Errorf("box %s: %w", id, err)
	}
	var r running
	if err := json.Unmarshal(data, &r); err != nil {
		return bf, nil, fmt.Errorf("box %s: state.json: %w", id, err)
	}
	return bf, &r, nil
}

func validID(id string) bool { return backend.ValidID(id) == nil }

func (b *Backend) info(bf boxFile, r *running) backend.Info {
	st := backend.StateCreated
	if r != nil {
		st = backend.StateStopped
		if r.alive() {
			st = backend.StateRunning
		}
	}
	return backend.Info{ID: bf.Spec.ID, Labels: bf.Spec.BoxLabels(), Image: bf.Spec.ImageOrDefault(), State: st,
		Created: bf.Created, HostDir: bf.Spec.HostDir}
}

// Inspect reports a box, and for a stopped one why it stopped (the start
// of its box.log; List leaves that out, as the Docker backend does).
func (b *Backend) Inspect(ctx context.Context, id string) (backend.Info, error) {
	bf, r, err := b.load(id)
	if err != nil {
		return backend.Info{}, fmt.Errorf("inspect %w", err)
	}
	in := b.info(bf, r)
	if in.State == backend.StateStopped {
		in.Exit = "agent exited"
		if f, err := os.Open(filepath.Join(b.dir(id), "box.log")); err == nil {
			head, _ := io.ReadAll(io.LimitReader(f, 16<<10))
			f.Close()
			if sum := backend.ExitSummary(string(head)); sum != "" {
				in.Exit += ": " + sum
			}
		}
	}
	return in, nil
}

// List scans Root for boxes whose labels include every given label.
func (b *Backend) List(ctx context.Context, labels map[string]string) ([]backend.Info, error) {
	ents, err := os.ReadDir(b.root)
	if err != nil {
		return nil, fmt.Errorf("list boxes in %s: %w", b.root, err)
	}
	var out []backend.Info
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		bf, r, err := b.load(e.Name())
		if errors.Is(err, backend.ErrNotFound) {
			continue // being created or removed
		} else if err != nil {
			b.log.Warn("local backend: skipping unreadable box", "dir", b.dir(e.Name()), "err", err)
			continue
		}
		if in := b.info(bf, r); backend.MatchLabels(in.Labels, labels) {
			out = append(out, in)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// wrapper joins the box's cgroups (or sets the rlimit fallback) and execs
// bwrap, so that no box process ever runs outside them.
const wrapper = `for f in $CELLBOX_CGROUP_PROCS; do echo $$ > "$f" || exit 125; done
if [ -n "$CELLBOX_DATA_KB" ]; then ulimit -d "$CELLBOX_DATA_KB" || exit 125; fi
exec "$@"`

// Start launches bwrap detached with the agent as PID 1 and returns once
// bwrap reports the agent's pid.
func (b *Backend) Start(ctx context.Context, id string) (backend.Info, error) {
	defer b.lock(id)()
	bf, r, err := b.load(id)
	if err != nil {
		return backend.Info{}, fmt.Errorf("start %w", err)
	}
	if r != nil && r.alive() {
		return b.info(bf, r), nil
	}
	spec := bf.Spec
	rootfs, err := b.rootfs(spec.ImageOrDefault())
	if err != nil {
		return backend.Info{}, fmt.Errorf("start box %s: %w", id, err)
	}
	dir := b.dir(id)
	// Mounted since Create unless the host rebooted.
	if err := diskOf(dir).Mount(ctx); err != nil {
		return backend.Info{}, fmt.Errorf("start box %s: %w", id, err)
	}
	if err := b.ensureUID(&bf); err != nil {
		return backend.Info{}, fmt.Errorf("start box %s: %w", id, err)
	}
	// The agent, as the box user, makes its socket in the host dir.
	if err := os.Lchown(spec.HostDir, bf.UID, bf.UID); err != nil {
		return backend.Info{}, fmt.Errorf("start box %s: host dir: %w", id, err)
	}
	userns, err := newUserns(ctx, bf.UID)
	if err != nil {
		return backend.Info{}, fmt.Errorf("start box %s: %w", id, err)
	}
	defer userns.Close()
	logf, err := os.OpenFile(filepath.Join(dir, "box.log"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return backend.Info{}, fmt.Errorf("start box %s: %w", id, err)
	}
	defer logf.Close()
	infoR, infoW, err := os.Pipe()
	if err != nil {
		return backend.Info{}, fmt.Errorf("start box %s: %w", id, err)
	}
	defer infoR.Close()
	defer infoW.Close()

	lim := spec.Limits.Defaults()
	env := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	procs, err := b.cg.setup(id, lim)
	if err != nil {
		_ = b.cg.remove(id)
		return backend.Info{}, fmt.Errorf("start box %s: %w", id, err)
	}
	env = append(env, "CELLBOX_CGROUP_PROCS="+strings.Join(procs, " "))
	if !b.cg.has("memory") {
		env = append(env, "CELLBOX_DATA_KB="+strconv.FormatInt(max(lim.MemoryBytes, minDataLimit)>>10, 10))
	}

	filter, err := seccompPipe()
	if err != nil {
		_ = b.cg.remove(id)
		return backend.Info{}, fmt.Errorf("start box %s: %w", id, err)
	}
	defer filter.Close()
	bargs, binds := b.bwrapArgs(spec, rootfs, dir)
	args := append([]string{"-c", wrapper, "sh", b.bwrap}, bargs...)
	cmd := exec.Command("/bin/sh", args...)
	cmd.Env = env
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{infoW, userns, filter} // fd 3: --info-fd, fd 4: --userns, fd 5: --seccomp
	// No supplementary groups (the server's would stay with every box
	// process).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: &syscall.Credential{Groups: []uint32{}}}
	err = startStaged(cmd, binds)
	infoW.Close() // the child has it; EOF on infoR once bwrap is gone
	if err != nil {
		_ = b.cg.remove(id)
		return backend.Info{}, fmt.Errorf("start box %s: run bwrap: %w", id, err)
	}
	bwrapProc, perr := currentProc(cmd.Process.Pid)
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }() // reap; a later server's boxes are reaped by init

	agentPID, err := readChildPID(ctx, infoR, exited)
	if err == nil && perr != nil {
		err = perr
	}
	if err != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		_ = b.cg.remove(id)
		return backend.Info{}, fmt.Errorf("start box %s: %w%s", id, err, logTail(filepath.Join(dir, "box.log")))
	}
	agent, _ := currentProc(agentPID)
	r = &running{Bwrap: bwrapProc, Agent: agent}
	data, _ := json.Marshal(r)
	if err := writeFileAtomic(filepath.Join(dir, "state.json"), data); err != nil {
		_ = b.stop(id, r, false)
		return backend.Info{}, fmt.Errorf("start box %s: %w", id, err)
	}
	return b.info(bf, r), nil
}

// readChildPID reads bwrap's --info-fd JSON; it ends when bwrap has made
// the namespaces and forked the agent.
func readChildPID(ctx context.Context, r *os.File, exited <-chan struct{}) (int, error) {
	type result struct {
		pid int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		var info struct {
			ChildPID int `json:"child-pid"`
		}
		err := json.NewDecoder(r).Decode(&info)
		if err == nil && info.ChildPID <= 0 {
			err = errors.New("no child-pid")
		}
		ch <- result{info.ChildPID, err}
	}()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	select {
	case res := <-ch:
		if res.err != nil {
			return 0, fmt.Errorf("bwrap did not start the box: %w", res.err)
		}
		return res.pid, nil
	case <-exited:
		select {
		case res := <-ch:
			if res.err == nil {
				return res.pid, nil
			}
		case <-time.After(100 * time.Millisecond):
		}
		return 0, errors.New("bwrap exited at once")
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-timer.C:
		return 0, errors.New("bwrap did not report its child within 10s")
	}
}

// logTail is the end of the box log, for error messages.
func logTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > 2048 {
		_, _ = f.Seek(-2048, io.SeekEnd)
	}
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) == 0 {
		return ""
	}
	return ": " + strings.Join(lines, "; ")
}

// seccompPipe returns a pipe that holds the box's seccomp filter for
// bwrap --seccomp (a few hundred bytes: it fits the pipe's buffer).
func seccompPipe() (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("seccomp filter: %w", err)
	}
	defer w.Close()
	if _, err := w.Write(seccomp.Filter()); err != nil {
		r.Close()
		return nil, fmt.Errorf("seccomp filter: %w", err)
	}
	return r, nil
}

// bwrapArgs is the bubblewrap command line of a box (after "bwrap"), to
// run with the box's info pipe at fd 3, its user namespace at fd 4, its
// seccomp filter at fd 5 and binds staged (startStaged).
func (b *Backend) bwrapArgs(spec backend.Spec, rootfs, dir string) ([]string, []stageBind) {
	a := []string{
		"--userns", "4", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
		"--assert-userns-disabled",
		"--uid", strconv.Itoa(backend.BoxUID), "--gid", strconv.Itoa(backend.BoxGID),
		"--cap-drop", "ALL", "--as-pid-1", "--hostname", "box",
		"--info-fd", "3", "--seccomp", "5",
	}
	if !spec.Network {
		a = append(a, "--unshare-net")
	}
	disk := diskOf(dir)
	binds := []stageBind{
		{name: "tmp", src: disk.Tmp()},
		{name: "workspace", src: disk.Workspace()},
		{name: "host", src: spec.HostDir},
		{name: "agent", src: spec.AgentBinary, file: true},
	}
	if rootfs != "" {
		binds = append(binds, stageBind{name: "rootfs", src: rootfs})
		a = append(a, "--ro-bind", staged("rootfs"), "/")
	} else {
		a = append(a, "--ro-bind", "/usr", "/usr")
		for _, l := range [][2]string{{"usr/bin", "/bin"}, {"usr/lib", "/lib"}, {"usr/lib64", "/lib64"}, {"usr/sbin", "/sbin"}} {
			a = append(a, "--symlink", l[0], l[1])
		}
		binds = append(binds, stageBind{name: "etc", src: b.etc})
		a = append(a, "--ro-bind", staged("etc"), "/etc")
		for _, p := range etcBinds {
			a = append(a, "--ro-bind-try", p, p)
		}
		if spec.Network {
			a = append(a, "--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf")
		}
	}
	a = append(a,
		"--proc", "/proc", "--dev", "/dev",
		"--bind", staged("tmp"), "/tmp",
		"--bind", staged("workspace"), backend.Workspace,
		"--bind", staged("host"), backend.SocketDir,
		"--ro-bind", staged("agent"), backend.AgentPath,
	)
	if rootfs == "" {
		a = append(a, "--remount-ro", "/")
	}
	a = append(a, "--chdir", backend.Workspace, "--clearenv")
	env := make(map[string]string, len(backend.BoxEnv)+len(spec.Env))
	for k, v := range backend.BoxEnv {
		env[k] = v
	}
	for k, v := range spec.Env {
		env[k] = v
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		a = append(a, "--setenv", k, env[k])
	}
	// The agent cannot see the box's cgroups; it names the limits in its
	// messages when the box runs out.
	lim := spec.Limits.Defaults()
	return append(append(a, "--"), append(spec.AgentCommand(),
		"--pids-limit", strconv.FormatInt(lim.Pids, 10), "--memory-limit", strconv.FormatInt(lim.MemoryBytes, 10))...), binds
}

// Stop ends the box's processes and removes its cgroups; the workspace
// stays.
func (b *Backend) Stop(ctx context.Context, id string) error {
	defer b.lock(id)()
	_, r, err := b.load(id)
	if err != nil {
		return fmt.Errorf("stop %w", err)
	}
	if err := b.stop(id, r, true); err != nil {
		return err
	}
	if err := diskOf(b.dir(id)).Unmount(ctx); err != nil {
		return fmt.Errorf("stop box %s: %w", id, err)
	}
	return nil
}

// stop asks the agent to exit (SIGTERM; PID 1 of a pid namespace only gets
// the signals it handles) and kills it after stopGrace, or at once when
// the box is not to be kept (killing PID 1 ends the whole pid namespace),
// then makes sure bwrap and the cgroups are gone.
func (b *Backend) stop(id string, r *running, graceful bool) error {
	if r != nil && r.alive() {
		if graceful {
			r.Agent.signal(syscall.SIGTERM)
		}
		if !graceful || r.Agent.waitGone(stopGrace) != nil {
			r.Agent.signal(syscall.SIGKILL)
		}
		if r.Agent.waitGone(stopGrace) == nil && r.Bwrap.waitGone(stopGrace) != nil {
			r.Bwrap.signal(syscall.SIGKILL)
		}
		if r.alive() {
			_ = r.Bwrap.waitGone(stopGrace)
			if r.alive() {
				return fmt.Errorf("stop box %s: agent pid %d / bwrap pid %d still running after SIGKILL", id, r.Agent.PID, r.Bwrap.PID)
			}
		}
	}
	if err := b.cg.remove(id); err != nil {
		return fmt.Errorf("stop box %s: %w", id, err)
	}
	return nil
}

// Remove stops the box and deletes its directory (workspace included;
// symlinks in it are removed, never followed). A missing box is not an
// error.
func (b *Backend) Remove(ctx context.Context, id string) error {
	if !validID(id) {
		return nil
	}
	defer b.lock(id)()
	bf, r, err := b.load(id)
	if err != nil && !errors.Is(err, backend.ErrNotFound) {
		b.log.Warn("local backend: removing unreadable box", "id", id, "err", err)
	}
	if err := b.stop(id, r, false); err != nil { // its files go too: no grace
		return fmt.Errorf("remove box %s: %w", id, err)
	}
	if err := b.removeDir(ctx, b.dir(id)); err != nil {
		return fmt.Errorf("remove box %s: %w", id, err)
	}
	b.freeUID(id, bf.UID)
	b.dialer.Forget(id)
	return nil
}

// sweepHalfMade removes the disk copies a fork left in box directories
// (backend.SweepClones, an hour old), box directories that have no
// spec.json and whose maker is dead (makeBoxDir), however fresh, then the
// host uid reservations of boxes that have no directory: what a process
// killed inside Create or Clone left. List never sees them, so nothing
// else would. A Create in flight in a live process (another Backend over
// the root) is left alone.
func (b *Backend) sweepHalfMade() {
	entries, err := os.ReadDir(b.root)
	if err != nil {
		return
	}
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), ".making-") && !madeByTheLiving(b.dir(e.Name())) {
			os.RemoveAll(b.dir(e.Name())) // cut short before it was renamed into place
			continue
		}
		if !e.IsDir() || !validID(e.Name()) {
			continue
		}
		dir := b.dir(e.Name())
		for _, f := range backend.SweepClones(dir, backend.StaleClone) {
			b.log.Warn("local backend: removed the copy of a disk a fork left", "file", f)
		}
		if _, err := os.Lstat(filepath.Join(dir, "spec.json")); !errors.Is(err, os.ErrNotExist) || madeByTheLiving(dir) {
			continue
		}
		b.log.Warn("local backend: removing a half-made box directory", "dir", dir)
		if err := b.removeDir(context.Background(), dir); err != nil {
			b.log.Warn("local backend: removing a half-made box directory", "dir", dir, "err", err)
		}
	}
	b.sweepUIDs()
}
