package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/docker"
	"github.com/cellbox/cellbox/sandbox/httpapi"
	"github.com/cellbox/cellbox/sandbox/kube"
	"github.com/cellbox/cellbox/sandboxclient"
	"github.com/cellbox/cellbox/server"
	"github.com/cellbox/cellbox/server/cluster"
)

// Targets of the boxes bench (issue 2), and its sizes and time limits.
const (
	targetWarmShell   = 5 * time.Millisecond
	targetWarmCreate  = 30 * time.Millisecond
	targetFork        = 200 * time.Millisecond
	benchForkFiles    = 1000
	benchForkCount    = 10
	benchFileSize     = 1 << 20
	benchPoolSize     = 2
	benchPoolWait     = 2 * time.Minute
	benchCleanupLimit = 2 * time.Minute
)

// boxesOptions are the flags of `cellbox bench boxes`.
type boxesOptions struct {
	benchCommon
	data    string
	treeMiB int
	storm   int      // boxes of the storm, one per session
	only    []string // the groups of rows to measure (benchBoxGroups); nil: all
}

// benchBoxGroups are the groups of rows `cellbox bench boxes --only` picks.
var benchBoxGroups = []string{"create", "shell", "files", "code", "transfer", "fork", "wake", "storm"}

// want reports whether the group of rows is measured.
func (o boxesOptions) want(group string) bool { return o.only == nil || slices.Contains(o.only, group) }

func benchBoxesCmd(ctx context.Context, args []string) (*benchReport, bool, error) {
	fs := flag.NewFlagSet("bench boxes", flag.ContinueOnError)
	var o boxesOptions
	o.flags(fs, 50, "iterations of each measurement (creates at most 20, the tree transfer n/10 between 1 and 5)", 20*time.Second,
		"box backend to measure: docker, local (bubblewrap), both, or kubernetes (the cluster of $KUBECONFIG; docs/kubernetes.md)", "static cellbox binary run as the agent in every box (default: cellbox beside this executable)", false)
	fs.StringVar(&o.data, "data", "", "directory for the bench's state and boxes (default: a temporary directory, removed at the end)")
	fs.IntVar(&o.treeMiB, "tree-mib", 100, "size of the tree copied between two boxes, in files of 1 MiB")
	fs.IntVar(&o.storm, "storm", 100, "boxes of the storm row: as many sessions each make one box at once")
	only := fs.String("only", "", "comma-separated groups of rows to measure, of "+strings.Join(benchBoxGroups, ", ")+" (default: all)")
	check := func() error {
		if *only != "" {
			o.only = strings.Split(*only, ",")
			for _, g := range o.only {
				if !slices.Contains(benchBoxGroups, g) {
					return fmt.Errorf("--only %s: no group %q; groups: %s", *only, g, strings.Join(benchBoxGroups, ", "))
				}
			}
		}
		if err := positive("storm", o.storm); err != nil {
			return err
		}
		return positive("tree-mib", o.treeMiB)
	}
	o.allowKube = true
	if err := o.parse(fs, args, check); err != nil {
		return nil, false, err
	}
	rep, err := benchBoxes(ctx, o)
	return rep, o.asJSON, err
}

// benchBoxes measures each backend of o in turn.
func benchBoxes(ctx context.Context, o boxesOptions) (rep *benchReport, err error) {
	root := o.data
	if root == "" {
		// Short, so that box socket paths under it stay within the limit.
		if root, err = os.MkdirTemp("", "cbb-"); err != nil {
			return nil, err
		}
		defer os.RemoveAll(root)
	}
	if root, err = filepath.Abs(root); err != nil {
		return nil, err
	}
	if o.agentBinary, err = cellboxBinary(o.agentBinary); err != nil {
		return nil, err
	}
	rep = newBenchReport("boxes")
	if o.want("create") {
		rep.note("create → first result: sandbox_create of a new name, then shell `true` in it; from the warm pool the bench waits until the pool (%d boxes) is full before each create. Cold: a service without a pool.", benchPoolSize)
	}
	if o.want("shell") {
		rep.note("warm shell: the shell tool running `true` in a running box, over HTTP on loopback (JSON in, JSON out).")
	}
	if o.want("files") {
		rep.note("1 MiB file: raw bytes through PUT/GET .../files/PATH; write_file takes it in one call, read_file pages it (at most 256 KiB per call); the client decodes each result into its struct (sandboxclient ToolInto).")
	}
	if o.want("fork") {
		rep.note("fork: the fork tool making %d boxes from a box whose workspace holds %d MiB in %d files, then a shell `true` in each (in parallel); the boxes are destroyed between runs, untimed.", benchForkCount, o.treeMiB, benchForkFiles)
	}
	if o.want("code") {
		rep.note("run_code: a Python cell `1 + 1` in a warm code context (its interpreter runs on), and a stateless run_code (an interpreter started, run and ended per call); baseline: the shell tool running `python3 -c 'print(1 + 1)'`.")
	}
	if o.want("storm") {
		rep.note("storm: %d sessions each make a box (sandbox_create, then shell `true` in it) all at once, on a service with no warm pool; the time until the last answers (one sample per round, the boxes destroyed between rounds, untimed). Baseline: %d `docker run --rm … true` (or `bwrap … true`) started at once, until the last exits.", o.storm, o.storm)
	}
	if o.want("wake") {
		rep.note("sleep → wake: a box holding a 1 MiB file, made with sleep_after_ms 500, left until sandbox_list says it sleeps, then the first shell `true` on it (its wake, then the call; on Kubernetes a new pod on any node and its workspace written back); baseline: the create baseline of the same run.")
	}
	if o.want("transfer") {
		rep.note("tree transfer: the transfer tool copying a directory of %d files of 1 MiB (random bytes) from one box to another of the session.", o.treeMiB)
	}
	if slices.Contains(o.backends, "docker") {
		rep.note("docker baselines use the docker CLI: `docker run --rm` of the box image (%s with the host's /usr), `docker exec` and `docker cp` on a running box.", docker.HostImage)
	}
	if slices.Contains(o.backends, "kubernetes") {
		rep.note("kubernetes baselines use kubectl ($CELLBOX_KUBECTL, else kubectl) in the box namespace: a pod of the box image created and waited for (`kubectl run`, `kubectl wait --for=condition=Ready`), `kubectl exec` and `kubectl cp` on the box's own pod. agent-sandbox (kubernetes-sigs) publishes ~200 ms to claim a sandbox from its warm pool.")
	}
	if slices.Contains(o.backends, "local") {
		rep.note("local baselines: `bwrap` running /usr/bin/true in fresh namespaces with the host's /usr; host file I/O and `cp -r` of the same bytes with no box.")
	}
	for _, name := range o.backends {
		b := &boxesBench{o: o, rep: rep, name: name, root: root, run: "cbb-" + strconv.FormatInt(time.Now().UnixNano(), 36)}
		err := b.measure(ctx)
		if cerr := b.cleanup(); cerr != nil {
			err = errors.Join(err, cerr)
		}
		if err != nil {
			return rep, fmt.Errorf("bench %s backend: %w", name, err)
		}
	}
	return rep, nil
}

// boxesBench measures one backend.
type boxesBench struct {
	o    boxesOptions
	rep  *benchReport
	name string // docker|local
	root string
	run  string // label value of the baseline containers

	be      backend.Backend
	servers []*benchServer
	content []byte // the 1 MiB file

	createBase string // the create baseline and its p50, once measured
	createP50  time.Duration
}

func (b *boxesBench) measure(ctx context.Context) error {
	be, err := server.OpenBackend(ctx, b.name, b.root, b.o.agentBinary)
	if err != nil {
		return fmt.Errorf("%w (pick the backends to measure with --backend)", err)
	}
	b.be = be
	if b.name == "docker" {
		if err := b.rep.noteDocker(ctx); err != nil {
			return err
		}
	}
	b.content = benchText(benchFileSize)
	var coldSamples, warmSamples []time.Duration // create → first result
	if b.o.want("create") {
		if coldSamples, err = b.coldCreates(ctx); err != nil {
			return err
		}
	}
	srv, err := b.startServer(ctx, "warm", benchPoolSize)
	if err != nil {
		return err
	}
	c := srv.c
	if b.o.want("create") {
		warmSamples, err = benchLoop(ctx, min(b.o.n, 20), b.o.budget, func(i int) (time.Duration, error) {
			if err := waitPool(ctx, srv.url, "", benchPoolSize); err != nil {
				return 0, err
			}
			return createFirstResult(ctx, c, fmt.Sprintf("warm%d", i))
		})
		if err != nil {
			return fmt.Errorf("create from the warm pool: %w", err)
		}
	}

	// A running box for the warm measurements.
	w, err := c.CreateBox(ctx, api.SandboxCreateInput{Sandbox: "w"})
	if err != nil {
		return err
	}
	for range 3 {
		if err := shellTrue(ctx, c, "w"); err != nil {
			return err
		}
	}
	if b.o.want("create") || b.o.want("shell") {
		shellSamples, err := benchLoop(ctx, b.o.n, b.o.budget, func(int) (time.Duration, error) {
			return timed(func() error { return shellTrue(ctx, c, "w") })
		})
		if err != nil {
			return fmt.Errorf("warm shell: %w", err)
		}
		createBase, createP50, shellBase, shellP50, err := b.startBaselines(ctx, w.ID)
		if err != nil {
			return err
		}
		b.createBase, b.createP50 = createBase, createP50
		if b.o.want("create") {
			b.rep.add(b.name, "create → first result, warm pool", warmSamples, createBase, createP50, targetWarmCreate)
			b.rep.add(b.name, "create → first result, cold (no pool)", coldSamples, createBase, createP50, 0)
		}
		if b.o.want("shell") {
			b.rep.add(b.name, "warm `shell` `true`", shellSamples, shellBase, shellP50, targetWarmShell)
		}
	}
	for _, g := range []struct {
		name string
		fn   func() error
	}{
		{"files", func() error { return b.files(ctx, c, w.ID) }},
		{"code", func() error { return b.code(ctx, c) }},
		{"transfer", func() error { return b.transfer(ctx, c) }},
		{"fork", func() error { return b.fork(ctx, c) }},
		{"wake", func() error { return b.wake(ctx, c) }},
		{"storm", func() error { return b.stormRow(ctx) }},
	} {
		if !b.o.want(g.name) {
			continue
		}
		if err := g.fn(); err != nil {
			return err
		}
	}
	return nil
}

// stormRow measures o.storm boxes made at once, one per session, on a
// service with no warm pool, beside as many baseline boxes started at once.
func (b *boxesBench) stormRow(ctx context.Context) error {
	srv, err := b.startServer(ctx, "storm", 0)
	if err != nil {
		return err
	}
	defer b.stopServer(srv)
	clients := make([]*sandboxclient.HTTP, b.o.storm)
	for i := range clients {
		if clients[i], err = sandboxclient.NewSession(ctx, srv.url); err != nil {
			return fmt.Errorf("storm: session %d: %w", i, err)
		}
	}
	// all runs fn(i) for every box at once and returns when the last ends.
	all := func(fn func(i int) error) (time.Duration, error) {
		return timed(func() error {
			errs := make(chan error, b.o.storm)
			for i := range b.o.storm {
				go func() { errs <- fn(i) }()
			}
			var first error
			for range b.o.storm {
				if err := <-errs; err != nil && first == nil {
					first = err
				}
			}
			return first
		})
	}
	iters := max(min(b.o.n/10, 3), 1)
	samples, err := benchLoop(ctx, iters, b.o.budget, func(int) (time.Duration, error) {
		d, err := all(func(i int) error {
			if _, err := clients[i].CreateBox(ctx, api.SandboxCreateInput{Sandbox: "s"}); err != nil {
				return err
			}
			return shellTrue(ctx, clients[i], "s")
		})
		for _, c := range clients { // untimed
			if derr := c.DestroyBox(ctx, "s"); derr != nil && err == nil {
				err = derr
			}
		}
		return d, err
	})
	if err != nil {
		return fmt.Errorf("storm: %w", err)
	}
	argv := append(bwrapArgv(), "--", "/usr/bin/true")
	base := "bwrap … true"
	if b.name == "docker" {
		argv = []string{"docker", "run", "--rm", "--network", "none", "--label", "cellbox.bench=" + b.run, "-v", "/usr:/usr:ro", docker.HostImage, "true"}
		base = "docker run --rm"
	}
	baseSamples, err := benchLoop(ctx, iters, b.o.budget, func(int) (time.Duration, error) {
		return all(func(int) error { return runCmd(ctx, argv...) })
	})
	if err != nil {
		return fmt.Errorf("storm baseline: %w", err)
	}
	p, _, _ := percentiles(baseSamples)
	b.rep.add(b.name, fmt.Sprintf("storm: %d boxes at once (one per session), all answering", b.o.storm), samples, fmt.Sprintf("%d × %s at once", b.o.storm, base), p, 0)
	return nil
}

// coldCreates measures creates → first result on a service with no warm
// pool (stopped after); measure does the warm ones on its own service.
func (b *boxesBench) coldCreates(ctx context.Context) ([]time.Duration, error) {
	cold, err := b.startServer(ctx, "cold", 0)
	if err != nil {
		return nil, err
	}
	samples, err := benchLoop(ctx, min(b.o.n, 20), b.o.budget, func(i int) (time.Duration, error) {
		return createFirstResult(ctx, cold.c, fmt.Sprintf("cold%d", i))
	})
	if err != nil {
		return nil, fmt.Errorf("cold create: %w", err)
	}
	return samples, b.stopServer(cold)
}

// startBaselines measures what a create and a warm exec cost without
// cellbox: docker run --rm and docker exec, or bwrap.
func (b *boxesBench) startBaselines(ctx context.Context, boxID string) (createName string, createP50 time.Duration, execName string, execP50 time.Duration, err error) {
	p50 := func(argv ...string) (time.Duration, error) {
		return b.baselineP50(ctx, func() error { return runCmd(ctx, argv...) })
	}
	if b.name == "local" {
		p, err := p50(append(bwrapArgv(), "--", "/usr/bin/true")...)
		return "bwrap … true", p, "bwrap … true", p, err
	}
	if b.name == "kubernetes" {
		return b.kubeBaselines(ctx, boxID)
	}
	run := []string{"docker", "run", "--rm", "--network", "none", "--label", "cellbox.bench=" + b.run,
		"-v", "/usr:/usr:ro", docker.HostImage, "true"}
	if createP50, err = p50(run...); err != nil {
		return
	}
	execP50, err = p50("docker", "exec", boxID, "true")
	return "docker run --rm", createP50, "docker exec", execP50, err
}

// bwrapArgv is the bwrap baseline's command line up to the command: every
// namespace unshared, the host's /usr read-only, then extra arguments.
func bwrapArgv(extra ...string) []string {
	return append([]string{"bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
		"--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
		"--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"}, extra...)
}

// baselineP50 runs fn once to warm up (and to fail early), then as many
// times as a cellbox measurement, and returns its p50.
func (b *boxesBench) baselineP50(ctx context.Context, fn func() error) (time.Duration, error) {
	if err := fn(); err != nil {
		return 0, err
	}
	s, err := benchLoop(ctx, b.o.n, b.o.budget, func(int) (time.Duration, error) { return timed(fn) })
	p, _, _ := percentiles(s)
	return p, err
}

// files measures reading and writing a 1 MiB file in box w.
func (b *boxesBench) files(ctx context.Context, c *sandboxclient.HTTP, boxID string) error {
	const path = "bench/1m.txt"
	upload, err := benchLoop(ctx, b.o.n, b.o.budget, func(int) (time.Duration, error) {
		return timed(func() error {
			n, err := c.Upload(ctx, "w", path, bytes.NewReader(b.content))
			if err == nil && n != int64(len(b.content)) {
				err = fmt.Errorf("upload %s: wrote %d of %d bytes", path, n, len(b.content))
			}
			return err
		})
	})
	if err != nil {
		return fmt.Errorf("upload 1 MiB: %w", err)
	}
	var buf bytes.Buffer
	download, err := benchLoop(ctx, b.o.n, b.o.budget, func(int) (time.Duration, error) {
		buf.Reset()
		d, err := timed(func() error { _, err := c.Download(ctx, "w", path, &buf); return err })
		if err == nil && !bytes.Equal(buf.Bytes(), b.content) {
			err = fmt.Errorf("download %s: got %d bytes that differ from the %d uploaded", path, buf.Len(), len(b.content))
		}
		return d, err
	})
	if err != nil {
		return fmt.Errorf("download 1 MiB: %w", err)
	}
	content := string(b.content) // the caller's text, made once: not the tool API's work
	write, err := benchLoop(ctx, b.o.n, b.o.budget, func(int) (time.Duration, error) {
		return timed(func() error {
			_, err := c.Tool(ctx, "write_file", api.WriteFileInput{Sandbox: "w", Path: "bench/1m-tool.txt", Content: content})
			return err
		})
	})
	if err != nil {
		return fmt.Errorf("write_file 1 MiB: %w", err)
	}
	calls := 0
	read, err := benchLoop(ctx, b.o.n, b.o.budget, func(int) (time.Duration, error) {
		buf.Reset()
		d, err := timed(func() error {
			n, err := readFilePaged(ctx, c, "w", "bench/1m-tool.txt", &buf)
			calls = n
			return err
		})
		if err == nil && !bytes.Equal(buf.Bytes(), b.content) {
			err = fmt.Errorf("read_file: got %d bytes that differ from the %d written", buf.Len(), len(b.content))
		}
		return d, err
	})
	if err != nil {
		return fmt.Errorf("read_file 1 MiB: %w", err)
	}

	// Baselines: docker cp, or the host's own file I/O.
	var writeBase, readBase string
	var writeP50, readP50 time.Duration
	hostFile := filepath.Join(b.root, "bench-1m.txt")
	if err := os.WriteFile(hostFile, b.content, 0o644); err != nil {
		return err
	}
	defer os.Remove(hostFile)
	measure := func(fn func() error) (time.Duration, error) { return b.baselineP50(ctx, fn) }
	if b.name == "kubernetes" {
		writeBase, readBase = "kubectl cp (host → box)", "kubectl cp (box → host)"
		pod := kubePod(boxID)
		writeP50, err = measure(func() error {
			return runCmd(ctx, kubectl("cp", "-c", "box", hostFile, pod+":"+backend.Workspace+"/bench/cp.txt")...)
		})
		if err == nil {
			readP50, err = measure(func() error {
				return runCmd(ctx, kubectl("cp", "-c", "box", pod+":"+backend.Workspace+"/"+path, hostFile+".out")...)
			})
			os.Remove(hostFile + ".out")
		}
	} else if b.name == "docker" {
		writeBase, readBase = "docker cp (host → box)", "docker cp (box → host)"
		writeP50, err = measure(func() error {
			return runCmd(ctx, "docker", "cp", hostFile, boxID+":"+backend.Workspace+"/bench/cp.txt")
		})
		if err == nil {
			readP50, err = measure(func() error {
				return runCmd(ctx, "docker", "cp", boxID+":"+backend.Workspace+"/"+path, hostFile+".out")
			})
			os.Remove(hostFile + ".out")
		}
	} else {
		writeBase, readBase = "host os.WriteFile (no box)", "host os.ReadFile (no box)"
		out := hostFile + ".out"
		writeP50, err = measure(func() error { return os.WriteFile(out, b.content, 0o644) })
		if err == nil {
			readP50, err = measure(func() error { _, err := os.ReadFile(out); return err })
		}
		os.Remove(out)
	}
	if err != nil {
		return fmt.Errorf("file baselines: %w", err)
	}
	b.rep.add(b.name, "write 1 MiB file (upload endpoint)", upload, writeBase, writeP50, 0)
	b.rep.add(b.name, "read 1 MiB file (download endpoint)", download, readBase, readP50, 0)
	b.rep.add(b.name, "write 1 MiB file (`write_file`)", write, writeBase, writeP50, 0)
	b.rep.add(b.name, fmt.Sprintf("read 1 MiB file (`read_file`, %d calls)", calls), read, readBase, readP50, 0)
	return nil
}

// transfer measures copying a tree of treeMiB files of 1 MiB between two
// boxes with the transfer tool.
func (b *boxesBench) transfer(ctx context.Context, c *sandboxclient.HTTP) error {
	k := b.o.treeMiB
	src, err := c.CreateBox(ctx, api.SandboxCreateInput{Sandbox: "src"})
	if err != nil {
		return err
	}
	dst, err := c.CreateBox(ctx, api.SandboxCreateInput{Sandbox: "dst"})
	if err != nil {
		return err
	}
	mk := fmt.Sprintf("mkdir -p tree && for i in $(seq 1 %d); do head -c 1048576 /dev/urandom > tree/f$i || exit 1; done", k)
	if _, err := shell(ctx, c, "src", mk, 5*time.Minute); err != nil {
		return fmt.Errorf("make the tree to transfer: %w", err)
	}
	size := int64(k) << 20
	iters := max(min(b.o.n/10, 5), 1)
	samples, err := benchLoop(ctx, iters, b.o.budget, func(i int) (time.Duration, error) {
		to := fmt.Sprintf("t%d", i)
		var out api.TransferOutput
		d, err := timed(func() (err error) {
			out, err = callTool[api.TransferOutput](ctx, c, "transfer", api.TransferInput{FromSandbox: "src", FromPath: "tree", ToSandbox: "dst", ToPath: to, Recursive: true})
			return err
		})
		if err != nil {
			return 0, err
		}
		if out.Bytes < size {
			return 0, fmt.Errorf("transfer copied %d bytes, want at least %d", out.Bytes, size)
		}
		_, err = shell(ctx, c, "dst", "rm -rf "+to, time.Minute)
		return d, err
	})
	if err != nil {
		return fmt.Errorf("transfer %d MiB tree: %w", k, err)
	}

	var base string
	var one func(i int) (time.Duration, error)
	if b.name == "docker" {
		base = "docker cp box → box (tar pipe)"
		pipe := fmt.Sprintf("set -e; docker cp %s:%s/tree - | docker cp - %s:%s/", src.ID, backend.Workspace, dst.ID, backend.Workspace)
		// docker cp keeps the owners, and each box has a host uid of its
		// own: the source box's user empties the copy (untimed) before the
		// destination's removes it. (docker cp -a, which would chown, looks
		// the box user up among the host's accounts and fails.)
		empty := fmt.Sprintf(`docker exec -u "$(docker inspect -f '{{.Config.User}}' %s)" %s sh -c 'rm -rf %s/tree/*'`, src.ID, dst.ID, backend.Workspace)
		one = func(int) (time.Duration, error) {
			d, err := timedCmd(ctx, "sh", "-c", pipe)
			if err == nil {
				_, err = timedCmd(ctx, "sh", "-c", empty)
			}
			if err != nil {
				return 0, err
			}
			_, err = shell(ctx, c, "dst", "rm -rf tree", time.Minute)
			return d, err
		}
	} else {
		base = "host cp -r (no box)"
		hostTree := filepath.Join(b.root, "bench-tree")
		if err := writeTree(hostTree, k); err != nil {
			return err
		}
		defer os.RemoveAll(hostTree)
		one = func(int) (time.Duration, error) {
			to := hostTree + ".copy"
			d, err := timedCmd(ctx, "cp", "-r", hostTree, to)
			if err != nil {
				return 0, err
			}
			return d, os.RemoveAll(to)
		}
	}
	baseSamples, err := benchLoop(ctx, iters, b.o.budget, one)
	if err != nil {
		return fmt.Errorf("transfer baseline %s: %w", base, err)
	}
	p, _, _ := percentiles(baseSamples)
	b.rep.add(b.name, fmt.Sprintf("transfer %d MiB tree (%d files) box → box", k, k), samples, base, p, 0)
	return nil
}

// fork measures the fork tool: a box whose workspace holds treeMiB MiB in
// benchForkFiles files forked into benchForkCount boxes, until a shell
// call has returned in each. The baseline is `cp -a` of the same tree on
// the host.
func (b *boxesBench) fork(ctx context.Context, c *sandboxclient.HTTP) error {
	k := b.o.treeMiB
	fileSize := (k << 20) / benchForkFiles
	if _, err := c.CreateBox(ctx, api.SandboxCreateInput{Sandbox: "fk"}); err != nil {
		return err
	}
	mk := fmt.Sprintf("mkdir -p tree && head -c %d /dev/urandom > f0 && for i in $(seq 1 %d); do cp f0 tree/f$i && echo $i >> tree/f$i || exit 1; done && rm f0", fileSize, benchForkFiles)
	if _, err := shell(ctx, c, "fk", mk, 5*time.Minute); err != nil {
		return fmt.Errorf("make the tree to fork: %w", err)
	}
	iters := max(min(b.o.n/10, 5), 1)
	var method string
	samples, err := benchLoop(ctx, iters, b.o.budget, func(i int) (time.Duration, error) {
		names := make([]string, benchForkCount)
		for j := range names {
			names[j] = fmt.Sprintf("fk%d-%d", i, j)
		}
		d, err := timed(func() error {
			out, err := callTool[api.ForkOutput](ctx, c, "fork", api.ForkInput{Sandbox: "fk", Count: benchForkCount, Names: names})
			if err != nil {
				return err
			}
			method = out.Method
			errs := make(chan error, len(names))
			for _, n := range names {
				go func() { errs <- shellTrue(ctx, c, n) }()
			}
			for range names {
				err = errors.Join(err, <-errs)
			}
			return err
		})
		if err != nil {
			return 0, err
		}
		if _, err := shell(ctx, c, names[len(names)-1], fmt.Sprintf("test $(ls tree | wc -l) = %d", benchForkFiles), time.Minute); err != nil {
			return 0, fmt.Errorf("a forked box lacks the tree: %w", err)
		}
		for _, n := range names {
			if err := c.DestroyBox(ctx, n); err != nil {
				return 0, err
			}
		}
		return d, nil
	})
	if err != nil {
		return fmt.Errorf("fork a %d MiB workspace into %d boxes: %w", k, benchForkCount, err)
	}
	hostTree := filepath.Join(b.root, "bench-fork-tree")
	if err := os.MkdirAll(hostTree, 0o755); err != nil {
		return err
	}
	defer os.RemoveAll(hostTree)
	buf := make([]byte, fileSize)
	for i := 1; i <= benchForkFiles; i++ {
		rand.Read(buf)
		if err := os.WriteFile(filepath.Join(hostTree, "f"+strconv.Itoa(i)), buf, 0o644); err != nil {
			return err
		}
	}
	baseSamples, err := benchLoop(ctx, iters, b.o.budget, func(int) (time.Duration, error) {
		to := hostTree + ".copy"
		d, err := timedCmd(ctx, "cp", "-a", hostTree, to)
		if err != nil {
			return 0, err
		}
		return d, os.RemoveAll(to)
	})
	if err != nil {
		return fmt.Errorf("fork baseline cp -a: %w", err)
	}
	p, _, _ := percentiles(baseSamples)
	b.rep.add(b.name, fmt.Sprintf("fork a %d MiB / %d-file workspace into %d boxes, all answering (%s)", k, benchForkFiles, benchForkCount, method), samples, "host cp -a of the tree (one copy, no box)", p, targetFork)
	return nil
}

// cleanup removes everything the bench made on this backend: the sessions
// with their boxes, the warm pools, the baseline containers.
func (b *boxesBench) cleanup() error {
	var errs []error
	for _, s := range b.servers {
		errs = append(errs, b.stopServer(s))
	}
	if b.name == "docker" {
		ctx, cancel := context.WithTimeout(context.Background(), benchCleanupLimit)
		defer cancel()
		out, err := exec.CommandContext(ctx, "docker", "ps", "-aq", "--filter", "label=cellbox.bench="+b.run).Output()
		if ids := strings.Fields(string(out)); err == nil && len(ids) > 0 {
			errs = append(errs, runCmd(ctx, append([]string{"docker", "rm", "-f"}, ids...)...))
		}
	}
	if c, ok := b.be.(io.Closer); ok {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// benchServer is a sandbox service over a data directory of its own,
// served on a loopback port, with one session.
type benchServer struct {
	svc  *sandbox.Service
	http *http.Server
	url  string
	c    *sandboxclient.HTTP
	done bool
}

func (b *boxesBench) startServer(ctx context.Context, name string, pool int) (*benchServer, error) {
	svc, err := newBenchService(ctx, b.be, filepath.Join(b.root, b.name+"-"+name), b.o.agentBinary, pool)
	if err != nil {
		return nil, err
	}
	s := &benchServer{svc: svc}
	b.servers = append(b.servers, s)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s.url = "http://" + ln.Addr().String()
	svc.SetBaseURL(s.url)
	s.http = &http.Server{Handler: httpapi.Handler(svc), ReadHeaderTimeout: 10 * time.Second}
	go s.http.Serve(ln)
	if s.c, err = sandboxclient.NewSession(ctx, s.url); err != nil {
		return nil, err
	}
	return s, nil
}

// newBenchService starts a sandbox service on be over dataDir, with pool
// warm boxes of the default image.
func newBenchService(ctx context.Context, be backend.Backend, dataDir, agentBinary string, pool int) (*sandbox.Service, error) {
	return sandbox.New(ctx, sandbox.Config{
		Backend:     be,
		DataDir:     dataDir,
		AgentBinary: agentBinary,
		Pool:        map[string]int{backend.DefaultImage: pool},
		Logger:      benchLogger(),
	})
}

// benchLogger logs warnings and errors only, to stderr;
// CELLBOX_BENCH_LOG=debug|info shows more, to see where the time goes.
func benchLogger() *slog.Logger {
	level := slog.LevelWarn
	if v := os.Getenv("CELLBOX_BENCH_LOG"); v != "" {
		_ = level.UnmarshalText([]byte(v))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// stopServer stops serving, deletes the server's session (destroying its
// boxes) and closes the service (removing its warm boxes). It runs on its own context, so
// that it cleans up after an interrupt too.
func (b *boxesBench) stopServer(s *benchServer) error {
	if s.done {
		return nil
	}
	s.done = true
	ctx, cancel := context.WithTimeout(context.Background(), benchCleanupLimit)
	defer cancel()
	var errs []error
	if s.http != nil { // first: no call may make a box after the session is gone
		errs = append(errs, s.http.Shutdown(ctx))
	}
	if s.c != nil {
		id, _ := s.c.Session()
		errs = append(errs, s.svc.DeleteSession(ctx, id))
	}
	errs = append(errs, s.svc.Close())
	return errors.Join(errs...)
}

// createFirstResult times sandbox_create of a new box name and a shell
// `true` in it, then destroys the box (untimed).
func createFirstResult(ctx context.Context, c *sandboxclient.HTTP, name string) (time.Duration, error) {
	d, err := timed(func() error {
		out, err := c.CreateBox(ctx, api.SandboxCreateInput{Sandbox: name})
		if err != nil {
			return err
		}
		if !out.Created {
			return fmt.Errorf("sandbox_create %s: the box existed already", name)
		}
		return shellTrue(ctx, c, name)
	})
	if err != nil {
		return 0, err
	}
	return d, c.DestroyBox(ctx, name)
}

func shellTrue(ctx context.Context, c *sandboxclient.HTTP, box string) error {
	_, err := shell(ctx, c, box, "true", 0)
	return err
}

// shell runs command in box with the shell tool and fails unless it exits 0.
func shell(ctx context.Context, c *sandboxclient.HTTP, box, command string, timeout time.Duration) (api.ShellOutput, error) {
	out, err := callTool[api.ShellOutput](ctx, c, "shell", api.ShellInput{Sandbox: box, Command: command, TimeoutMs: int(timeout.Milliseconds())})
	if err == nil && out.ExitCode != 0 {
		err = fmt.Errorf("shell %q in %s: exit code %d: %s", command, box, out.ExitCode, out.Stderr)
	}
	return out, err
}

// callTool calls the tool name with input and decodes its result into a T.
func callTool[T any](ctx context.Context, c *sandboxclient.HTTP, name string, input any) (T, error) {
	var out T
	return out, c.ToolInto(ctx, name, input, &out)
}

// readFilePaged reads a whole text file with read_file, page after page,
// into w, and returns the number of calls.
func readFilePaged(ctx context.Context, c *sandboxclient.HTTP, box, path string, w io.Writer) (int, error) {
	offset := 0
	for calls := 1; ; calls++ {
		out, err := callTool[api.ReadFileOutput](ctx, c, "read_file", api.ReadFileInput{Sandbox: box, Path: path, Offset: offset})
		if err != nil {
			return calls, err
		}
		io.WriteString(w, out.Content)
		if out.NextOffset == 0 {
			return calls, nil
		}
		if out.NextOffset <= offset || calls > 1000 {
			return calls, fmt.Errorf("read_file %s: next_offset %d after offset %d does not advance", path, out.NextOffset, offset)
		}
		offset = out.NextOffset
	}
}

// waitPool waits until the server's warm pool holds want boxes (read from
// /metrics, with key as the bearer when it is not "").
func waitPool(ctx context.Context, url, key string, want int) error {
	ctx, cancel := context.WithTimeout(ctx, benchPoolWait)
	defer cancel()
	prefix := fmt.Sprintf("cellbox_pool_ready{image=%q} ", backend.DefaultImage)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if v, ok := strings.CutPrefix(sc.Text(), prefix); ok {
					if n, _ := strconv.Atoi(v); n >= want {
						resp.Body.Close()
						return nil
					}
				}
			}
			resp.Body.Close()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %d warm boxes: %w", want, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// cellboxBinary returns path, or the cellbox binary beside this
// executable when path is "": the benches run it as the agent in every
// box, and as `cellbox run --once`.
func cellboxBinary(path string) (string, error) {
	if path != "" {
		return path, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find the cellbox binary (pass --agent-binary): %w", err)
	}
	bin := filepath.Join(filepath.Dir(exe), "cellbox")
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("no cellbox binary beside %s (%w): build it there (CGO_ENABLED=0 go build -o %s ./cmd/cellbox), or pass --agent-binary", exe, err, bin)
	}
	return bin, nil
}

// benchText is size bytes of printable text in lines of 1 KiB.
func benchText(size int) []byte {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = alphabet[(i*7+i/1024)%len(alphabet)]
		if i%1024 == 1023 {
			buf[i] = '\n'
		}
	}
	return buf
}

// writeTree writes k files of 1 MiB of random bytes into dir.
func writeTree(dir string, k int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for i := 1; i <= k; i++ {
		rand.Read(buf)
		if err := os.WriteFile(filepath.Join(dir, "f"+strconv.Itoa(i)), buf, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// kubectl is a kubectl command line in the box namespace.
func kubectl(args ...string) []string {
	bin := cmp.Or(os.Getenv("CELLBOX_KUBECTL"), "kubectl")
	return append([]string{bin, "-n", cmp.Or(os.Getenv(cluster.KubeNamespaceEnv), kube.DefaultNamespace)}, args...)
}

// kubePod is the namespace-less pod name of box id, as kubectl cp takes it.
func kubePod(id string) string { return id }

// kubeBaselines: a pod of the box image created and waited for Ready
// (kubectl run + kubectl wait; deleted untimed), and kubectl exec of
// true in the box's own pod.
func (b *boxesBench) kubeBaselines(ctx context.Context, boxID string) (string, time.Duration, string, time.Duration, error) {
	image := cmp.Or(os.Getenv(cluster.KubeImageEnv), kube.DefaultImage)
	overrides := `{"spec":{"automountServiceAccountToken":false,"securityContext":{"runAsNonRoot":true,"runAsUser":1000,"seccompProfile":{"type":"RuntimeDefault"}},` +
		`"containers":[{"name":"c","image":"` + image + `","imagePullPolicy":"Never","command":["sleep","3600"],` +
		`"securityContext":{"allowPrivilegeEscalation":false,"readOnlyRootFilesystem":true,"capabilities":{"drop":["ALL"]}}}]}}`
	n := 0
	var pods []string
	defer func() {
		if len(pods) > 0 {
			runCmd(context.WithoutCancel(ctx), kubectl(append([]string{"delete", "pod", "--wait=false", "--grace-period=0"}, pods...)...)...)
		}
	}()
	createP50, err := b.baselineP50(ctx, func() error {
		n++
		name := fmt.Sprintf("%s-%d", b.run, n)
		pods = append(pods, name)
		if err := runCmd(ctx, kubectl("run", name, "--image", image, "--restart=Never", "--labels", "cellbox.bench="+b.run, "--overrides", overrides)...); err != nil {
			return err
		}
		return runCmd(ctx, kubectl("wait", "--for=condition=Ready", "--timeout=120s", "pod/"+name)...)
	})
	if err != nil {
		return "", 0, "", 0, err
	}
	execP50, err := b.baselineP50(ctx, func() error { return runCmd(ctx, kubectl("exec", kubePod(boxID), "-c", "box", "--", "true")...) })
	return "kubectl run + wait Ready", createP50, "kubectl exec", execP50, err
}

// wake measures the first call on a box that went to sleep.
func (b *boxesBench) wake(ctx context.Context, c *sandboxclient.HTTP) error {
	if _, err := c.CreateBox(ctx, api.SandboxCreateInput{Sandbox: "sleeper", SleepAfterMs: 500}); err != nil {
		return err
	}
	if _, err := c.Upload(ctx, "sleeper", "bench/1m.txt", bytes.NewReader(b.content)); err != nil {
		return err
	}
	samples, err := benchLoop(ctx, min(b.o.n, 5), b.o.budget, func(int) (time.Duration, error) {
		deadline := time.Now().Add(2 * time.Minute)
		for {
			list, err := callTool[api.SandboxListOutput](ctx, c, "sandbox_list", struct{}{})
			if err != nil {
				return 0, err
			}
			asleep := false
			for _, s := range list.Sandboxes {
				asleep = asleep || (s.Name == "sleeper" && s.Status == "sleeping")
			}
			if asleep {
				break
			}
			if time.Now().After(deadline) {
				return 0, errors.New("the box did not go to sleep within 2 minutes")
			}
			time.Sleep(200 * time.Millisecond)
		}
		return timed(func() error { return shellTrue(ctx, c, "sleeper") })
	})
	if err != nil {
		return fmt.Errorf("sleep → wake: %w", err)
	}
	b.rep.add(b.name, "sleep → wake (first `shell` `true` on a sleeping box)", samples, b.createBase, b.createP50, 0)
	return nil
}
