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
	"strings"
	"time"
)

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
	if err := writeTar(r, cw, real); err != nil {
		streamError(w, cw.started, asError("tar", display, err))
	}
}

// writeTar writes real (a file or a tree) as a tar whose entries are named
// relative to real's parent. Symlinks are stored, not followed.
func writeTar(r *http.Request, w io.Writer, real string) error {
	tw := tar.NewWriter(w)
	parent := filepath.Dir(real)
	err := filepath.WalkDir(real, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := r.Context().Err(); err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		if !fi.Mode().IsRegular() && !fi.IsDir() && link == "" {
			return nil // devices, sockets, fifos: skipped
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(parent, p)
		hdr.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.CopyN(tw, f, hdr.Size)
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

// extractTar extracts regular files, directories, symlinks and hard links
// under dir. An entry whose name or link target would leave dir fails the
// extraction (entries before it stay extracted).
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
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
			os.Chmod(target, mode|0o700)
			dirTimes = append(dirTimes, dirTime{target, hdr.ModTime})
		case tar.TypeReg, tar.TypeRegA:
			if err := replaceable(target); err != nil {
				return err
			}
			f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			os.Chmod(target, mode)
			os.Chtimes(target, hdr.ModTime, hdr.ModTime)
		case tar.TypeSymlink:
			dest := hdr.Linkname
			if !filepath.IsAbs(dest) {
				dest = filepath.Join(filepath.Dir(target), dest)
			}
			if rd, err := resolveExisting(filepath.Clean(dest)); err != nil || !inside(rd) {
				return outside(name, "is a symlink pointing outside the target directory")
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
		default:
			// devices, fifos, pax/gnu metadata entries handled by the reader: skip
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
