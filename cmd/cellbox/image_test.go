package main

import (
	"archive/tar"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
)

// TestImageBuildStop stops `cellbox image build --force` over a built
// image with SIGINT, as Ctrl-C does, and with SIGTERM, while debootstrap
// fetches from the mirror (its first slow steps). The build ends within
// seconds, exits 1 saying it was interrupted, and leaves no process of it
// running (none names the images dir in its arguments, working dir or
// root), nothing mounted, no partial rootfs, and the image built before in
// place. Before, only debootstrap itself was killed: its forks ran on and
// held its output pipe, so the command took 10 s to minutes to exit (a stop
// while it unpacked never ended), and a mount of /proc stayed in the
// partial rootfs.
func TestImageBuildStop(t *testing.T) {
	testenv.RequireRoot(t, "debootstrap")
	testenv.RequireCommand(t, "debootstrap")
	bin := testenv.CellboxBinary(t)
	for _, tc := range []struct {
		name  string
		sig   syscall.Signal
		fetch string // what debootstrap's wget fetches when the signal goes
		// or, once it is in the partial root, this file of it (a glob): a
		// fetch from a near mirror can end between two looks
		got string
	}{
		// The package index (some megabytes, then read to resolve
		// dependencies, seconds): here a stop took 0.3-10 s.
		{"SIGINT while it fetches the index", syscall.SIGINT, "_Packages", "var/lib/apt/lists/*_Packages*"},
		// The packages, which a fork of debootstrap fetches one by one in
		// a loop: here a stop took 20 s and more, the loop ran on.
		{"SIGTERM while it fetches the packages", syscall.SIGTERM, "/pool/", ""},
	} {
		sig := tc.sig
		t.Run(tc.name, func(t *testing.T) {
			images := t.TempDir()
			t.Cleanup(func() { // before the temp dir goes: it must not be removed through a mount
				for _, p := range buildProcesses(t, images) {
					syscall.Kill(p.pid, syscall.SIGKILL)
				}
				testenv.UnmountUnder(t, images)
			})
			rootfs := filepath.Join(images, "base", "rootfs")
			marker := filepath.Join(rootfs, ".cellbox-image.json") // image.Read's
			built := `{"name":"base","suite":"bookworm","built":"2020-01-02T03:04:05Z"}`
			require.NoError(t, os.MkdirAll(rootfs, 0o755))
			require.NoError(t, os.WriteFile(marker, []byte(built), 0o644))

			cmd := exec.Command(bin, "image", "build", "base", "--images", images, "--backend", "local", "--force")
			// Its output goes to a file: Wait returns when it exits, not when
			// the last process holding a pipe to the test does.
			out, ferr := os.Create(filepath.Join(t.TempDir(), "out"))
			require.NoError(t, ferr)
			defer out.Close()
			cmd.Stdout, cmd.Stderr = out, out
			require.NoError(t, cmd.Start())
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			t.Cleanup(func() {
				cmd.Process.Kill()
				<-done
			})

			// Under way: debootstrap downloads into the new root.
			deadline := time.Now().Add(3 * time.Minute)
			for !fetching(t, images, tc.fetch) && !(tc.got != "" && fetched(filepath.Join(rootfs+".building", tc.got))) {
				select {
				case err := <-done:
					done <- err // for the cleanup, which waits for it
					t.Fatalf("the build ended (%v) before debootstrap fetched %s:\n%s", err, tc.fetch, fileText(out))
				default:
				}
				require.True(t, time.Now().Before(deadline), "debootstrap did not fetch %s within 3 minutes:\n%s", tc.fetch, fileText(out))
				time.Sleep(5 * time.Millisecond) // a fetch from a near mirror is short
			}

			require.NoError(t, cmd.Process.Signal(sig))
			start := time.Now()
			var err error
			select {
			case err = <-done:
				done <- err // for the cleanup
			case <-time.After(10 * time.Second): // a safety net: a stop takes well under 2 s
				t.Fatalf("still running 10 s after %v; its processes:\n%v\noutput:\n%s", sig, buildProcesses(t, images), fileText(out))
			}
			took := time.Since(start)
			t.Logf("stopped in %s", took.Round(time.Millisecond))
			text := fileText(out)
			assert.Equal(t, 1, exitCode(t, err), text)
			assert.Regexp(t, `cellbox image: image build base: interrupted \(\w+ signal received\) during debootstrap bookworm from \S+; nothing was installed, the image built before, if any, is untouched(\n|; what is left)`, text)

			assert.Empty(t, buildProcesses(t, images), "no process of the build runs on")
			assert.Empty(t, testenv.Mounts(t, images), "nothing stays mounted in the partial rootfs")
			ents, rerr := os.ReadDir(filepath.Dir(rootfs))
			require.NoError(t, rerr)
			for _, e := range ents {
				// The partial rootfs is gone, or (on a slow machine) what is
				// left of it is out of the way and named. build.lock is the
				// image's flock file: empty, and kept on purpose (removing a
				// lock file races with a build waiting on it).
				if e.Name() != "rootfs" && e.Name() != "build.lock" && !(strings.HasPrefix(e.Name(), "rootfs.removing-") && strings.Contains(text, e.Name()+", goes with the next build")) {
					t.Errorf("left in %s: %s", filepath.Dir(rootfs), e.Name())
				}
			}
			got, rerr := os.ReadFile(marker)
			require.NoError(t, rerr, "the image built before stays")
			assert.Equal(t, built, string(got))
			ls, _, lerr := cellbox(t, "image", "ls", "--images", images)
			require.NoError(t, lerr)
			assert.Regexp(t, `(?m)^base\s+`+rootfs+`\s+`, ls, "and is listed as built")
		})
	}
}

type buildProc struct {
	pid  int
	comm string
	args string
}

// buildProcesses are the live processes that name dir in their arguments,
// working directory or root (a chroot into the rootfs).
func buildProcesses(t *testing.T, dir string) []buildProc {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	require.NoError(t, err)
	var found []buildProc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		p := "/proc/" + e.Name()
		stat, err := os.ReadFile(p + "/stat")
		if err != nil {
			continue // gone
		}
		s := string(stat)
		if f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]); len(f) > 0 && f[0] == "Z" {
			continue // a zombie runs nothing
		}
		args, _ := os.ReadFile(p + "/cmdline")
		cwd, _ := os.Readlink(p + "/cwd")
		root, _ := os.Readlink(p + "/root")
		if strings.Contains(string(args), dir) || strings.HasPrefix(cwd, dir) || strings.HasPrefix(root, dir) {
			comm, _ := os.ReadFile(p + "/comm")
			found = append(found, buildProc{pid, strings.TrimSpace(string(comm)), strings.ReplaceAll(string(args), "\x00", " ")})
		}
	}
	return found
}

// fetching reports whether a wget of the build fetches a file whose name
// holds what.
func fetching(t *testing.T, dir, what string) bool {
	for _, p := range buildProcesses(t, dir) {
		if p.comm == "wget" && strings.Contains(p.args, what) {
			return true
		}
	}
	return false
}

// fetched reports whether a file matching glob exists.
func fetched(glob string) bool {
	m, _ := filepath.Glob(glob)
	return len(m) > 0
}

func fileText(f *os.File) string {
	b, _ := os.ReadFile(f.Name())
	return string(b)
}

// TestImageBuildOCI: `image build NAME --oci FILE` over a built rootfs
// writes an OCI archive of it in place (its index names the image
// cellbox/NAME), and a --oci in a directory that does not exist is refused
// before anything is built.
func TestImageBuildOCI(t *testing.T) {
	images := t.TempDir()
	rootfs := filepath.Join(images, "base", "rootfs")
	require.NoError(t, os.MkdirAll(filepath.Join(rootfs, "workspace"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(rootfs, ".cellbox-image.json"), []byte(`{"name":"base","suite":"bookworm","built":"2020-01-02T03:04:05Z"}`), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(rootfs, "hello"), []byte("hi"), 0o644))
	dir := t.TempDir()
	file := filepath.Join(dir, "base.tar")
	out, errOut, err := cellbox(t, "image", "build", "base", "--images", images, "--backend", "local", "--oci", file)
	require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", out, errOut)
	assert.Contains(t, out, "OCI archive "+file+" (docker.io/cellbox/base:latest")
	assert.Contains(t, out, "ctr -n k8s.io images import "+file)
	f, err := os.Open(file)
	require.NoError(t, err)
	defer f.Close()
	var names []string
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		names = append(names, h.Name)
	}
	assert.Contains(t, names, "oci-layout")
	assert.Contains(t, names, "index.json")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "the archive and nothing else (no temporary layer or partial file)")

	_, errOut, err = cellbox(t, "image", "build", "base", "--images", images, "--backend", "local", "--oci", "/nonexistent/base.tar")
	assert.Equal(t, 1, exitCode(t, err))
	assert.Contains(t, errOut, "--oci /nonexistent/base.tar: its directory /nonexistent does not exist")
}
