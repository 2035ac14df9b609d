package local

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/image"
)

// imageMarker is the file `cellbox image build` writes last into a rootfs
// it made, the one image.Read reads: the image's name, suite, mirror,
// packages, size and build time (to the nanosecond).
const imageMarker = ".cellbox-image.json"

// localDigest is an image's build id and the stamp of the file it was
// read from.
type localDigest struct {
	stamp  fileStamp
	digest string
}

// fileStamp tells one version of a file from another without reading it:
// a rebuilt image's marker is a new file (a new rootfs renamed into
// place), one rewritten in place has a new modification time.
type fileStamp struct {
	dev, ino, size   uint64
	mtimeNs, ctimeNs int64
}

func stampOf(fi fs.FileInfo) (fileStamp, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileStamp{}, false
	}
	return fileStamp{dev: uint64(st.Dev), ino: st.Ino, size: uint64(st.Size),
		mtimeNs: st.Mtim.Nano(), ctimeNs: st.Ctim.Nano()}, true
}

// ImageDigest says which build of image a box made now would run
// (backend.ImageDigester):
//
//   - cellbox/NAME built by `cellbox image build`: "local:" and the
//     SHA-256 of the rootfs's marker (imageMarker), which holds the
//     build's time, so every build has an id of its own, and a rootfs
//     copied to other machines keeps its id there. The marker is read
//     again only when its file changed: each call costs one stat.
//   - a rootfs without a marker (an older or hand-made one): "local-dir:"
//     and its directory's device, inode and modification time — stable
//     while that directory stays, new when another is put in its place
//     (as a build does); changes made inside it are not seen.
//   - "" for backend.DefaultImage (the host's own /usr, which no digest
//     describes), a name that is not cellbox/NAME, a backend without an
//     images directory, and an image not built.
func (b *Backend) ImageDigest(ctx context.Context, img string) (string, error) {
	if img == backend.DefaultImage || b.images == "" {
		return "", nil
	}
	m := imageName.FindStringSubmatch(img)
	if m == nil {
		return "", nil
	}
	rootfs := image.RootfsDir(b.images, m[1])
	marker := filepath.Join(rootfs, imageMarker)
	fi, err := os.Stat(marker)
	if errors.Is(err, fs.ErrNotExist) {
		return dirDigest(rootfs)
	} else if err != nil {
		return "", fmt.Errorf("image %s: %w", img, err)
	}
	stamp, ok := stampOf(fi)
	if !ok {
		return "", nil
	}
	b.digestsMu.Lock()
	c, ok := b.digests[m[1]]
	b.digestsMu.Unlock()
	if ok && c.stamp == stamp {
		return c.digest, nil
	}
	data, err := os.ReadFile(marker)
	if err != nil {
		return "", fmt.Errorf("image %s: %w", img, err)
	}
	sum := sha256.Sum256(data)
	d := "local:" + hex.EncodeToString(sum[:])
	// Replaced between the stat and the read: the stamp is the old
	// file's, so the next call reads the new one again.
	b.digestsMu.Lock()
	defer b.digestsMu.Unlock()
	if b.digests == nil {
		b.digests = map[string]localDigest{}
	}
	b.digests[m[1]] = localDigest{stamp: stamp, digest: d}
	return d, nil
}

// dirDigest identifies a rootfs without a marker by its directory; "" when
// there is none.
func dirDigest(rootfs string) (string, error) {
	fi, err := os.Stat(rootfs)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	} else if err != nil {
		return "", err
	}
	s, ok := stampOf(fi)
	if !ok {
		return "", nil
	}
	return fmt.Sprintf("local-dir:%d:%d:%d", s.dev, s.ino, s.mtimeNs), nil
}
