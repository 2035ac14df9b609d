// Package image builds box images without a registry: debootstrap from the
// Debian mirror apt is configured with into DATA/images/NAME/rootfs, which
// the local backend binds as a box's root and `cellbox image build` imports
// into Docker as cellbox/NAME. It also holds the skeleton of
// backend.DefaultImage (the host's /usr over a minimal root).
package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/cellbox/cellbox/sandbox/backend"
)

// basePackages are added to debootstrap's minbase in every image.
var basePackages = []string{"bash", "coreutils", "python3", "ca-certificates"}

// packages are each image's packages beyond basePackages, installed with
// apt-get in the new root (debootstrap's own resolver trips over some, npm
// among them).
var packages = map[string][]string{
	"base":   nil,
	"python": {"python3-pip", "python3-venv", "python3-matplotlib"}, // matplotlib (with numpy, pillow): run_code plots
	"node":   {"nodejs", "npm", "node-typescript"},
}

// Names are the images Build knows.
func Names() []string {
	n := make([]string, 0, len(packages))
	for k := range packages {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// Unbuildable says, for an image name Build does not know, what it makes
// instead ("" for one it knows): for the hint of a box whose image is
// missing, which must not propose a build that is then refused.
func Unbuildable(name string) string {
	if _, ok := packages[name]; ok {
		return ""
	}
	refs := make([]string, 0, len(packages))
	for _, n := range Names() {
		refs = append(refs, Ref(n))
	}
	return "`cellbox image build` makes only " + strings.Join(refs, ", ")
}

// Ref is the Docker image name of an image: cellbox/NAME.
func Ref(name string) string { return "cellbox/" + name }

// RootfsDir is where image name's root filesystem lives under imagesDir.
func RootfsDir(imagesDir, name string) string { return filepath.Join(imagesDir, name, "rootfs") }

// markerName is the file in a finished rootfs that describes it.
const markerName = ".cellbox-image.json"

// Info describes a built image.
type Info struct {
	Name     string    `json:"name"`
	Rootfs   string    `json:"rootfs"`
	Suite    string    `json:"suite"`
	Mirror   string    `json:"mirror"`
	Packages []string  `json:"packages"`
	Size     int64     `json:"size"` // bytes of regular files
	Built    time.Time `json:"built"`
}

// BuildOptions configure Build.
type BuildOptions struct {
	ImagesDir string // DATA/images
	Name      string // one of Names()
	Force     bool   // rebuild an existing rootfs
	// Suite defaults to the host's codename; Mirror to apt's source for it.
	Suite, Mirror string
	// Output receives debootstrap's output (nil: dropped).
	Output io.Writer
	Logger *slog.Logger
}

// Build makes image Name's rootfs unless it exists (or Force). It reports
// whether it built. The rootfs is built beside its final place and renamed
// there when complete, so a failed build leaves no half image. When ctx
// ends (Ctrl-C, SIGTERM) every process of the build is stopped within
// stopGrace, the partial rootfs is unmounted and removed, and the error
// (which unwraps to ctx.Err()) says the build was interrupted.
func Build(ctx context.Context, o BuildOptions) (Info, bool, error) {
	extra, ok := packages[o.Name]
	pkgs := append(slices.Clone(basePackages), extra...)
	if !ok {
		return Info{}, false, fmt.Errorf("unknown image %q: want one of %s", o.Name, strings.Join(Names(), ", "))
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	rootfs := RootfsDir(o.ImagesDir, o.Name)
	if in, err := Read(rootfs); err == nil && !o.Force {
		return in, false, nil
	}
	if os.Geteuid() != 0 {
		return Info{}, false, errors.New("image build runs debootstrap, which needs root")
	}
	deboot, err := exec.LookPath("debootstrap")
	if err != nil {
		return Info{}, false, fmt.Errorf("image build: %w (install the debootstrap package)", err)
	}
	if o.Suite == "" {
		if o.Suite, err = HostSuite("/etc/os-release"); err != nil {
			return Info{}, false, err
		}
	}
	if o.Mirror == "" {
		srcs, err := ReadAptSources("/etc/apt")
		if err != nil {
			return Info{}, false, err
		}
		if o.Mirror, err = Mirror(srcs, o.Suite); err != nil {
			return Info{}, false, err
		}
	}
	if err := os.MkdirAll(filepath.Dir(rootfs), 0o755); err != nil {
		return Info{}, false, fmt.Errorf("image build %s: %w", o.Name, err)
	}
	// One build of an image at a time, across processes: a second
	// `cellbox image build`, or tests of several packages at once, would
	// remove each other's rootfs.building. The one that waited takes the
	// image the first built.
	unlock, err := lockBuild(ctx, filepath.Join(filepath.Dir(rootfs), "build.lock"), log, o.Name)
	if err != nil {
		return Info{}, false, err
	}
	defer unlock()
	if in, err := Read(rootfs); err == nil && !o.Force {
		return in, false, nil
	}
	tmp := rootfs + ".building"
	if err := errors.Join(sweep(rootfs), removeBuilding(tmp)); err != nil {
		return Info{}, false, fmt.Errorf("image build %s: clear %s: %w", o.Name, tmp, err)
	}
	log.Info("debootstrap", "image", o.Name, "suite", o.Suite, "mirror", o.Mirror, "packages", pkgs)
	// stopped ends a build cut short by ctx (Ctrl-C, SIGTERM): the steps
	// are dead by now (runLogged kills each one's whole process group), so
	// the partial rootfs goes; the finished one, if any, was never touched.
	stopped := func(during string) error {
		msg := fmt.Sprintf("image build %s: interrupted (%v) during %s; nothing was installed, the image built before, if any, is untouched", o.Name, context.Cause(ctx), during)
		if left, err := discard(rootfs); err != nil {
			msg += fmt.Sprintf("; the partial rootfs is left at %s (%v), the next build removes it", left, err)
		} else if left != "" {
			msg += fmt.Sprintf("; what is left of the partial rootfs, %s, goes with the next build", left)
		}
		return &interruptedError{msg, ctx.Err()}
	}
	run := func(what string, name string, args ...string) error {
		tail, err := runLogged(ctx, o.Output, name, args...)
		if err != nil && ctx.Err() != nil {
			return stopped(what)
		}
		if err != nil {
			if b, rerr := os.ReadFile(filepath.Join(tmp, "debootstrap", "debootstrap.log")); rerr == nil {
				tail.Write(b)
			}
			return fmt.Errorf("image build %s: %s: %w\n%s", o.Name, what, err, tail.String())
		}
		return nil
	}
	err = run("debootstrap "+o.Suite+" from "+o.Mirror, deboot, "--variant=minbase", "--include="+strings.Join(basePackages, ","), o.Suite, tmp, o.Mirror)
	if err == nil && len(extra) > 0 {
		// apt-get in the new root, confined by bubblewrap (as root: dpkg
		// chowns) so that no mount outlives a failure.
		inRoot := []string{"--bind", tmp, "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
			"--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf", "--unshare-pid", "--die-with-parent", "--"}
		err = run("apt-get update", "bwrap", append(inRoot, "apt-get", "update")...)
		if err == nil {
			err = run("apt-get install "+strings.Join(extra, " "), "bwrap",
				append(inRoot, append([]string{"apt-get", "install", "-y", "--no-install-recommends"}, extra...)...)...)
		}
	}
	var stop *interruptedError
	if errors.As(err, &stop) {
		return Info{}, false, err
	}
	if err != nil {
		_ = removeBuilding(tmp)
		return Info{}, false, err
	}
	in := Info{Name: o.Name, Rootfs: rootfs, Suite: o.Suite, Mirror: o.Mirror, Packages: pkgs, Built: time.Now().UTC()}
	if err := finish(tmp, &in); err != nil {
		_ = removeBuilding(tmp)
		return Info{}, false, fmt.Errorf("image build %s: %w", o.Name, err)
	}
	if ctx.Err() != nil {
		// Complete, but the stop came first: a stopped build installs nothing.
		return Info{}, false, stopped("the last step")
	}
	// Swap in the new rootfs; the old one goes (boxes still using it lose it).
	old := rootfs + ".old"
	_ = os.RemoveAll(old)
	if err := os.Rename(rootfs, old); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Info{}, false, fmt.Errorf("image build %s: %w", o.Name, err)
	}
	if err := os.Rename(tmp, rootfs); err != nil {
		return Info{}, false, fmt.Errorf("image build %s: %w", o.Name, err)
	}
	_ = os.RemoveAll(old)
	return in, true, nil
}

// finish turns a debootstrap tree into a box image: the box user, the
// mount points the backends bind over (the rootfs is read-only in local
// boxes), no apt caches, and the marker.
func finish(root string, in *Info) error {
	for _, p := range []string{"var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*_*"} {
		m, _ := filepath.Glob(filepath.Join(root, p))
		for _, f := range m {
			if err := os.RemoveAll(f); err != nil {
				return err
			}
		}
	}
	if err := addLine(filepath.Join(root, "etc/passwd"), backend.BoxUser+":", userLine); err != nil {
		return err
	}
	if err := addLine(filepath.Join(root, "etc/group"), backend.BoxUser+":", groupLine); err != nil {
		return err
	}
	for _, f := range []string{"hostname", "hosts"} {
		if err := os.WriteFile(filepath.Join(root, "etc", f), []byte(BoxEtc[f]), 0o644); err != nil {
			return err
		}
	}
	ws := filepath.Join(root, backend.Workspace)
	for _, d := range []string{ws, filepath.Join(root, backend.SocketDir), filepath.Dir(filepath.Join(root, backend.AgentPath))} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := os.Chown(ws, backend.BoxUID, backend.BoxGID); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(root, backend.AgentPath), nil, 0o755); err != nil {
		return err
	}
	size, err := treeSize(root)
	if err != nil {
		return err
	}
	in.Size = size
	b, _ := json.MarshalIndent(in, "", "  ")
	return os.WriteFile(filepath.Join(root, markerName), b, 0o644)
}

// addLine appends line to file unless a line starts with prefix.
func addLine(file, prefix, line string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, prefix) {
			return nil
		}
	}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		line = "\n" + line
	}
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(line)
	return errors.Join(err, f.Close())
}

func treeSize(root string) (int64, error) {
	var n int64
	err := filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += fi.Size()
		}
		return nil
	})
	return n, err
}

// Read describes the finished rootfs at dir.
func Read(rootfs string) (Info, error) {
	b, err := os.ReadFile(filepath.Join(rootfs, markerName))
	if err != nil {
		return Info{}, fmt.Errorf("image at %s: %w", rootfs, err)
	}
	var in Info
	if err := json.Unmarshal(b, &in); err != nil {
		return Info{}, fmt.Errorf("image at %s: %s: %w", rootfs, markerName, err)
	}
	in.Rootfs = rootfs
	return in, nil
}

// List describes the images built under imagesDir.
func List(imagesDir string) ([]Info, error) {
	ents, err := os.ReadDir(imagesDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	var out []Info
	for _, e := range ents {
		if in, err := Read(RootfsDir(imagesDir, e.Name())); err == nil && e.IsDir() {
			out = append(out, in)
		}
	}
	return out, nil
}

// Tar writes rootfs as a tar stream (numeric owners; /proc, /sys and /dev
// contents left out), the input of Docker's image import.
func Tar(ctx context.Context, rootfs string, w io.Writer) error {
	cmd := exec.CommandContext(ctx, "tar", "--numeric-owner", "--one-file-system", "-C", rootfs,
		"--exclude=./proc/*", "--exclude=./sys/*", "--exclude=./dev/*", "-cf", "-", ".")
	cmd.Stdout = w
	tail := &tailWriter{}
	cmd.Stderr = tail
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("tar %s: %w: %s", rootfs, err, tail.String())
	}
	return nil
}

// runLogged runs a build step with its stdout and stderr copied, in the
// order they were written, to out (nil: nowhere) and to a tail kept for the
// error message. Both streams go to one writer value, so os/exec copies them
// through one pipe by one goroutine: two writers over the same out and tail
// would be written concurrently (a data race the first build on a machine
// hit).
func runLogged(ctx context.Context, out io.Writer, name string, args ...string) (*tailWriter, error) {
	cmd := groupCommand(ctx, name, args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C.UTF-8")
	tail := &tailWriter{}
	if out == nil {
		out = io.Discard
	}
	w := io.MultiWriter(out, tail)
	cmd.Stdout, cmd.Stderr = w, w
	return tail, runGroup(cmd)
}

// tailWriter keeps the last 4 KiB written to it, for error messages. It is
// written by one goroutine at a time (runLogged gives a command's two
// streams one writer).
type tailWriter struct{ b []byte }

func (t *tailWriter) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 4096 {
		t.b = slices.Clone(t.b[len(t.b)-4096:])
	}
	return len(p), nil
}

func (t *tailWriter) String() string { return strings.TrimSpace(string(t.b)) }

// lockBuild takes the build lock of an image (flock on path), waiting for
// another process's build to end, or for ctx.
func lockBuild(ctx context.Context, path string, log *slog.Logger, name string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("image build %s: %w", name, err)
	}
	for said := false; ; said = true {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("image build %s: lock %s: %w", name, path, err)
		}
		if !said {
			log.Info("another process is building the image; waiting for it", "image", name, "lock", path)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("image build %s: waiting for another build: %w", name, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}
