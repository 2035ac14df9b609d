// Package docker is the Backend that makes boxes as Docker containers through
// the Engine API (github.com/moby/moby/client; Engine API 1.41 and newer, the
// version is negotiated).
//
// A box is one container named after the box ID. Its PID 1 is the cellbox
// agent, bind-mounted read-only at backend.AgentPath; the box's host
// directory is bind-mounted at backend.SocketDir, where the agent puts its
// socket. The root filesystem is read-only; /workspace and /tmp are bind
// mounts from the box's own disk (boxdisk, capped at Limits.DiskBytes,
// under Options.DiskDir), which survives Stop and goes with Remove.
//
// Confinement of every box:
//   - runs as a host uid (and gid) of its own from boxuid.Docker, never a
//     real account, so two boxes cannot signal or read each other even
//     outside their namespaces and the files a box writes are that uid's on
//     the host (no user namespace remapping needed); the image's
//     /etc/passwd and /etc/group are bound over by copies that give the box
//     user (backend.BoxUser, HOME backend.Workspace) that uid;
//   - every capability dropped (effective and bounding sets empty: a shell,
//     python, pip --user, npm and compilers need none when they run as a
//     plain user), no-new-privileges, so setuid binaries in an image gain
//     nothing, and the seccomp profile of package seccomp (the calls
//     bubblewrap boxes refuse too);
//   - a read-only root filesystem, whatever the image;
//   - network mode "none" (loopback only) unless Spec.Network ("bridge");
//   - memory (swap included: MemorySwap = Memory), CPU (NanoCPUs) and pids
//     limits from Spec.Limits (Defaults applied).
//
// The image backend.DefaultImage is cellbox/host: a skeleton root (see
// image.SkeletonTar) imported on first use, with the host's /usr (bash,
// coreutils, python3), /etc/alternatives and /etc/ssl/certs bind-mounted
// read-only. Other images are used as they are; `cellbox image build NAME`
// makes cellbox/NAME.
//
// Orphans: every container carries backend.LabelManaged=1 and LabelID, so
// List(ctx, {LabelManaged: "1"}) finds every box ever made on this engine,
// including those of an earlier server; the pool removes the ones it does not
// know (see backend.Backend).
package docker

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/cellbox/cellbox/internal/crashpoint"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/backend/boxdisk"
	"github.com/cellbox/cellbox/sandbox/backend/boxuid"
	"github.com/cellbox/cellbox/sandbox/backend/seccomp"
	"github.com/cellbox/cellbox/sandbox/image"
)

// HostImage is the Docker image behind backend.DefaultImage. Its tag is a
// digest of image.SkeletonTar, so a changed skeleton is imported anew.
var HostImage = func() string {
	h := sha256.New()
	if err := image.SkeletonTar(h); err != nil {
		panic(err)
	}
	return fmt.Sprintf("cellbox/host:%x", h.Sum(nil)[:6])
}()

// labelImage keeps the image name the box was created with (Spec.Image);
// labelUID the box's host uid (boxuid.Docker).
const (
	labelImage = "cellbox.image"
	labelUID   = "cellbox.uid"
)

// hostBinds are the host paths the DefaultImage mounts read-only.
var hostBinds = []string{"/usr", "/etc/alternatives", "/etc/ssl/certs"}

// stopTimeout is how long Stop waits for the agent to exit on SIGTERM
// before the engine kills it.
const stopTimeout = 2

// Options configure New.
type Options struct {
	// Host is the engine address (unix:///var/run/docker.sock, tcp://...).
	// Empty: DOCKER_HOST, else the default socket.
	Host string
	// DiskDir holds the boxes' disks (see boxdisk): DiskDir/<id>.img
	// mounted at DiskDir/<id>. Default DefaultDiskDir.
	DiskDir string
	Logger  *slog.Logger
}

// DefaultDiskDir is Options.DiskDir's default. The disks are host files
// the engine bind-mounts, so they live on the engine's host.
const DefaultDiskDir = "/var/lib/cellbox/disks"

// Backend makes boxes as Docker containers. Safe for concurrent use.
type Backend struct {
	*engine
	disks  string
	dialer *backend.SocketDialer
}

// engine is a connection to a Docker Engine and what the backends on it
// (Backend, on this machine's engine; Remote) share: its API client, its
// CPU count, the box image it imports and the accounts of images.
type engine struct {
	cli      *client.Client
	log      *slog.Logger
	ncpu     int    // the engine's CPU count
	engineID string // the engine's ID ("" if it did not say)

	hostImageMu sync.Mutex  // serializes the on-demand import of HostImage
	hostImage   atomic.Bool // the engine had HostImage when last asked

	accountsMu sync.Mutex
	accountsOf map[string][2][]byte // image ID → its /etc/passwd and /etc/group

	digestsMu sync.Mutex
	digests   map[string]cachedDigest // image ref → its ID, as last asked
}

var (
	_ backend.Backend       = (*Backend)(nil)
	_ backend.ImageDigester = (*Backend)(nil)
)

// New connects to a Docker Engine and negotiates the API version. It fails
// when no engine answers.
func New(ctx context.Context, opts Options) (*Backend, error) {
	e, err := newEngine(ctx, opts.Host, opts.Logger)
	if err != nil {
		return nil, err
	}
	log := e.log
	disks := opts.DiskDir
	if disks == "" {
		disks = DefaultDiskDir
	}
	b := &Backend{engine: e, disks: disks}
	b.dialer = backend.NewSocketDialer(func(ctx context.Context, id string) (string, error) {
		c, err := b.container(ctx, id)
		if err != nil {
			return "", err
		}
		return hostDirOf(c.Mounts), nil
	})
	if err := b.claimDisks(); err != nil {
		// The disks here are another engine's (DOCKER_HOST names an engine
		// on another machine): its containers say nothing of them.
		log.Warn("docker backend: not sweeping the disk directory", "dir", disks, "err", err)
		return b, nil
	}
	for _, f := range backend.SweepClones(disks, backend.StaleClone) {
		log.Warn("docker backend: removed the copy of a disk a fork left", "file", f)
	}
	b.sweepOrphanDisks(ctx, OrphanDiskAge)
	// Free the uids of boxes a killed Create reserved but never made: the
	// disk goes last on Remove and is made right after the reservation.
	b.uids().Sweep(time.Minute, func(id string) bool {
		if backend.ValidID(id) != nil {
			return false
		}
		_, err := os.Lstat(b.disk(id).File)
		return errors.Is(err, fs.ErrNotExist)
	})
	return b, nil
}

// engineFile, in the disk directory, names the engine whose boxes the disks
// are (its ID), written by the first backend over the directory.
const engineFile = ".engine"

// claimDisks checks that the disk directory's disks are this engine's
// boxes', marking them so the first time: a backend pointed at an engine
// on another machine (DOCKER_HOST) must not take this machine's disks for
// orphans of its containers and remove them.
func (b *Backend) claimDisks() error {
	p := filepath.Join(b.disks, engineFile)
	if b.engineID == "" {
		return errors.New("the engine did not say its ID")
	}
	data, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(b.disks, 0o700); err != nil {
			return err
		}
		return os.WriteFile(p, []byte(b.engineID), 0o600)
	}
	if err != nil {
		return err
	}
	if got := strings.TrimSpace(string(data)); got != b.engineID {
		return fmt.Errorf("its disks belong to engine %s, not this one (%s): is DOCKER_HOST an engine on another machine? use --backend docker-remote for it", got, b.engineID)
	}
	return nil
}

// OrphanDiskAge is how old a disk with no container must be for New to
// remove it: far longer than the instant between a Create's disk and its
// container, so that a Create in flight (of another server on this
// engine) keeps its disk.
const OrphanDiskAge = 10 * time.Minute

// sweepOrphanDisks removes the disks (and markers, see mark) in the disk
// directory whose box's container no longer exists and that are older
// than age: a `docker rm -f` behind cellbox's back, or a data directory
// deleted with its boxes asleep, leaves a disk mounted that no server
// would ever reconcile. The containers of every instance are listed, so
// only disks no box on this engine has are removed. (A server's own
// half-made boxes go sooner: List reports them to it.)
func (b *Backend) sweepOrphanDisks(ctx context.Context, age time.Duration) {
	ents, err := os.ReadDir(b.disks)
	if err != nil {
		return
	}
	// The disks old enough first: the engine is asked for its boxes only
	// when there is one (not at every start).
	isOld := map[string]bool{} // every part of the box's old enough
	consider := func(id string, e fs.DirEntry) {
		if backend.ValidID(id) != nil {
			return
		}
		fi, err := e.Info()
		ok, seen := isOld[id]
		isOld[id] = err == nil && time.Since(fi.ModTime()) >= age && (ok || !seen)
	}
	for _, e := range ents {
		// A disk is its image (ID.img) and its mount point (ID); either
		// may be left alone (an image deleted under its mount).
		if id := strings.TrimSuffix(e.Name(), ".img"); id != e.Name() || e.IsDir() {
			consider(id, e)
		}
	}
	marks, _ := os.ReadDir(b.making())
	for _, e := range marks {
		consider(e.Name(), e)
	}
	var old []string
	for id, ok := range isOld {
		if ok {
			old = append(old, id)
		}
	}
	if len(old) == 0 {
		return
	}
	res, err := b.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: client.Filters{}.Add("label", backend.LabelManaged+"=1")})
	if err != nil {
		b.log.Warn("docker backend: list boxes to find orphan disks", "err", err)
		return
	}
	live := map[string]bool{}
	for _, c := range res.Items {
		live[c.Labels[backend.LabelID]] = true
	}
	for _, id := range old {
		if live[id] {
			continue
		}
		if err := b.disk(id).Remove(ctx); err != nil {
			b.log.Warn("docker backend: remove the disk of a box whose container is gone", "box", id, "err", err)
			continue
		}
		b.uids().Release(id)
		b.unmark(id)
		b.log.Warn("docker backend: removed the disk of a box whose container is gone", "box", id)
	}
}

// Capabilities: disks copied whole (Clone), every limit enforced (by the
// engine, the disk by boxdisk), no network but loopback (network mode
// none), on a local engine whose CPU count bounds a box's CPUs.
func (b *Backend) Capabilities() backend.Capabilities {
	return backend.Capabilities{Clone: true, Network: backend.NetworkNamespace, MaxCPUs: b.ncpu,
		Limits: backend.Enforcement{Memory: true, CPU: true, Pids: true, Disk: true}}
}

// Dial connects to box id's agent, on its socket in the box's host dir
// (bound into the container at backend.SocketDir).
func (b *Backend) Dial(ctx context.Context, id string) (net.Conn, error) {
	return b.dialer.Dial(ctx, id)
}

// newEngine connects to a Docker Engine (host: its address, "": DOCKER_HOST
// or the default socket) and negotiates the API version. It fails when no
// engine answers.
func newEngine(ctx context.Context, host string, log *slog.Logger) (*engine, error) {
	clientOpts := []client.Opt{client.FromEnv}
	if host != "" {
		clientOpts = append(clientOpts, client.WithHost(host))
	}
	cli, err := client.New(clientOpts...)
	if err != nil {
		return nil, fmt.Errorf("docker: client: %w", err)
	}
	ping, err := cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true})
	if err != nil {
		cli.Close()
		return nil, fmt.Errorf("docker: engine at %s does not answer: %w", cli.DaemonHost(), err)
	}
	if log == nil {
		log = slog.Default()
	}
	log.Debug("docker backend", "host", cli.DaemonHost(), "api", cli.ClientVersion(), "engine_api", ping.APIVersion)
	e := &engine{cli: cli, log: log, ncpu: runtime.NumCPU()}
	if info, err := cli.Info(ctx, client.InfoOptions{}); err == nil {
		if info.Info.NCPU > 0 {
			e.ncpu = info.Info.NCPU
		}
		e.engineID = info.Info.ID
	}
	return e, nil
}

// Close releases the client's connections.
func (e *engine) Close() error { return e.cli.Close() }

// Name is "docker".
func (e *engine) Name() string { return "docker" }

// Create makes the container (not started). See the package doc for what
// it gets.
func (b *Backend) Create(ctx context.Context, spec backend.Spec) (backend.Info, error) {
	return b.create(ctx, spec, func(d boxdisk.Disk, uid int) error {
		return d.Make(ctx, spec.Limits.Defaults().DiskBytes, uid, uid)
	})
}

// Clone makes boxes specs with copies of box src's disk
// (backend.Cloner). The copies' files are given to each new box's own
// host uid.
func (b *Backend) Clone(ctx context.Context, src string, specs []backend.Spec) ([]backend.Info, error) {
	c, err := b.container(ctx, src)
	if err != nil {
		return nil, fmt.Errorf("clone box %s: %w", src, err)
	}
	from, err := strconv.Atoi(c.Config.Labels[labelUID])
	if err != nil {
		return nil, fmt.Errorf("clone box %s: it has no host uid of its own (made by an older cellbox): %w", src, errors.ErrUnsupported)
	}
	return backend.CloneAll(ctx, b, b.disk(src), b.disks, specs, func(spec backend.Spec, image string) (backend.Info, error) {
		return b.create(ctx, spec, func(d boxdisk.Disk, uid int) error {
			if err := d.Adopt(ctx, image); err != nil {
				return err
			}
			return boxdisk.Rechown(d.Dir, map[int]int{from: uid})
		})
	})
}

// create makes a box whose disk makeDisk makes.
func (b *Backend) create(ctx context.Context, spec backend.Spec, makeDisk func(d boxdisk.Disk, uid int) error) (backend.Info, error) {
	if err := spec.Validate(b.Capabilities()); err != nil {
		return backend.Info{}, err
	}
	ref := spec.ImageOrDefault()
	// Mounts, not Binds: the engine refuses a missing source instead of
	// making an empty directory there.
	mounts := []mount.Mount{
		{Type: mount.TypeBind, Source: spec.AgentBinary, Target: backend.AgentPath, ReadOnly: true},
		{Type: mount.TypeBind, Source: spec.HostDir, Target: backend.SocketDir},
	}
	if ref == backend.DefaultImage {
		if err := b.ensureHostImage(ctx); err != nil {
			return backend.Info{}, err
		}
		ref = HostImage
		for _, p := range hostBinds {
			if _, err := os.Stat(p); err == nil {
				mounts = append(mounts, mount.Mount{Type: mount.TypeBind, Source: p, Target: p, ReadOnly: true})
			}
		}
	}
	passwd, group, err := b.accounts(ctx, ref)
	if err != nil {
		return backend.Info{}, fmt.Errorf("create box %s: %w", spec.ID, err)
	}
	// Until its container exists, a marker names the box with its labels:
	// a Create cut short at any step (the process killed) leaves a box
	// List reports and Remove deletes, uid, disk and all.
	if err := b.mark(spec); err != nil {
		return backend.Info{}, fmt.Errorf("create box %s: %w", spec.ID, err)
	}
	crashpoint.Hit("docker.marked", spec.ID)
	made := false
	defer func() {
		if !made {
			b.unmark(spec.ID)
		}
	}()
	// The box user is a host uid of the box's own (see the package doc).
	uid, err := b.uids().Alloc(spec.ID)
	if err != nil {
		return backend.Info{}, fmt.Errorf("create box %s: %w", spec.ID, err)
	}
	defer func() {
		if !made {
			b.uids().Free(spec.ID, uid)
		}
	}()
	crashpoint.Hit("docker.uid", spec.ID)
	// The agent runs as the box user and makes its socket in HostDir.
	if err := os.Lchown(spec.HostDir, uid, uid); err != nil {
		return backend.Info{}, fmt.Errorf("create box %s: give host dir to the box user: %w", spec.ID, err)
	}
	disk := b.disk(spec.ID)
	if err := makeDisk(disk, uid); errors.Is(err, fs.ErrExist) {
		return backend.Info{}, fmt.Errorf("create box %s: %w", spec.ID, backend.ErrExists)
	} else if err != nil {
		return backend.Info{}, fmt.Errorf("create box %s: %w", spec.ID, err)
	}
	etc := filepath.Join(disk.Dir, "etc") // on the disk, out of the box's reach
	err = os.MkdirAll(etc, 0o755)         // a clone's disk has its source's: rewritten
	if err == nil {
		err = os.WriteFile(filepath.Join(etc, "passwd"), withBoxUser(passwd, uid, true), 0o644)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(etc, "group"), withBoxUser(group, uid, false), 0o644)
	}
	if err != nil {
		_ = disk.Remove(context.WithoutCancel(ctx))
		return backend.Info{}, fmt.Errorf("create box %s: accounts: %w", spec.ID, err)
	}
	crashpoint.Hit("docker.disk", spec.ID)
	// The root filesystem is read-only; the box writes to its own disk.
	mounts = append(mounts,
		mount.Mount{Type: mount.TypeBind, Source: disk.Workspace(), Target: backend.Workspace},
		mount.Mount{Type: mount.TypeBind, Source: disk.Tmp(), Target: "/tmp"},
		mount.Mount{Type: mount.TypeBind, Source: filepath.Join(etc, "passwd"), Target: "/etc/passwd", ReadOnly: true},
		mount.Mount{Type: mount.TypeBind, Source: filepath.Join(etc, "group"), Target: "/etc/group", ReadOnly: true})

	labels := spec.BoxLabels()
	labels[labelImage] = spec.ImageOrDefault()
	labels[labelUID] = strconv.Itoa(uid)
	opts := boxContainer(spec, ref, labels, fmt.Sprintf("%d:%d", uid, uid), mounts)
	_, err = b.cli.ContainerCreate(ctx, opts)
	if cerrdefs.IsNotFound(err) && ref == HostImage {
		// Removed behind our back since it was last seen: again.
		b.hostImage.Store(false)
		if err = b.ensureHostImage(ctx); err == nil {
			_, err = b.cli.ContainerCreate(ctx, opts)
		}
	}
	if err != nil {
		_ = disk.Remove(context.WithoutCancel(ctx))
	}
	switch {
	case cerrdefs.IsConflict(err):
		return backend.Info{}, fmt.Errorf("create box %s: %w", spec.ID, backend.ErrExists)
	case cerrdefs.IsNotFound(err):
		hint := "load it into the engine"
		if name, ok := strings.CutPrefix(strings.TrimSuffix(ref, ":latest"), image.Ref("")); ok && !strings.Contains(name, ":") {
			if other := image.Unbuildable(name); other != "" {
				hint = other + "; load " + ref + " into the engine"
			} else {
				hint = "build it: `cellbox image build " + name + "`" // Docker's images are the engine's: no --images
			}
		}
		return backend.Info{}, fmt.Errorf("create box %s: image %s not found (%s): %w: %w", spec.ID, ref, hint, backend.ErrNoImage, err)
	case err != nil:
		return backend.Info{}, fmt.Errorf("create box %s: %w", spec.ID, err)
	}
	made = true
	b.dialer.Remember(spec.ID, spec.HostDir)
	crashpoint.Hit("docker.container", spec.ID)
	b.unmark(spec.ID) // the container has the labels now
	return b.Inspect(ctx, spec.ID)
}

// boxContainer is the container of box spec, on either engine: image ref,
// the agent as PID 1 run as user, a read-only root with mounts, no
// capabilities, no-new-privileges, the seccomp profile, no network but
// loopback unless Spec.Network, and the limits.
func boxContainer(spec backend.Spec, ref string, labels map[string]string, user string, mounts []mount.Mount) client.ContainerCreateOptions {
	lim := spec.Limits.Defaults()
	pids := lim.Pids
	env := make([]string, 0, len(backend.BoxEnv)+len(spec.Env))
	for k, v := range backend.BoxEnv {
		if _, over := spec.Env[k]; !over {
			env = append(env, k+"="+v)
		}
	}
	for k, v := range spec.Env {
		env = append(env, k+"="+v)
	}
	network := container.NetworkMode("none")
	if spec.Network {
		network = "bridge"
	}
	noInit := false
	timeout := stopTimeout
	return client.ContainerCreateOptions{
		Name: spec.ID,
		Config: &container.Config{
			Image:       ref,
			Cmd:         spec.AgentCommand(),
			Env:         env,
			Labels:      labels,
			WorkingDir:  backend.Workspace,
			User:        user,
			Hostname:    "box",
			StopTimeout: &timeout,
		},
		HostConfig: &container.HostConfig{
			Mounts:         mounts,
			ReadonlyRootfs: true,
			NetworkMode:    network,
			CapDrop:        []string{"ALL"},
			// The same calls refused as in bubblewrap boxes (package seccomp).
			SecurityOpt: []string{"no-new-privileges", "seccomp=" + seccomp.DockerProfile()},
			Init:        &noInit,
			Resources: container.Resources{
				Memory:     lim.MemoryBytes,
				MemorySwap: lim.MemoryBytes,
				NanoCPUs:   int64(lim.CPUs * 1e9),
				PidsLimit:  &pids,
			},
		},
	}
}

// making is the directory of the markers of boxes being made: a name no
// box id can have, so no disk clashes with it.
func (b *Backend) making() string { return filepath.Join(b.disks, ".making") }

// marker is what a marker holds.
type marker struct {
	Labels map[string]string `json:"labels"`
}

// mark writes box spec's marker; one that exists (an id in use) is
// backend.ErrExists.
func (b *Backend) mark(spec backend.Spec) error {
	if err := os.MkdirAll(b.making(), 0o700); err != nil {
		return err
	}
	data, _ := json.Marshal(marker{Labels: spec.BoxLabels()})
	f, err := os.OpenFile(filepath.Join(b.making(), spec.ID), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("a box of this id is being made, or its making was cut short: %w", backend.ErrExists)
	} else if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

func (b *Backend) unmark(id string) { _ = os.Remove(filepath.Join(b.making(), id)) }

// halfMade lists the boxes whose Create was cut short (a marker and no
// container) and whose labels include every given label.
func (b *Backend) halfMade(labels map[string]string, containers map[string]bool) []backend.Info {
	ents, err := os.ReadDir(b.making())
	if err != nil {
		return nil
	}
	var out []backend.Info
	for _, e := range ents {
		id := e.Name()
		if containers[id] || backend.ValidID(id) != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join(b.making(), id))
		var m marker
		if err != nil || json.Unmarshal(data, &m) != nil {
			continue // being written, or not ours to judge: sweepOrphanDisks ages it out
		}
		if !backend.MatchLabels(m.Labels, labels) {
			continue
		}
		in := backend.Info{ID: id, Labels: m.Labels, State: backend.StateCreated,
			Exit: "its making was cut short (the server stopped half-way); remove it"}
		if fi, err := e.Info(); err == nil {
			in.Created = fi.ModTime()
		}
		out = append(out, in)
	}
	return out
}

// uids is the block of host uids of Docker boxes, reserved under DiskDir.
func (b *Backend) uids() boxuid.Range {
	r := boxuid.Docker
	r.Dir = filepath.Join(b.disks, ".uids")
	return r
}

// accounts returns the /etc/passwd and /etc/group of image ref, read once
// per image from a container made (not started) for the purpose.
func (e *engine) accounts(ctx context.Context, ref string) (passwd, group []byte, err error) {
	if ref == HostImage {
		return []byte(image.BoxEtc["passwd"]), []byte(image.BoxEtc["group"]), nil
	}
	img, err := e.cli.ImageInspect(ctx, ref)
	if err != nil {
		return nil, nil, nil // ContainerCreate says what is wrong with the image
	}
	e.accountsMu.Lock()
	defer e.accountsMu.Unlock()
	if a, ok := e.accountsOf[img.ID]; ok {
		return a[0], a[1], nil
	}
	c, err := e.cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config:     &container.Config{Image: img.ID, Cmd: []string{"/nonexistent"}, Labels: map[string]string{"cellbox.accounts": "1"}},
		HostConfig: &container.HostConfig{NetworkMode: "none"},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read the accounts of image %s: %w", ref, err)
	}
	defer e.cli.ContainerRemove(context.WithoutCancel(ctx), c.ID, client.ContainerRemoveOptions{Force: true})
	var a [2][]byte
	for i, p := range []string{"/etc/passwd", "/etc/group"} {
		if a[i], err = e.copyFile(ctx, c.ID, p); err != nil {
			return nil, nil, fmt.Errorf("read the accounts of image %s: %w", ref, err)
		}
	}
	if e.accountsOf == nil {
		e.accountsOf = map[string][2][]byte{}
	}
	e.accountsOf[img.ID] = a
	return a[0], a[1], nil
}

// copyFile reads one file (at most 1 MiB) of a container; a missing file
// is empty.
func (e *engine) copyFile(ctx context.Context, id, path string) ([]byte, error) {
	res, err := e.cli.CopyFromContainer(ctx, id, client.CopyFromContainerOptions{SourcePath: path})
	if cerrdefs.IsNotFound(err) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	defer res.Content.Close()
	tr := tar.NewReader(res.Content)
	if _, err := tr.Next(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return io.ReadAll(io.LimitReader(tr, 1<<20))
}

// withBoxUser returns an account file (passwd, or group) whose box user
// (backend.BoxUser) has uid, home backend.Workspace.
func withBoxUser(file []byte, uid int, passwd bool) []byte {
	var out bytes.Buffer
	for _, line := range strings.SplitAfter(string(file), "\n") {
		if line == "" || strings.HasPrefix(line, backend.BoxUser+":") {
			continue
		}
		out.WriteString(line)
		if !strings.HasSuffix(line, "\n") {
			out.WriteByte('\n')
		}
	}
	if passwd {
		fmt.Fprintf(&out, "%s:x:%d:%d:%s:%s:/bin/bash\n", backend.BoxUser, uid, uid, backend.BoxUser, backend.Workspace)
	} else {
		fmt.Fprintf(&out, "%s:x:%d:\n", backend.BoxUser, uid)
	}
	return out.Bytes()
}

// disk is the box's disk (see boxdisk).
func (b *Backend) disk(id string) boxdisk.Disk {
	return boxdisk.Disk{File: filepath.Join(b.disks, id+".img"), Dir: filepath.Join(b.disks, id), Templates: boxdisk.SharedTemplates()}
}

// Start starts the container; the agent is PID 1.
func (b *Backend) Start(ctx context.Context, id string) (backend.Info, error) {
	c, err := b.container(ctx, id)
	if err != nil {
		return backend.Info{}, err
	}
	// The agent, as the box user, makes its socket in the host dir, which
	// the caller may have made anew since Create (backend.Spec.HostDir).
	// A box of an older cellbox has no uid label and needs no chown: its
	// host dir is the one Create gave it.
	if uid, err := strconv.Atoi(c.Config.Labels[labelUID]); err == nil {
		if dir := hostDirOf(c.Mounts); dir != "" {
			if err := os.Lchown(dir, uid, uid); err != nil {
				return backend.Info{}, fmt.Errorf("start box %s: host dir: %w", id, err)
			}
		}
	}
	// Stop unmounted the disk (a reboot too). A box made before boxes had
	// disks has none and needs none: Mount says so with fs.ErrNotExist.
	if err := b.disk(id).Mount(ctx); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return backend.Info{}, fmt.Errorf("start box %s: %w", id, err)
	}
	if _, err := b.cli.ContainerStart(ctx, id, client.ContainerStartOptions{}); err != nil && !cerrdefs.IsNotModified(err) {
		return backend.Info{}, fmt.Errorf("start box %s: %w", id, notFound(err))
	}
	return b.Inspect(ctx, id)
}

// Stop stops the container (SIGTERM, SIGKILL after 2 s); its filesystem,
// and so the workspace, is kept.
func (b *Backend) Stop(ctx context.Context, id string) error {
	if err := b.stop(ctx, id); err != nil {
		return err
	}
	if err := b.disk(id).Unmount(ctx); err != nil { // Start mounts it again
		return fmt.Errorf("stop box %s: %w", id, err)
	}
	return nil
}

// stop stops box id's container (SIGTERM, SIGKILL after stopTimeout).
func (e *engine) stop(ctx context.Context, id string) error {
	if _, err := e.container(ctx, id); err != nil {
		return err
	}
	timeout := stopTimeout
	if _, err := e.cli.ContainerStop(ctx, id, client.ContainerStopOptions{Timeout: &timeout}); err != nil && !cerrdefs.IsNotModified(err) {
		return fmt.Errorf("stop box %s: %w", id, notFound(err))
	}
	return nil
}

// Remove kills and deletes the container and its disk. A missing box is
// not an error.
func (b *Backend) Remove(ctx context.Context, id string) error {
	if backend.ValidID(id) != nil {
		return nil
	}
	if c, err := b.container(ctx, id); err == nil {
		_, err := b.cli.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
		if err != nil && !cerrdefs.IsNotFound(err) {
			return fmt.Errorf("remove box %s: %w", id, err)
		}
		if uid, err := strconv.Atoi(c.Config.Labels[labelUID]); err == nil {
			defer b.uids().Free(id, uid) // once the disk, its files, are gone
		}
	} else if !errors.Is(err, backend.ErrNotFound) {
		return err
	}
	// Also when the container is gone: a Create killed half-way leaves a
	// disk, its uid reserved and its marker.
	if err := b.disk(id).Remove(ctx); err != nil {
		return fmt.Errorf("remove box %s: %w", id, err)
	}
	b.uids().Release(id)
	b.unmark(id)
	b.dialer.Forget(id)
	return nil
}

// Inspect reports a box. Containers without the cellbox labels are not
// boxes (ErrNotFound), even when the name matches.
func (e *engine) Inspect(ctx context.Context, id string) (backend.Info, error) {
	c, err := e.container(ctx, id)
	if err != nil {
		return backend.Info{}, err
	}
	created, _ := time.Parse(time.RFC3339Nano, c.Created)
	var status container.ContainerState
	if c.State != nil {
		status = c.State.Status
	}
	in := info(c.Config.Labels, status, created, c.Mounts)
	if c.State != nil && in.State == backend.StateStopped {
		in.Exit = e.exitReason(ctx, id, c.State)
	}
	return in, nil
}

// container inspects box id's container, without working out why it
// stopped (Inspect does; Start, Stop and Remove only need it to exist).
func (e *engine) container(ctx context.Context, id string) (container.InspectResponse, error) {
	res, err := e.cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
	if err != nil {
		return container.InspectResponse{}, fmt.Errorf("inspect box %s: %w", id, notFound(err))
	}
	c := res.Container
	if c.Config == nil || c.Config.Labels[backend.LabelManaged] != "1" || c.Config.Labels[backend.LabelID] != id {
		return container.InspectResponse{}, fmt.Errorf("inspect box %s: %w", id, backend.ErrNotFound)
	}
	return c, nil
}

// exitReason says why a container stopped: its state and, when its agent
// failed by itself (not killed, not stopped), the end of its log.
func (e *engine) exitReason(ctx context.Context, id string, st *container.State) string {
	why := fmt.Sprintf("container exited with code %d", st.ExitCode)
	if st.OOMKilled {
		why += " (killed by the kernel's OOM killer: out of memory)"
	}
	if st.Error != "" {
		why += ": " + st.Error
	}
	if st.ExitCode == 0 || st.ExitCode == 137 || st.ExitCode == 143 || st.OOMKilled {
		return why
	}
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	logs, err := e.cli.ContainerLogs(lctx, id, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true})
	if err != nil {
		return why
	}
	defer logs.Close()
	var out bytes.Buffer
	_, _ = stdcopy.StdCopy(&out, &out, io.LimitReader(logs, 16<<10))
	if head := backend.ExitSummary(out.String()); head != "" {
		why += ": " + head
	}
	return why
}

// List returns the boxes whose labels include every given label.
func (b *Backend) List(ctx context.Context, labels map[string]string) ([]backend.Info, error) {
	out, err := b.listContainers(ctx, labels)
	if err != nil {
		return nil, err
	}
	containers := map[string]bool{}
	for _, in := range out {
		containers[in.ID] = true
	}
	return append(out, b.halfMade(labels, containers)...), nil
}

// listContainers returns the boxes of the engine's containers whose
// labels include every given label.
func (e *engine) listContainers(ctx context.Context, labels map[string]string) ([]backend.Info, error) {
	f := client.Filters{}.Add("label", backend.LabelManaged+"=1")
	for k, v := range labels {
		f.Add("label", k+"="+v)
	}
	res, err := e.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return nil, fmt.Errorf("list boxes: %w", err)
	}
	out := make([]backend.Info, 0, len(res.Items))
	for _, c := range res.Items {
		out = append(out, info(c.Labels, c.State, time.Unix(c.Created, 0), c.Mounts))
	}
	return out, nil
}

func info(labels map[string]string, status container.ContainerState, created time.Time, mounts []container.MountPoint) backend.Info {
	in := backend.Info{
		ID:      labels[backend.LabelID],
		Labels:  make(map[string]string, len(labels)),
		Image:   labels[labelImage],
		Created: created,
	}
	for k, v := range labels {
		if k != labelImage && k != labelUID {
			in.Labels[k] = v
		}
	}
	switch status {
	case container.StateRunning, container.StatePaused, container.StateRestarting:
		in.State = backend.StateRunning
	case container.StateCreated:
		in.State = backend.StateCreated
	default:
		in.State = backend.StateStopped
	}
	in.HostDir = hostDirOf(mounts)
	return in
}

// hostDirOf is the host directory among a container's mounts: the one at
// backend.SocketDir ("" if none).
func hostDirOf(mounts []container.MountPoint) string {
	for _, m := range mounts {
		if m.Destination == backend.SocketDir {
			return m.Source
		}
	}
	return ""
}

// notFound maps the engine's not-found to backend.ErrNotFound.
func notFound(err error) error {
	if cerrdefs.IsNotFound(err) {
		return fmt.Errorf("%w: %w", backend.ErrNotFound, err)
	}
	return err
}

// ensureHostImage imports HostImage from image.SkeletonTar unless the
// engine has it.
//
// Once the engine has it, later creates do not ask again (each asked under
// the lock: a storm of creates queued on it, one engine call at a time); a
// create that finds it gone (docker rmi behind cellbox's back) clears the
// mark, and the next one imports it again.
func (e *engine) ensureHostImage(ctx context.Context) error {
	if e.hostImage.Load() {
		return nil
	}
	e.hostImageMu.Lock()
	defer e.hostImageMu.Unlock()
	if id, err := e.ImageID(ctx, HostImage); err != nil || id != "" {
		e.hostImage.Store(err == nil)
		return err
	}
	var buf bytes.Buffer
	if err := image.SkeletonTar(&buf); err != nil {
		return fmt.Errorf("make %s: %w", HostImage, err)
	}
	id, err := e.ImportImage(ctx, HostImage, &buf)
	if err != nil {
		return err
	}
	e.log.Info("imported box image", "image", HostImage, "id", id)
	e.hostImage.Store(true)
	return nil
}

// ImageID returns the engine's id of an image, "" when it has none.
func (e *engine) ImageID(ctx context.Context, ref string) (string, error) {
	res, err := e.cli.ImageInspect(ctx, ref)
	if cerrdefs.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("inspect image %s: %w", ref, err)
	}
	return res.ID, nil
}

// ImageDigest is the engine's ID of image (backend.ImageDigester), "" for
// one the engine does not have, and for backend.DefaultImage: its boxes
// run the host's own /usr, which no image ID describes.
func (b *Backend) ImageDigest(ctx context.Context, image string) (string, error) {
	if image == backend.DefaultImage {
		return "", nil
	}
	return b.imageDigest(ctx, image)
}

// cachedDigest is an image's ID as the engine said it at a time.
type cachedDigest struct {
	id string
	at time.Time
}

// imageDigest is ImageID, remembered for backend.ImageDigestTTL: the
// engine is asked at most once a second per image (about a millisecond
// over its socket), and a rebuild is seen within that second.
func (e *engine) imageDigest(ctx context.Context, ref string) (string, error) {
	now := time.Now()
	e.digestsMu.Lock()
	c, ok := e.digests[ref]
	e.digestsMu.Unlock()
	if ok && now.Sub(c.at) < backend.ImageDigestTTL && !now.Before(c.at) {
		return c.id, nil
	}
	id, err := e.ImageID(ctx, ref)
	if err != nil {
		return "", err
	}
	e.digestsMu.Lock()
	defer e.digestsMu.Unlock()
	if e.digests == nil || len(e.digests) >= 1024 { // names come and go: start over
		e.digests = map[string]cachedDigest{}
	}
	e.digests[ref] = cachedDigest{id: id, at: now} // as of before the ask
	return id, nil
}

// ImportImage imports a root filesystem tar stream as image ref (like
// `docker import`) and returns the new image's id.
func (e *engine) ImportImage(ctx context.Context, ref string, rootfsTar io.Reader) (string, error) {
	rc, err := e.cli.ImageImport(ctx, client.ImageImportSource{Source: rootfsTar, SourceName: "-"}, ref, client.ImageImportOptions{
		Changes: []string{"WORKDIR " + backend.Workspace, fmt.Sprintf("USER %d:%d", backend.BoxUID, backend.BoxGID)},
	})
	if err != nil {
		return "", fmt.Errorf("import image %s: %w", ref, err)
	}
	defer rc.Close()
	// The engine answers with JSON messages; the last status is the id.
	var id string
	sc := bufio.NewScanner(rc)
	for sc.Scan() {
		var msg struct {
			Status string `json:"status"`
			Error  string `json:"error"`
		}
		if json.Unmarshal(sc.Bytes(), &msg) != nil {
			continue
		}
		if msg.Error != "" {
			return "", fmt.Errorf("import image %s: %s", ref, msg.Error)
		}
		if msg.Status != "" {
			id = strings.TrimSpace(msg.Status)
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("import image %s: %w", ref, err)
	}
	return id, nil
}
