package agent

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cellbox/cellbox/internal/sparse"
)

// Sparse files in the agent's tar streams (both ways): a regular file with
// large holes goes as its data only — the entry's Size is the bytes of
// data — with two PAX records saying where the data lies. Snapshots,
// restores, transfers and forks of a sparse file then cost time in
// proportion to its data, not its size (a 1 GiB file of holes took 6-8 s).
// The streams are the agent protocol's own (host and agent of one
// version), never handed to another tar reader; GNU's sparse format
// would be the portable one, but archive/tar writes none of it.
const (
	PAXSparseSize = "CELLBOX.sparse.size" // the file's size, holes included
	PAXSparseMap  = "CELLBOX.sparse.map"  // its data segments (sparse.Map.Encode)
)

// Which files go sparse: holes of at least sparseMinHoles bytes, in at most
// sparseMaxSegments segments of data (the map is a PAX record).
const (
	sparseMinHoles    = 1 << 20
	sparseMaxSegments = 1024
)

// SparseOf returns the map of a tar entry written with the sparse records
// (ok false for any other), checked against the entry's Size: a map from a
// box is hostile.
func SparseOf(hdr *tar.Header) (m sparse.Map, ok bool, err error) {
	size, has := hdr.PAXRecords[PAXSparseSize]
	if !has {
		return sparse.Map{}, false, nil
	}
	n, err := strconv.ParseInt(size, 10, 64)
	if err != nil {
		return sparse.Map{}, true, fmt.Errorf("tar entry %q: bad %s %q", hdr.Name, PAXSparseSize, size)
	}
	m, err = sparse.Parse(n, hdr.Size, hdr.PAXRecords[PAXSparseMap])
	if err != nil {
		return sparse.Map{}, true, fmt.Errorf("tar entry %q: %w", hdr.Name, err)
	}
	return m, true, nil
}

// SetSparse makes hdr the entry of a file of map m: its Size the data's.
func SetSparse(hdr *tar.Header, m sparse.Map) {
	if hdr.PAXRecords == nil {
		hdr.PAXRecords = map[string]string{}
	}
	hdr.PAXRecords[PAXSparseSize] = strconv.FormatInt(m.Size, 10)
	hdr.PAXRecords[PAXSparseMap] = m.Encode()
	hdr.Size = m.Data()
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w       io.Writer
	n       int64
	started bool
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.started = true
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func (s *server) handleTarOut(w http.ResponseWriter, r *http.Request) {
	display, real, err := s.resolve("tar", r.URL.Query().Get("path"), false)
	if err == nil {
		_, err = os.Lstat(real)
	}
	if err != nil {
		writeError(w, asError("tar", display, err))
		return
	}
	w.Header().Set("Trailer", errorTrailer)
	w.Header().Set("Content-Type", "application/x-tar")
	cw := &countingWriter{w: w}
	if err := writeTar(r, cw, real, display); err != nil {
		streamError(w, cw.started, asError("tar", display, err))
	}
}

// writeTar writes real (a file or a tree, display as the caller named it)
// as a tar whose entries are named relative to real's parent. Symlinks are
// stored, not followed. An error names the entry it is about.
func writeTar(r *http.Request, w io.Writer, real, display string) error {
	tw := tar.NewWriter(w)
	parent := filepath.Dir(real)
	// The first name of each file with more than one (a hard link), by
	// device and inode: the later names go out as links to it.
	type inode struct{ dev, ino uint64 }
	firstName := map[inode]string{}
	// failed says which entry could not be read and what to do about it.
	failed := func(p string, err error) error {
		rel, _ := filepath.Rel(real, p)
		shown := filepath.Join(display, rel)
		switch {
		case errors.Is(err, fs.ErrPermission):
			return &Error{Op: "tar", Path: shown, Code: CodeInvalid, Message: fmt.Sprintf("tar %s: %s cannot be read (permission denied); make it readable (chmod u+r, or u+rx for a directory) or remove it, then try again", display, shown)}
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return &Error{Op: "tar", Path: shown, Message: fmt.Sprintf("tar %s: %s got shorter while it was read (something is writing it); try again when it is not being written", display, shown)}
		}
		return asError("tar", shown, err)
	}
	err := filepath.WalkDir(real, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && p != real {
			return nil // removed since its directory was listed
		}
		if err != nil {
			return failed(p, err)
		}
		if err := r.Context().Err(); err != nil {
			return err
		}
		fi, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return failed(p, err)
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return failed(p, err)
			}
		}
		if !fi.Mode().IsRegular() && !fi.IsDir() && link == "" && fi.Mode()&fs.ModeNamedPipe == 0 {
			return nil // devices, sockets: skipped
		}
		rel, _ := filepath.Rel(parent, p)
		name := filepath.ToSlash(rel)
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode().IsRegular() && st.Nlink > 1 {
			id := inode{uint64(st.Dev), st.Ino}
			if first, ok := firstName[id]; ok {
				return tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeLink, Linkname: first, Mode: int64(fi.Mode().Perm()), ModTime: fi.ModTime().Truncate(time.Second)})
			}
			firstName[id] = name
		}
		var f *os.File // opened before its header goes out, so that a refusal leaves no half entry
		if fi.Mode().IsRegular() {
			if f, err = os.Open(p); err != nil {
				return failed(p, err)
			}
			defer f.Close()
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name = name
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		// A tar header holds whole seconds, and the writer rounds to the
		// nearest: a file restored could get a time in the future (and
		// look newer than what is built from it). Cut down instead.
		hdr.ModTime = hdr.ModTime.Truncate(time.Second)
		var data io.Reader = f
		if f != nil && hdr.Size >= sparseMinHoles {
			m, err := sparse.Of(f, hdr.Size)
			if err != nil {
				return failed(p, err)
			}
			if m.Size-m.Data() >= sparseMinHoles && len(m.Segs) <= sparseMaxSegments {
				SetSparse(hdr, m)
				data = m.Reader(f)
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if f == nil {
			return nil
		}
		n, err := io.Copy(tw, io.LimitReader(data, hdr.Size))
		if err == nil && n < hdr.Size {
			return failed(p, io.ErrUnexpectedEOF)
		}
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

func (s *server) handleTarIn(w http.ResponseWriter, r *http.Request) {
	display, real, err := s.resolve("untar", r.URL.Query().Get("dir"), false)
	if err == nil {
		err = os.MkdirAll(real, 0o755)
	}
	if err == nil {
		err = extractTar(r.Body, real, display)
	}
	if err != nil {
		writeError(w, asError("untar", display, err))
		return
	}
	writeJSON(w, struct{}{})
}

// extractTar extracts regular files, directories, symlinks, hard links and
// FIFOs under dir. An entry whose name or hard link would leave dir, or whose
// path goes through a symlink that leaves dir, fails the extraction
// (entries before it stay extracted). Symlinks themselves may point
// anywhere: they are made, never followed.
func extractTar(r io.Reader, dir, display string) error {
	tr := tar.NewReader(r)
	type dirTime struct {
		path string
		t    time.Time
	}
	var dirTimes []dirTime
	outside := func(name, why string) error {
		return &Error{Op: "untar", Path: display, Code: CodeOutsideWorkspace,
			Message: fmt.Sprintf("untar into %s: entry %q %s; nothing after it was extracted", display, name, why)}
	}
	inside := func(p string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return &Error{Op: "untar", Path: display, Code: CodeInvalid, Message: fmt.Sprintf("untar into %s: bad tar stream: %v", display, err)}
		}
		name := hdr.Name
		if filepath.IsAbs(name) || strings.HasPrefix(name, "/") {
			return outside(name, "has an absolute name")
		}
		clean := filepath.Clean(name)
		if clean == ".." || strings.HasPrefix(clean, "../") || strings.IndexByte(name, 0) >= 0 {
			return outside(name, "escapes the target directory")
		}
		if clean == "." {
			continue
		}
		target := filepath.Join(dir, clean)
		// A symlink extracted earlier must not lead the entry out of dir.
		parent, err := resolveExisting(filepath.Dir(target))
		if err != nil {
			return err
		}
		if !inside(parent) {
			return outside(name, "goes through a symlink that leaves the target directory")
		}
		target = filepath.Join(parent, filepath.Base(target))
		mode := fs.FileMode(hdr.Mode).Perm()
		switch hdr.Typeflag {
		case tar.TypeDir:
			// A symlink already there (an earlier entry) is replaced,
			// not followed by the chmod below.
			if fi, err := os.Lstat(target); err == nil && !fi.IsDir() {
				if err := os.Remove(target); err != nil {
					return err
				}
			}
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
			os.Chmod(target, mode|0o700)
			dirTimes = append(dirTimes, dirTime{target, hdr.ModTime})
		case tar.TypeReg, tar.TypeRegA:
			if err := replaceable(target); err != nil {
				return err
			}
			f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, mode)
			if err != nil {
				return err
			}
			if m, ok, perr := SparseOf(hdr); perr != nil {
				err = &Error{Op: "untar", Path: display, Code: CodeInvalid, Message: fmt.Sprintf("untar into %s: %v; nothing after it was extracted", display, perr)}
			} else if ok {
				_, err = sparse.Write(f, tr, m) // its data, its holes
			} else {
				_, err = sparse.Copy(f, tr) // zeros as holes, as they were
			}
			f.Chmod(mode)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			os.Chtimes(target, hdr.ModTime, hdr.ModTime)
		case tar.TypeSymlink:
			// Kept as it is, wherever it points: a link is only a name,
			// resolved in this box's own filesystem (as one the box's
			// code makes with ln -s), and no later entry is written
			// through it (the parent check above).
			if hdr.Linkname == "" || strings.IndexByte(hdr.Linkname, 0) >= 0 {
				return &Error{Op: "untar", Path: display, Code: CodeInvalid, Message: fmt.Sprintf("untar into %s: entry %q is a symlink with an empty target or a NUL byte; nothing after it was extracted", display, name)}
			}
			if err := replaceable(target); err != nil {
				return err
			}
			if err := os.Symlink(hdr.Linkname, target); err != nil {
				return err
			}
		case tar.TypeLink:
			src := filepath.Clean(hdr.Linkname)
			if filepath.IsAbs(src) || src == ".." || strings.HasPrefix(src, "../") {
				return outside(name, "is a hard link to outside the target directory")
			}
			rs, err := resolveExisting(filepath.Join(dir, src))
			if err != nil || !inside(rs) {
				return outside(name, "is a hard link to outside the target directory")
			}
			if err := replaceable(target); err != nil {
				return err
			}
			if err := os.Link(rs, target); err != nil {
				return err
			}
		case tar.TypeFifo:
			if err := replaceable(target); err != nil {
				return err
			}
			if err := syscall.Mkfifo(target, uint32(mode)); err != nil {
				return &os.PathError{Op: "mkfifo", Path: target, Err: err}
			}
			os.Chmod(target, mode) // past the umask
		default:
			// devices, pax/gnu metadata entries handled by the reader: skip
		}
	}
	for i := len(dirTimes) - 1; i >= 0; i-- {
		os.Chtimes(dirTimes[i].path, dirTimes[i].t, dirTimes[i].t)
	}
	return nil
}

// replaceable removes what is at p unless it is a directory.
func replaceable(p string) error {
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return &Error{Op: "untar", Path: p, Code: CodeIsDir, Message: fmt.Sprintf("untar: %s is a directory in the way of a file", p)}
	}
	return os.Remove(p)
}
