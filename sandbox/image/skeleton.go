package image

import (
	"archive/tar"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/cellbox/cellbox/sandbox/backend"
)

// BoxEtc are the /etc files of a box without an image of its own
// (backend.DefaultImage): the docker backend's cellbox/host image carries
// them, the local backend binds a directory holding them.
var BoxEtc = map[string]string{
	"passwd": fmt.Sprintf("root:x:0:0:root:/root:/bin/bash\n%s:x:%d:%d:%s:%s:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
		backend.BoxUser, backend.BoxUID, backend.BoxGID, backend.BoxUser, backend.Workspace),
	"group":         fmt.Sprintf("root:x:0:\n%s:x:%d:\nnogroup:x:65534:\n", backend.BoxUser, backend.BoxGID),
	"hosts":         "127.0.0.1\tlocalhost box\n::1\tlocalhost ip6-localhost ip6-loopback\n",
	"hostname":      "box\n",
	"nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n",
	"resolv.conf":   "",
}

// BoxEtcLinks are the symlinks of BoxEtc's directory (into the host's /usr).
var BoxEtcLinks = map[string]string{"os-release": "../usr/lib/os-release"}

// userLine and groupLine are added to an image's /etc/passwd and /etc/group.
var (
	userLine  = fmt.Sprintf("%s:x:%d:%d:%s:%s:/bin/bash\n", backend.BoxUser, backend.BoxUID, backend.BoxGID, backend.BoxUser, backend.Workspace)
	groupLine = fmt.Sprintf("%s:x:%d:\n", backend.BoxUser, backend.BoxGID)
)

func sortedKeys(m map[string]string) []string {
	k := make([]string, 0, len(m))
	for n := range m {
		k = append(k, n)
	}
	sort.Strings(k)
	return k
}

// SkeletonTar writes the root filesystem of backend.DefaultImage for Docker:
// empty mount points (/usr comes from the host, read-only), the usual
// symlinks into /usr, BoxEtc, and a /workspace owned by the box user. The
// stream is the same byte for byte on every call.
func SkeletonTar(w io.Writer) error {
	tw := tar.NewWriter(w)
	now := time.Unix(0, 0)
	dir := func(name string, mode int64, uid int) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, Uid: uid, Gid: uid, ModTime: now})
	}
	for _, d := range []string{"etc", "usr", "proc", "dev", "sys", "run", "run/cellbox", ".cellbox", "root"} {
		if err := dir(d, 0o755, 0); err != nil {
			return err
		}
	}
	if err := dir("tmp", 0o1777, 0); err != nil {
		return err
	}
	if err := dir("workspace", 0o755, backend.BoxUID); err != nil {
		return err
	}
	links := [][2]string{{"bin", "usr/bin"}, {"lib", "usr/lib"}, {"lib64", "usr/lib64"}, {"sbin", "usr/sbin"}}
	for _, name := range sortedKeys(BoxEtcLinks) {
		links = append(links, [2]string{"etc/" + name, BoxEtcLinks[name]})
	}
	for _, l := range links {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: l[0], Linkname: l[1], Mode: 0o777, ModTime: now}); err != nil {
			return err
		}
	}
	for _, n := range sortedKeys(BoxEtc) {
		body := BoxEtc[n]
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "etc/" + n, Mode: 0o644, Size: int64(len(body)), ModTime: now}); err != nil {
			return err
		}
		if _, err := io.WriteString(tw, body); err != nil {
			return err
		}
	}
	return tw.Close()
}
