package boxdisk_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/backend/boxdisk"
)

func requireRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		if testenv.InCI() {
			t.Fatal("box disks need root (mount)")
		}
		t.Skip("box disks need root (mount)")
	}
}

// newDisk makes a mounted disk of 64 MiB whose workspace uid owns, removed
// when the test ends.
func newDisk(t *testing.T, uid int) boxdisk.Disk {
	t.Helper()
	requireRoot(t)
	dir := t.TempDir()
	d := boxdisk.Disk{File: filepath.Join(dir, "disk.img"), Dir: filepath.Join(dir, "disk")}
	t.Cleanup(func() { _ = d.Remove(context.Background()) })
	require.NoError(t, d.Make(context.Background(), 64<<20, uid, uid))
	return d
}

// A disk survives being unmounted (a host reboot) and is mounted again
// with its files; Remove leaves nothing, and twice is fine.
func TestDiskLifecycle(t *testing.T) {
	ctx := context.Background()
	d := newDisk(t, 1234)
	assert.True(t, d.Mounted())
	assert.Len(t, loopsBacking(t, d.File), 1)
	opts := mountOptions(t, d.Dir)
	for _, o := range []string{"nodev", "nosuid", "discard"} {
		assert.Contains(t, opts, o, "the disk's mount options")
	}
	fi, err := os.Stat(d.Workspace())
	require.NoError(t, err)
	assert.Equal(t, os.ModeDir|0o755, fi.Mode())
	fi, err = os.Stat(d.Tmp())
	require.NoError(t, err)
	assert.Equal(t, os.ModeDir|os.ModeSticky|0o777, fi.Mode())
	require.NoError(t, os.WriteFile(filepath.Join(d.Workspace(), "f"), []byte("kept"), 0o644))

	err = d.Make(ctx, 64<<20, 0, 0)
	assert.ErrorIs(t, err, os.ErrExist, "making a disk twice")
	assert.FileExists(t, filepath.Join(d.Workspace(), "f"), "a failed Make leaves the existing disk alone")

	require.NoError(t, d.Unmount(ctx), "a stopped box holds no mount")
	assert.False(t, d.Mounted())
	assert.Empty(t, loopsBacking(t, d.File), "nor a loop device")
	assert.FileExists(t, d.File, "and keeps its disk")
	require.NoError(t, d.Unmount(ctx), "unmounting an unmounted disk is a no-op")
	require.NoError(t, d.Mount(ctx))
	require.NoError(t, d.Mount(ctx), "mounting a mounted disk is a no-op")
	got, err := os.ReadFile(filepath.Join(d.Workspace(), "f"))
	require.NoError(t, err)
	assert.Equal(t, "kept", string(got))

	require.NoError(t, d.Remove(ctx))
	assert.NoFileExists(t, d.File)
	assert.NoDirExists(t, d.Dir)
	require.NoError(t, d.Remove(ctx), "removing a removed disk")
}

// A disk mounted again while its filesystem still lives elsewhere (bound
// into a container whose mount namespace is not gone yet) is mounted
// through the same loop device, so both see one filesystem; a second
// device would mount a second instance over the same blocks.
func TestMountAgainWhileBoundElsewhere(t *testing.T) {
	ctx := context.Background()
	d := newDisk(t, 0)
	bound := filepath.Join(t.TempDir(), "bound")
	require.NoError(t, os.Mkdir(bound, 0o700))
	require.NoError(t, unix.Mount(d.Workspace(), bound, "", unix.MS_BIND, ""))
	t.Cleanup(func() { _ = unix.Unmount(bound, unix.MNT_DETACH) })

	require.NoError(t, d.Unmount(ctx))
	fds := openFiles(t)
	require.NoError(t, d.Mount(ctx))
	assert.Len(t, loopsBacking(t, d.File), 1, "one loop device for the image")
	assert.Equal(t, fds, openFiles(t), "the mount keeps no file open")
	require.NoError(t, os.WriteFile(filepath.Join(bound, "f"), []byte("one"), 0o644))
	got, err := os.ReadFile(filepath.Join(d.Workspace(), "f"))
	require.NoError(t, err, "a file written through the other mount")
	assert.Equal(t, "one", string(got))
}

// openFiles counts the open files of this process.
func openFiles(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// loopsBacking lists the loop devices backed by file.
func loopsBacking(t *testing.T, file string) []string {
	t.Helper()
	paths, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	require.NoError(t, err)
	var devs []string
	for _, p := range paths {
		if b, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(b)) == file {
			devs = append(devs, strings.Split(p, "/")[3])
		}
	}
	return devs
}

// mountOptions returns the mount and superblock options of the mount at
// dir, from /proc/self/mountinfo.
func mountOptions(t *testing.T, dir string) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 6 && f[4] == dir {
			return strings.Split(f[5]+","+f[len(f)-1], ",")
		}
	}
	t.Fatalf("%s is not a mount point", dir)
	return nil
}

// A teardown whose context was cancelled (ctrl-C of a bench or a run)
// still unmounts and removes the disk: an abandoned unmount leaves a mount
// nobody owns and a directory nobody can delete.
func TestRemoveWithCancelledContext(t *testing.T) {
	d := newDisk(t, 0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, d.Remove(ctx))
	assert.False(t, d.Mounted())
	assert.NoDirExists(t, d.Dir)
	assert.NoFileExists(t, d.File)
}

// Clones of a mounted disk in use have its files (also those written
// just before, still in the page cache: the freeze flushes them), an empty
// tmp, and are independent of the source and of each other; the source
// is writable after.
func TestCopyImagesAndAdopt(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	dir := t.TempDir()
	src := boxdisk.Disk{File: filepath.Join(dir, "src.img"), Dir: filepath.Join(dir, "src")}
	var dsts []boxdisk.Disk
	var files []string
	for _, n := range []string{"a", "b"} {
		dsts = append(dsts, boxdisk.Disk{File: filepath.Join(dir, n+".img"), Dir: filepath.Join(dir, n)})
		files = append(files, filepath.Join(dir, "copy-"+n))
	}
	t.Cleanup(func() {
		for _, d := range append(dsts, src) {
			_ = d.Remove(ctx)
		}
	})
	require.NoError(t, src.Make(ctx, 64<<20, 1234, 1234))
	require.NoError(t, os.WriteFile(filepath.Join(src.Workspace(), "f"), []byte("before"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(src.Tmp(), "scratch"), []byte("x"), 0o644))

	require.NoError(t, boxdisk.CopyImages(ctx, src, files))
	for i, d := range dsts {
		require.NoError(t, d.Adopt(ctx, files[i]))
		assert.True(t, d.Mounted())
		assert.NoFileExists(t, files[i], "the copy became the disk")
		got, err := os.ReadFile(filepath.Join(d.Workspace(), "f"))
		require.NoError(t, err)
		assert.Equal(t, "before", string(got))
		assert.NoFileExists(t, filepath.Join(d.Tmp(), "scratch"), "a clone starts with an empty tmp")
	}
	assert.FileExists(t, filepath.Join(src.Tmp(), "scratch"), "the source's tmp is untouched")

	require.NoError(t, os.WriteFile(filepath.Join(src.Workspace(), "f"), []byte("after"), 0o644), "the source is thawed")
	require.NoError(t, os.WriteFile(filepath.Join(dsts[0].Workspace(), "f"), []byte("a's"), 0o644))
	got, err := os.ReadFile(filepath.Join(dsts[1].Workspace(), "f"))
	require.NoError(t, err)
	assert.Equal(t, "before", string(got), "the clones are independent")

	assert.ErrorIs(t, boxdisk.CopyImages(ctx, src, []string{filepath.Join(dir, "new"), files[0], dsts[0].File}), os.ErrExist, "copying onto an existing file")
	assert.NoFileExists(t, filepath.Join(dir, "new"), "a failed copy leaves nothing")
	require.NoError(t, boxdisk.CopyImages(ctx, src, []string{files[0]}))
	assert.ErrorIs(t, dsts[0].Adopt(ctx, files[0]), os.ErrExist, "adopting onto an existing disk")
}

// Disks are copies of a template of their size, made once per directory:
// each copy is a filesystem of its own (what one box writes the other
// does not see), of the size asked, and a disk of another size gets a
// template of its own.
func TestDisksFromTemplate(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	dir := t.TempDir()
	disk := func(name string, size int64) boxdisk.Disk {
		d := boxdisk.Disk{File: filepath.Join(dir, name+".img"), Dir: filepath.Join(dir, name)}
		t.Cleanup(func() { _ = d.Remove(context.Background()) })
		require.NoError(t, d.Make(ctx, size, 1000, 1000))
		return d
	}
	a := disk("a", 64<<20)
	tpl := filepath.Join(dir, ".template-67108864.img")
	before, err := os.Stat(tpl)
	require.NoError(t, err, "the first disk of a size makes its template")
	b := disk("b", 64<<20)
	after, err := os.Stat(tpl)
	require.NoError(t, err)
	assert.True(t, os.SameFile(before, after), "the second disk copies the same template")
	require.NoError(t, os.WriteFile(filepath.Join(a.Workspace(), "mine"), []byte("a's"), 0o644))
	assert.NoFileExists(t, filepath.Join(b.Workspace(), "mine"), "each copy is a filesystem of its own")
	for _, d := range []boxdisk.Disk{a, b} {
		var st unix.Statfs_t
		require.NoError(t, unix.Statfs(d.Dir, &st))
		total := int64(st.Blocks) * st.Bsize
		assert.True(t, total > 48<<20 && total <= 64<<20, "a 64 MiB filesystem: %d bytes of blocks", total)
		fi, err := os.Stat(d.File)
		require.NoError(t, err)
		assert.EqualValues(t, 64<<20, fi.Size())
	}
	c := disk("c", 32<<20)
	assert.FileExists(t, filepath.Join(dir, ".template-33554432.img"))
	var st unix.Statfs_t
	require.NoError(t, unix.Statfs(c.Dir, &st))
	total := int64(st.Blocks) * st.Bsize
	assert.True(t, total > 16<<20 && total <= 32<<20, "a 32 MiB filesystem: %d bytes of blocks", total)
	// A box fills its disk: ENOSPC in it, the template untouched.
	big := make([]byte, 1<<20)
	var werr error
	f, err := os.Create(filepath.Join(c.Workspace(), "fill"))
	require.NoError(t, err)
	for range 64 {
		if _, werr = f.Write(big); werr != nil {
			break
		}
	}
	f.Close()
	assert.ErrorIs(t, werr, unix.ENOSPC)
	fi, err := os.Stat(filepath.Join(dir, ".template-33554432.img"))
	require.NoError(t, err)
	assert.EqualValues(t, 32<<20, fi.Size())
}

// BenchmarkMake: a disk made (copied from its template, mounted, its
// directories made) and removed, beside the same with mkfs.ext4 run for
// each disk as before templates.
func BenchmarkMake(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("box disks need root (mount)")
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		tpl  bool
	}{{"template", true}, {"mkfs each", false}} {
		b.Run(tc.name, func(b *testing.B) {
			dir := b.TempDir()
			tpls := dir
			if !tc.tpl { // a templates dir that cannot be made: each disk formatted on its own
				require.NoError(b, os.WriteFile(filepath.Join(dir, "file"), nil, 0o600))
				tpls = filepath.Join(dir, "file", "templates")
			}
			for b.Loop() {
				d := boxdisk.Disk{File: filepath.Join(dir, "d.img"), Dir: filepath.Join(dir, "d"), Templates: tpls}
				if err := d.Make(ctx, 1<<30, 1000, 1000); err != nil {
					b.Fatal(err)
				}
				if err := d.Remove(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRemove: the teardown of a box's disk after a stage wrote 4 MiB
// in it — Remove (shut down, unmount, delete) against a clean unmount
// then the same deletes, the way Remove went before (a clean unmount
// flushes the journal and the data into the file, and the loop device
// turns the flush into an fsync of it).
func BenchmarkRemove(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("box disks need root (mount)")
	}
	ctx := context.Background()
	data := make([]byte, 4<<20)
	for _, tc := range []struct {
		name   string
		remove func(d boxdisk.Disk) error
	}{
		{"Remove", func(d boxdisk.Disk) error { return d.Remove(ctx) }},
		{"unmount, then delete", func(d boxdisk.Disk) error {
			if err := d.Unmount(ctx); err != nil {
				return err
			}
			return errors.Join(os.Remove(d.Dir), os.Remove(d.File))
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			dir := b.TempDir()
			for b.Loop() {
				b.StopTimer()
				d := boxdisk.Disk{File: filepath.Join(dir, "d.img"), Dir: filepath.Join(dir, "d"), Templates: filepath.Join(dir, "templates")}
				if err := d.Make(ctx, 1<<30, 1000, 1000); err != nil {
					b.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(d.Tmp(), "out"), data, 0o644); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if err := tc.remove(d); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A templates dir holds at most 8 sizes: making a ninth removes the one
// used longest ago (a use, not only the making, counts), and the disk of
// the new size is made from its own template.
func TestTemplatesEvictTheLeastRecentlyUsed(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	dir, tpls := t.TempDir(), t.TempDir()
	disk := func(name string, size int64) {
		d := boxdisk.Disk{File: filepath.Join(dir, name+".img"), Dir: filepath.Join(dir, name), Templates: tpls}
		require.NoError(t, d.Make(ctx, size, 1000, 1000))
		require.NoError(t, d.Remove(ctx))
	}
	disk("used", 32<<20) // the real template of 32 MiB, used below
	old := time.Now().Add(-time.Hour)
	for i := range 7 { // seven more sizes, older than any use
		p := filepath.Join(tpls, ".template-"+strconv.Itoa(1000+i)+".img")
		require.NoError(t, os.WriteFile(p, nil, 0o600))
		require.NoError(t, os.Chtimes(p, old.Add(time.Duration(i)*time.Minute), old.Add(time.Duration(i)*time.Minute)))
	}
	require.NoError(t, os.Chtimes(filepath.Join(tpls, ".template-33554432.img"), old.Add(-time.Hour), old.Add(-time.Hour)))
	disk("used-again", 32<<20) // a use: its template is the newest now

	disk("new", 48<<20)
	assert.FileExists(t, filepath.Join(tpls, ".template-50331648.img"), "the new size's template")
	assert.NoFileExists(t, filepath.Join(tpls, ".template-1000.img"), "the template used longest ago is removed")
	assert.FileExists(t, filepath.Join(tpls, ".template-33554432.img"), "a template used since is kept")
	n, err := filepath.Glob(filepath.Join(tpls, ".template-*.img"))
	require.NoError(t, err)
	assert.Len(t, n, 8)
}

// A template on another filesystem than the disk (the shared templates in
// the home, the data dir elsewhere) is copied where the kernel does not
// copy across filesystems.
func TestTemplateOnAnotherFilesystem(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	tpls := t.TempDir()
	require.NoError(t, unix.Mount("cbtest-tpl", tpls, "tmpfs", 0, "size=64m"))
	t.Cleanup(func() { _ = unix.Unmount(tpls, unix.MNT_DETACH) })
	dir := t.TempDir()
	for _, name := range []string{"a", "b"} { // the first makes the template, the second only copies it
		d := boxdisk.Disk{File: filepath.Join(dir, name+".img"), Dir: filepath.Join(dir, name), Templates: tpls}
		require.NoError(t, d.Make(ctx, 32<<20, 1000, 1000))
		t.Cleanup(func() { _ = d.Remove(context.Background()) })
		require.NoError(t, os.WriteFile(filepath.Join(d.Workspace(), "f"), []byte("x"), 0o644))
	}
	assert.FileExists(t, filepath.Join(tpls, ".template-33554432.img"))
}

// SharedTemplates is under the user's cache dir.
func TestSharedTemplates(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", "/somewhere/cache")
	assert.Equal(t, "/somewhere/cache/cellbox/disk-templates", boxdisk.SharedTemplates())
}
