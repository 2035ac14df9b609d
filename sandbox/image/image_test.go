package image_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/image"
)

func writeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(root, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
	}
}

func TestAptSourcesAndMirror(t *testing.T) {
	etc := t.TempDir()
	writeFiles(t, etc, map[string]string{
		"sources.list": `# a comment
deb-src http://src.example/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] http://one.example/debian bookworm contrib  # contrib only
deb [ trusted=yes ] http://two.example/debian/ bookworm main non-free
`,
		"sources.list.d/debian.sources": `Types: deb deb-src
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb822.example/debian
Suites: bookworm-backports bookworm-updates
Components: main
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 mQINBF...
 -----END PGP PUBLIC KEY BLOCK-----

Types: deb
URIs: http://disabled.example/debian
Suites: trixie
Components: main
Enabled: no

Types: deb
URIs: http://security.example/debian-security
Suites: bookworm-security
Components: main
`,
		"sources.list.d/cloud.list.disabled-by-farm": "deb http://ignored.example/ bookworm main\n",
		"sources.list.d/other.list":                  "deb cdrom:[Debian]/ trixie main\ndeb http://trixie.example/debian trixie main\n",
	})
	srcs, err := image.ReadAptSources(etc)
	require.NoError(t, err)
	var uris []string
	for _, s := range srcs {
		uris = append(uris, s.URI)
	}
	assert.Equal(t, []string{"http://one.example/debian", "http://two.example/debian/", "http://deb822.example/debian",
		"http://security.example/debian-security", "cdrom:[Debian]/", "http://trixie.example/debian"}, uris)

	tests := []struct {
		suite, want, err string
	}{
		{"bookworm", "http://two.example/debian", ""},
		{"bookworm-updates", "http://deb822.example/debian", ""},
		{"bookworm-security", "http://security.example/debian-security", ""},
		{"trixie", "http://trixie.example/debian", ""}, // the cdrom entry is skipped, the disabled one too
		{"sid", "", `no apt source for "sid" main`},
	}
	for _, tc := range tests {
		t.Run(tc.suite, func(t *testing.T) {
			got, err := image.Mirror(srcs, tc.suite)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestHostSuite(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"good":  "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nVERSION_CODENAME=bookworm\nID=debian\n",
		"quote": "VERSION_CODENAME=\"trixie\"\n",
		"none":  "ID=debian\n",
	})
	got, err := image.HostSuite(filepath.Join(dir, "good"))
	require.NoError(t, err)
	assert.Equal(t, "bookworm", got)
	got, err = image.HostSuite(filepath.Join(dir, "quote"))
	require.NoError(t, err)
	assert.Equal(t, "trixie", got)
	_, err = image.HostSuite(filepath.Join(dir, "none"))
	assert.ErrorContains(t, err, "VERSION_CODENAME")
}

func TestSkeletonTar(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, image.SkeletonTar(&buf))
	got := map[string]*tar.Header{}
	bodies := map[string]string{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		got[h.Name] = h
		b, _ := io.ReadAll(tr)
		bodies[h.Name] = string(b)
	}
	for _, d := range []string{"workspace/", "tmp/", "etc/", "run/cellbox/", ".cellbox/", "proc/", "dev/", "sys/", "usr/"} {
		require.Contains(t, got, d)
		assert.Equal(t, byte(tar.TypeDir), got[d].Typeflag, d)
	}
	assert.Equal(t, backend.BoxUID, got["workspace/"].Uid)
	assert.Equal(t, int64(0o1777), got["tmp/"].Mode)
	for link, target := range map[string]string{"bin": "usr/bin", "lib": "usr/lib", "lib64": "usr/lib64", "sbin": "usr/sbin", "etc/os-release": "../usr/lib/os-release"} {
		require.Contains(t, got, link)
		assert.Equal(t, target, got[link].Linkname)
	}
	assert.Contains(t, bodies["etc/passwd"], "user:x:1000:1000:user:/workspace:/bin/bash\n")
	assert.Contains(t, bodies["etc/group"], "user:x:1000:\n")
	assert.Contains(t, got, "etc/resolv.conf")
	assert.Contains(t, got, "etc/hosts")
}

func TestBuildRejectsUnknownImage(t *testing.T) {
	_, _, err := image.Build(context.Background(), image.BuildOptions{ImagesDir: t.TempDir(), Name: "ruby"})
	assert.ErrorContains(t, err, `unknown image "ruby": want one of base, node, python`)
}

// TestBuildBase runs debootstrap from the configured Debian mirror (a
// minute or two). CI runs it; elsewhere set CELLBOX_TEST_IMAGES=1.
func TestBuildBase(t *testing.T) {
	if !testenv.InCI() && os.Getenv("CELLBOX_TEST_IMAGES") == "" {
		t.Skip("set CELLBOX_TEST_IMAGES=1 to build an image with debootstrap (takes minutes)")
	}
	testenv.RequireRoot(t, "debootstrap")
	testenv.RequireCommand(t, "debootstrap")
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	in, built, err := image.Build(ctx, image.BuildOptions{ImagesDir: dir, Name: "base"})
	require.NoError(t, err)
	assert.True(t, built)
	assert.Equal(t, image.RootfsDir(dir, "base"), in.Rootfs)
	assert.Greater(t, in.Size, int64(50<<20))

	for _, p := range []string{"usr/bin/python3", "usr/bin/bash", "etc/ssl/certs/ca-certificates.crt", ".cellbox/cellbox", "run/cellbox"} {
		_, err := os.Stat(filepath.Join(in.Rootfs, p))
		assert.NoError(t, err, p)
	}
	passwd, err := os.ReadFile(filepath.Join(in.Rootfs, "etc/passwd"))
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(string(passwd), "\nuser:x:1000:1000:"))
	fi, err := os.Stat(filepath.Join(in.Rootfs, "workspace"))
	require.NoError(t, err)
	assert.Equal(t, uint32(backend.BoxUID), fi.Sys().(*syscall.Stat_t).Uid)

	again, built, err := image.Build(ctx, image.BuildOptions{ImagesDir: dir, Name: "base"})
	require.NoError(t, err)
	assert.False(t, built, "an existing image is not rebuilt")
	assert.Equal(t, in.Built, again.Built)
	list, err := image.List(dir)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, "base", list[0].Name)

	var tarBuf bytes.Buffer
	require.NoError(t, image.Tar(ctx, in.Rootfs, &tarBuf))
	assert.Greater(t, tarBuf.Len(), 50<<20)
}
