package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/backend"
)

// Remote is the Backend of boxes on a Docker Engine on another machine
// (DOCKER_HOST over TCP with TLS, a socket forwarded over SSH, or any
// engine whose files are not this machine's): nothing is shared with it
// but its API.
//
//   - The agent goes into the engine as an image of its own,
//     cellbox/agent:DIGEST (the binary alone, imported), copied into a
//     named volume cellbox-agent-DIGEST that every box mounts read-only
//     at backend.AgentPath's directory.
//   - The agent listens on an abstract unix socket of the box;
//     Dial reaches it through an exec stream of the engine (`cellbox agent
//     --connect`, which carries one connection over its stdin and stdout).
//     Reaching the engine's API is what it takes to drive an agent.
//   - /workspace and /tmp are anonymous volumes of the box (kept across
//     Stop, removed with the box; each starts as the image's directory,
//     /workspace owned by backend.BoxUID, /tmp 1777).
//   - backend.DefaultImage, the host's /usr on this machine, cannot be
//     had there: it names RemoteOptions.DefaultImage, an image the engine
//     must hold (`cellbox image build base`, then `docker save` and `docker
//     load` into the engine).
//
// What it does not do (Capabilities): copy disks whole (fork goes through
// the agents), cap /workspace's size (a volume of the engine's disk), give
// each box a host uid of its own (every box runs as backend.BoxUID:
// namespaces keep boxes apart, not uids), or serve a box's network allow
// list (the egress proxy listens on this machine).
type Remote struct {
	*engine
	defaultImage string

	agentMu sync.Mutex
	agents  map[string]bool // agent volumes known to exist
}

var (
	_ backend.Backend       = (*Remote)(nil)
	_ backend.ImageDigester = (*Remote)(nil)
)

// RemoteOptions configure NewRemote.
type RemoteOptions struct {
	// Host is the engine's address (tcp://host:2376, or unix:///path: a
	// socket forwarded from the other machine with ssh -L; the client
	// speaks no ssh:// itself); empty: DOCKER_HOST (with
	// DOCKER_TLS_VERIFY and DOCKER_CERT_PATH, as the docker CLI reads
	// them).
	Host string
	// DefaultImage is the image a box of backend.DefaultImage gets on the
	// engine. Default DefaultRemoteImage.
	DefaultImage string
	Logger       *slog.Logger
}

// DefaultRemoteImage is RemoteOptions.DefaultImage's default.
const DefaultRemoteImage = "cellbox/base"

// NewRemote connects to a Docker Engine on another machine.
func NewRemote(ctx context.Context, opts RemoteOptions) (*Remote, error) {
	e, err := newEngine(ctx, opts.Host, opts.Logger)
	if err != nil {
		return nil, err
	}
	r := &Remote{engine: e, defaultImage: opts.DefaultImage, agents: map[string]bool{}}
	if r.defaultImage == "" {
		r.defaultImage = DefaultRemoteImage
	}
	for _, w := range r.Capabilities().Limits.Warnings {
		e.log.Warn("docker remote backend: limit not enforced", "detail", w)
	}
	return r, nil
}

// Name is "docker-remote".
func (r *Remote) Name() string { return "docker-remote" }

// Capabilities: a remote engine's boxes, limits but the disk enforced.
func (r *Remote) Capabilities() backend.Capabilities {
	return backend.Capabilities{Remote: true, Network: backend.NetworkNamespace, MaxCPUs: r.ncpu,
		Limits: backend.Enforcement{Memory: true, CPU: true, Pids: true, Warnings: []string{
			"disk: on a remote engine /workspace and /tmp are volumes of the engine's disk, with no cap of their own",
		}}}
}

// Create makes the box's container (not started).
func (r *Remote) Create(ctx context.Context, spec backend.Spec) (backend.Info, error) {
	if err := spec.Validate(r.Capabilities()); err != nil {
		return backend.Info{}, err
	}
	agentVol, err := r.agentVolume(ctx, spec.AgentBinary)
	if err != nil {
		return backend.Info{}, fmt.Errorf("create box %s: %w", spec.ID, err)
	}
	ref := spec.ImageOrDefault()
	if ref == backend.DefaultImage {
		ref = r.defaultImage
	}
	mounts := []mount.Mount{
		{Type: mount.TypeVolume, Source: agentVol, Target: agentDir, ReadOnly: true},
		{Type: mount.TypeVolume, Target: backend.Workspace},
		{Type: mount.TypeVolume, Target: "/tmp"},
	}
	labels := spec.BoxLabels()
	labels[labelImage] = spec.ImageOrDefault()
	opts := boxContainer(spec, ref, labels, fmt.Sprintf("%d:%d", backend.BoxUID, backend.BoxGID), mounts)
	opts.Config.Cmd = append(opts.Config.Cmd, "--socket", remoteSocket)
	_, err = r.cli.ContainerCreate(ctx, opts)
	switch {
	case cerrdefs.IsConflict(err):
		return backend.Info{}, fmt.Errorf("create box %s: %w", spec.ID, backend.ErrExists)
	case cerrdefs.IsNotFound(err):
		return backend.Info{}, fmt.Errorf("create box %s: image %s is not on the engine at %s (build it with `cellbox image build`, then `docker save` it and `docker load` it there): %w: %w",
			spec.ID, ref, r.cli.DaemonHost(), backend.ErrNoImage, err)
	case err != nil:
		return backend.Info{}, fmt.Errorf("create box %s: %w", spec.ID, err)
	}
	return r.Inspect(ctx, spec.ID)
}

// ImageDigest is the engine's ID of image (backend.ImageDigester), "" for
// one the engine does not have; backend.DefaultImage is
// RemoteOptions.DefaultImage's.
func (r *Remote) ImageDigest(ctx context.Context, image string) (string, error) {
	if image == backend.DefaultImage {
		image = r.defaultImage
	}
	return r.imageDigest(ctx, image)
}

// remoteSocket is where a remote box's agent listens: an abstract unix
// socket of the box's network namespace. No file: a tmpfs for one would
// not do, since the engine copies the owner and mode of the directory
// under a tmpfs mount into it (an image's, or the container's own after
// its first start: root, 0755), whatever mode the mount asks, and the
// agent, the box user, could not bind there.
const remoteSocket = "@cellbox-agent"

// agentDir is where the agent's volume is mounted: backend.AgentPath's
// directory.
var agentDir = backend.AgentPath[:strings.LastIndexByte(backend.AgentPath, '/')]

// agentVolume returns the engine's volume holding the agent binary at
// path, making it on first use: the binary is imported as an image of its
// own, and a container made of that image with the named volume mounted
// over its agent directory has the engine copy the binary into the
// (new, empty) volume in the one create call, so a process killed half way
// leaves no empty volume behind.
func (r *Remote) agentVolume(ctx context.Context, path string) (string, error) {
	ref, err := backend.AgentImage(path)
	if err != nil {
		return "", err
	}
	vol := "cellbox-agent-" + strings.TrimPrefix(ref, backend.AgentImagePrefix)
	r.agentMu.Lock()
	defer r.agentMu.Unlock()
	if r.agents[vol] {
		return vol, nil
	}
	if _, err := r.cli.VolumeInspect(ctx, vol, client.VolumeInspectOptions{}); err == nil {
		r.agents[vol] = true
		return vol, nil
	} else if !cerrdefs.IsNotFound(err) {
		return "", fmt.Errorf("agent volume %s: %w", vol, err)
	}
	if id, err := r.ImageID(ctx, ref); err != nil {
		return "", err
	} else if id == "" {
		bin, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("agent binary: %w", err)
		}
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range []*tar.Header{
			{Name: strings.TrimPrefix(agentDir, "/") + "/", Typeflag: tar.TypeDir, Mode: 0o755},
			{Name: strings.TrimPrefix(backend.AgentPath, "/"), Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bin))},
		} {
			h.ModTime = time.Unix(0, 0)
			if err := tw.WriteHeader(h); err != nil {
				return "", err
			}
		}
		tw.Write(bin)
		if err := tw.Close(); err != nil {
			return "", err
		}
		if _, err := r.ImportImage(ctx, ref, &buf); err != nil {
			return "", fmt.Errorf("agent image: %w", err)
		}
	}
	c, err := r.cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config: &container.Config{Image: ref, Cmd: []string{backend.AgentPath, "version"}},
		HostConfig: &container.HostConfig{NetworkMode: "none",
			Mounts: []mount.Mount{{Type: mount.TypeVolume, Source: vol, Target: agentDir}}},
	})
	if err != nil {
		return "", fmt.Errorf("agent volume %s: %w", vol, err)
	}
	if _, err := r.cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true}); err != nil {
		r.log.Warn("docker remote: remove the container that filled the agent volume", "volume", vol, "err", err)
	}
	r.agents[vol] = true
	return vol, nil
}

// Start starts the box's container; the agent is PID 1.
func (r *Remote) Start(ctx context.Context, id string) (backend.Info, error) {
	if _, err := r.container(ctx, id); err != nil {
		return backend.Info{}, err
	}
	if _, err := r.cli.ContainerStart(ctx, id, client.ContainerStartOptions{}); err != nil && !cerrdefs.IsNotModified(err) {
		return backend.Info{}, fmt.Errorf("start box %s: %w", id, notFound(err))
	}
	return r.Inspect(ctx, id)
}

// Stop stops the box's container; its /workspace volume is kept.
func (r *Remote) Stop(ctx context.Context, id string) error { return r.stop(ctx, id) }

// Remove deletes the box's container with its /workspace volume. A
// missing box is not an error.
func (r *Remote) Remove(ctx context.Context, id string) error {
	if backend.ValidID(id) != nil {
		return nil
	}
	if _, err := r.container(ctx, id); errors.Is(err, backend.ErrNotFound) {
		return nil
	} else if err != nil {
		return err
	}
	_, err := r.cli.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	if err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("remove box %s: %w", id, err)
	}
	return nil
}

// List returns the boxes whose labels include every given label.
func (r *Remote) List(ctx context.Context, labels map[string]string) ([]backend.Info, error) {
	return r.listContainers(ctx, labels)
}

// Dial connects to box id's agent through an exec stream of the engine:
// `cellbox agent --connect` in the box carries the connection to the
// agent's socket over its stdin and stdout, and says it is connected
// (agent.PipeReady) before anything is sent.
func (r *Remote) Dial(ctx context.Context, id string) (net.Conn, error) {
	ex, err := r.cli.ExecCreate(ctx, id, client.ExecCreateOptions{
		Cmd:         []string{backend.AgentPath, "agent", "--connect", "--socket", remoteSocket},
		User:        fmt.Sprintf("%d:%d", backend.BoxUID, backend.BoxGID),
		AttachStdin: true, AttachStdout: true,
	})
	switch {
	case cerrdefs.IsNotFound(err):
		return nil, fmt.Errorf("dial box %s: %w", id, backend.ErrNotFound)
	case cerrdefs.IsConflict(err): // the container does not run
		return nil, fmt.Errorf("dial box %s: %w: %w", id, backend.ErrNotReady, err)
	case err != nil:
		return nil, fmt.Errorf("dial box %s: %w: %w", id, backend.ErrNotReady, err)
	}
	att, err := r.cli.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{})
	if err != nil {
		return nil, fmt.Errorf("dial box %s: %w: %w", id, backend.ErrNotReady, err)
	}
	conn := &execConn{hr: att.HijackedResponse}
	ready := make([]byte, 1)
	done := make(chan struct{})
	go func() { // the wait for the pipe's first byte ends with ctx
		select {
		case <-ctx.Done():
			conn.Close()
		case <-done:
		}
	}()
	_, err = io.ReadFull(conn, ready)
	close(done)
	if err != nil || ready[0] != agent.PipeReady {
		conn.Close()
		if err == nil {
			err = fmt.Errorf("the pipe said %q, not that it is connected", ready)
		}
		return nil, fmt.Errorf("dial box %s: the agent does not listen yet: %w: %w", id, backend.ErrNotReady, err)
	}
	return conn, nil
}

// execConn is an exec stream as a net.Conn: writes go to the process's
// stdin; reads come from its stdout, out of the engine's multiplexed
// frames (8-byte headers: stream, 0, 0, 0, length; stderr is not asked).
type execConn struct {
	hr   client.HijackedResponse
	left int // bytes of the current frame not yet read
}

func (c *execConn) Read(p []byte) (int, error) {
	for c.left == 0 {
		var h [8]byte
		if _, err := io.ReadFull(c.hr.Reader, h[:]); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				err = io.EOF
			}
			return 0, err
		}
		c.left = int(binary.BigEndian.Uint32(h[4:]))
		if h[0] != 1 { // not stdout: skip it
			if _, err := io.CopyN(io.Discard, c.hr.Reader, int64(c.left)); err != nil {
				return 0, err
			}
			c.left = 0
		}
	}
	n, err := c.hr.Reader.Read(p[:min(len(p), c.left)])
	c.left -= n
	return n, err
}

func (c *execConn) Write(p []byte) (int, error)        { return c.hr.Conn.Write(p) }
func (c *execConn) Close() error                       { c.hr.Close(); return nil }
func (c *execConn) CloseWrite() error                  { return c.hr.CloseWrite() }
func (c *execConn) LocalAddr() net.Addr                { return c.hr.Conn.LocalAddr() }
func (c *execConn) RemoteAddr() net.Addr               { return c.hr.Conn.RemoteAddr() }
func (c *execConn) SetDeadline(t time.Time) error      { return c.hr.Conn.SetDeadline(t) }
func (c *execConn) SetReadDeadline(t time.Time) error  { return c.hr.Conn.SetReadDeadline(t) }
func (c *execConn) SetWriteDeadline(t time.Time) error { return c.hr.Conn.SetWriteDeadline(t) }
