package builtins_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/builtins"
	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/runtime"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/docker"
	"github.com/cellbox/cellbox/sandbox/image"
	"github.com/cellbox/cellbox/sandbox/sandboxtest"
	"github.com/cellbox/cellbox/sandboxclient"
)

// imageBackend is a real backend with an image of the test's own that the
// test builds, and builds again under the same name.
type imageBackend struct {
	name string
	// open starts the service on the backend and returns the image's
	// name and a function that (re)builds it with /greeting holding the
	// given text.
	open func(t testing.TB) (b *box, img string, build func(greeting string))
	// seen is how long after a rebuild the backend may still report the
	// build before (backend.ImageDigestTTL where it caches the engine's
	// answer; 0 where it checks a stamp at every call).
	seen time.Duration
}

var imageBackends = []imageBackend{
	{name: "local", open: openLocalImage},
	{name: "docker", open: openDockerImage, seen: backend.ImageDigestTTL},
}

// openLocalImage: the local backend over an images directory of the
// test's own, where a "build" writes a rootfs beside the image's and
// renames it into place, marker last, as `cellbox image build` does.
func openLocalImage(t testing.TB) (*box, string, func(string)) {
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o755))
	name := "digest-" + randomHex(t)
	svc, _ := sandboxtest.Service(t, sandboxtest.Options{ImagesDir: dir, Logger: quiet()})
	id, _, err := svc.NewSession(context.Background())
	require.NoError(t, err)
	rootfs := image.RootfsDir(dir, name)
	build := func(greeting string) {
		tmp := rootfs + ".building"
		writeTinyRootfs(t, tmp, name, greeting)
		_ = os.RemoveAll(rootfs + ".old")
		if err := os.Rename(rootfs, rootfs+".old"); err != nil && !errors.Is(err, os.ErrNotExist) {
			require.NoError(t, err)
		}
		require.NoError(t, os.Rename(tmp, rootfs))
		require.NoError(t, os.RemoveAll(rootfs+".old"))
	}
	return &box{svc: svc, session: id, client: &counting{Client: svc.Client(id)}}, image.Ref(name), build
}

// openDockerImage: the docker backend on the test machine's engine, where
// a "build" imports a rootfs as the image (as `cellbox image build` does
// for Docker); the test removes every build at its end.
func openDockerImage(t testing.TB) (*box, string, func(string)) {
	testenv.RequireDocker(t)
	ctx := context.Background()
	be, err := docker.New(ctx, docker.Options{Logger: quiet()})
	require.NoError(t, err)
	t.Cleanup(func() { be.Close() })
	svc, _ := sandboxtest.Service(t, sandboxtest.Options{Backend: be, Logger: quiet()})
	id, _, err := svc.NewSession(ctx)
	require.NoError(t, err)
	name := image.Ref("digest-" + randomHex(t))
	cli, err := client.New(client.FromEnv)
	require.NoError(t, err)
	var ids []string
	t.Cleanup(func() {
		for _, id := range ids {
			if _, err := cli.ImageRemove(context.Background(), id, client.ImageRemoveOptions{Force: true}); err != nil {
				t.Logf("remove test image %s: %v", id, err)
			}
		}
		cli.Close()
	})
	work := t.TempDir()
	build := func(greeting string) {
		rootfs := filepath.Join(work, "rootfs")
		require.NoError(t, os.RemoveAll(rootfs))
		writeTinyRootfs(t, rootfs, name, greeting)
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(image.Tar(ctx, rootfs, pw)) }()
		id, err := be.ImportImage(ctx, name, pr)
		pr.CloseWithError(err)
		require.NoError(t, err)
		ids = append(ids, id)
	}
	return &box{svc: svc, session: id, client: &counting{Client: svc.Client(id)}}, name, build
}

func randomHex(t testing.TB) string {
	b := make([]byte, 4)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// writeTinyRootfs writes a root filesystem a box can run commands in: the
// host's bash and the libraries it links, the mount points the backends
// bind over, /greeting holding greeting, and the marker `cellbox image
// build` writes last (its build time tells one build from the next).
func writeTinyRootfs(t testing.TB, dir, name, greeting string) {
	t.Helper()
	bash, err := filepath.EvalSymlinks("/bin/bash")
	require.NoError(t, err)
	out, err := exec.Command("ldd", bash).Output()
	require.NoError(t, err, "ldd %s", bash)
	files := map[string]string{"/bin/bash": bash} // in the rootfs -> on the host
	for _, line := range strings.Split(string(out), "\n") {
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "/") {
				files[f] = f
			}
		}
	}
	for in, host := range files {
		data, err := os.ReadFile(host)
		require.NoError(t, err)
		p := filepath.Join(dir, in)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, data, 0o755))
	}
	for _, d := range []string{"usr", "proc", "dev", "tmp", "etc", backend.Workspace, backend.SocketDir, filepath.Dir(backend.AgentPath)} {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, d), 0o755))
	}
	require.NoError(t, os.Chmod(filepath.Join(dir, "tmp"), 0o1777))
	for p, content := range map[string]string{
		backend.AgentPath: "",
		"/etc/passwd":     "root:x:0:0:root:/root:/bin/bash\n",
		"/etc/group":      "root:x:0:\n",
		"/greeting":       greeting,
	} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, p), []byte(content), 0o755))
	}
	marker, err := json.Marshal(image.Info{Name: name, Built: time.Now().UTC()})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".cellbox-image.json"), marker, 0o644))
	_, err = image.Read(dir)
	require.NoError(t, err, "the marker is where image.Read finds it")
}

// TestExecImageRebuilt: an exec node's results are cached by its image's
// digest, not its name alone: once the image is rebuilt under the same
// name with other content, the same inputs run again and see the new
// content; without a rebuild they are memo hits. An image that is not
// there fails its run saying so.
func TestExecImageRebuilt(t *testing.T) {
	for _, ib := range imageBackends {
		t.Run(ib.name, func(t *testing.T) {
			b, img, build := ib.open(t)
			build("one")
			r := b.load(t, `
name: rebuilt
cells:
  n: 1
nodes:
  job:
    exec:
      image: `+img+`
      command: echo "n=${n} $(< /greeting)"
  missing:
    exec:
      image: `+img+`-never-built
      command: echo "n=${n}"
`, nil)
			r.settle()
			require.Nil(t, r.exec("job").Error)
			assert.Equal(t, "n=1 one\n", r.exec("job").Result.Stdout)
			missing := r.exec("missing")
			require.NotNil(t, missing.Error, "no such image")
			assert.Regexp(t, `no such image|not found`, *missing.Error)

			node := func() runtime.NodeInfo {
				for _, n := range r.rt.Nodes() {
					if n.Addr.Name == "job" {
						return n
					}
				}
				t.Fatal("no node job")
				return runtime.NodeInfo{}
			}
			step := func(n, want string) {
				t.Helper()
				r.set("n", n)
				r.settle()
				out := r.exec("job")
				require.Nil(t, out.Error)
				assert.Equal(t, want, out.Result.Stdout)
			}

			build("two") // the same name, other content
			time.Sleep(ib.seen)
			step("2", "n=2 two\n")
			step("1", "n=1 two\n") // run again: the result for n=1 is the build before's
			assert.Equal(t, 3, node().Runs)
			assert.Equal(t, 0, node().CacheHits, "nothing cached from the build before is taken")

			step("2", "n=2 two\n") // no rebuild: memo hits
			step("1", "n=1 two\n")
			assert.Equal(t, 3, node().Runs)
			assert.Equal(t, 2, node().CacheHits)
			assert.Len(t, b.client.boxesCreated(), 3, "a box per run of job; none for missing")
		})
	}
}

// digesting is a client whose images have a digest the test sets.
type digesting struct {
	sandboxclient.Client
	digest string
	err    error
	asked  []string
}

func (d *digesting) ImageDigest(ctx context.Context, image string) (string, error) {
	d.asked = append(d.asked, image)
	return d.digest, d.err
}

// TestExecKeyDigest: the memo key holds the image's digest where the
// client reports one; with none, or when the client cannot say, it is the
// name's alone (the key it was before digests).
func TestExecKeyDigest(t *testing.T) {
	spec := builtins.ExecSpec{
		Node:    cells.Address{Space: "s", Pattern: "p", Name: "x"},
		Command: []builtins.Field{builtins.Const("echo hi")},
		Image:   builtins.Const("cellbox/python"),
	}
	key := func(c sandboxclient.Client) string {
		x, err := builtins.NewExec(builtins.Env{Client: c, Logger: quiet()}, spec)
		require.NoError(t, err)
		k, memo, err := x.Key(nil)
		require.NoError(t, err)
		assert.True(t, memo)
		return k
	}
	plain := key(&counting{})
	d := &digesting{}
	assert.Equal(t, plain, key(d), "no digest: the name's key")
	assert.Equal(t, []string{"cellbox/python"}, d.asked)
	d.digest = "sha256:aaa"
	a := key(d)
	assert.NotEqual(t, plain, a, "the digest is in the key")
	assert.Equal(t, a, key(d), "the same build, the same key")
	d.digest = "sha256:bbb"
	assert.NotEqual(t, a, key(d), "a rebuild, another key")
	d.digest, d.err = "sha256:ccc", errors.New("engine down")
	assert.Equal(t, plain, key(d), "a digest that cannot be read: the name's key")
}

// BenchmarkExecKeyDigest measures Key (which runs inside the runtime's
// batch for every exec decision) with the image's digest asked of a real
// service: none (a client without digests), a local rootfs (a stat of its
// marker per call), a Docker image (from the engine's answer, cached for
// a second).
func BenchmarkExecKeyDigest(b *testing.B) {
	spec := func(img string) builtins.ExecSpec {
		return builtins.ExecSpec{
			Node:    cells.Address{Space: "s", Pattern: "p", Name: "x"},
			Command: []builtins.Field{builtins.ExprField(builtins.MustParse(`"echo " + n`))},
			Image:   builtins.Const(img),
		}
	}
	bench := func(b *testing.B, c sandboxclient.Client, img string) {
		x, err := builtins.NewExec(builtins.Env{Client: c, Logger: quiet()}, spec(img))
		require.NoError(b, err)
		in := runtime.Inputs{"n": "1"}
		k0, _, err := x.Key(in)
		require.NoError(b, err)
		b.ResetTimer()
		for b.Loop() {
			if k, _, _ := x.Key(in); k != k0 {
				b.Fatal("the key changed")
			}
		}
	}
	b.Run("none", func(b *testing.B) { bench(b, &digesting{}, "cellbox/python") })
	for _, ib := range imageBackends {
		b.Run(ib.name, func(b *testing.B) {
			bx, img, build := ib.open(b)
			build("one")
			d, err := bx.client.ImageDigest(context.Background(), img)
			require.NoError(b, err)
			require.NotEmpty(b, d)
			bench(b, bx.client, img)
		})
	}
}
