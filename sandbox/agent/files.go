package agent

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unicode/utf8"

	"github.com/cellbox/cellbox/internal/readall"
)

const (
	maxReadBytesCap = 8 << 20 // ReadRequest.MaxBytes and ByteLimit are capped here
	binarySniff     = 8 << 10
	defaultTreeMax  = 1000
)

// abs makes p absolute (relative to the workspace) and clean. This is the
// path the caller sees in messages and results.
func (s *server) abs(p string) string {
	if !filepath.IsAbs(p) {
		p = filepath.Join(s.workspace, p)
	}
	return filepath.Clean(p)
}

// resolve returns the real path of p (symlinks resolved: the whole path, or
// with keepLast the parent only) after checking that it lies under an
// allowed root. p need not exist; its longest existing prefix is resolved.
func (s *server) resolve(op, p string, keepLast bool) (display, real string, err error) {
	if p == "" {
		return "", "", &Error{Op: op, Code: CodeInvalid, Message: op + ": path is required"}
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", "", &Error{Op: op, Code: CodeInvalid, Message: op + ": path contains a NUL byte"}
	}
	display = s.abs(p)
	target := display
	var last string
	if keepLast && display != "/" {
		target, last = filepath.Dir(display), filepath.Base(display)
	}
	real, err = resolveExisting(target)
	if err != nil {
		return display, "", asError(op, display, err)
	}
	if last != "" {
		real = filepath.Join(real, last)
	}
	if !within(real, s.roots) {
		msg := fmt.Sprintf("%s %s: outside the workspace; file tools may only use %s", op, display, strings.Join(s.roots, " and "))
		if real != display {
			msg = fmt.Sprintf("%s %s: resolves to %s, outside the workspace; file tools may only use %s", op, display, real, strings.Join(s.roots, " and "))
		}
		return display, "", &Error{Op: op, Path: display, Code: CodeOutsideWorkspace, Message: msg}
	}
	return display, real, nil
}

// resolveExisting resolves symlinks in the longest existing prefix of the
// clean absolute path p and appends the rest (which, not existing, holds no
// symlinks). A dangling symlink is followed to where it points, so that
// creating a file through it is checked where the file would land.
func resolveExisting(p string) (string, error) {
	rest := ""
	for hops := 0; hops < 64; hops++ {
		r, err := filepath.EvalSymlinks(p)
		if err == nil {
			return filepath.Join(r, rest), nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		if fi, lerr := os.Lstat(p); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			target, err := os.Readlink(p)
			if err != nil {
				return "", err
			}
			if !filepath.IsAbs(target) {
				dir, err := filepath.EvalSymlinks(filepath.Dir(p))
				if err != nil {
					return "", err
				}
				target = filepath.Join(dir, target)
			}
			p = filepath.Clean(target)
			continue
		}
		parent := filepath.Dir(p)
		if parent == p {
			return "", err
		}
		rest = filepath.Join(filepath.Base(p), rest)
		p = parent
	}
	return "", &fs.PathError{Op: "resolve", Path: p, Err: syscall.ELOOP}
}

// within reports whether p is one of roots or under one.
func within(p string, roots []string) bool {
	for _, r := range roots {
		if p == r || strings.HasPrefix(p, r+"/") || r == "/" {
			return true
		}
	}
	return false
}

func fileType(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "file"
	case m.IsDir():
		return "dir"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	}
	return "other"
}

func (s *server) handleStat(w http.ResponseWriter, r *http.Request) {
	var req pathRequest
	if !readJSON(w, r, "stat", &req) {
		return
	}
	display, real, err := s.resolve("stat", req.Path, true)
	if err != nil {
		writeError(w, asError("stat", display, err))
		return
	}
	fi, err := os.Lstat(real)
	if err != nil {
		writeError(w, asError("stat", display, err))
		return
	}
	info := FileInfo{Path: display, Type: fileType(fi.Mode()), Size: fi.Size(), Mode: uint32(fi.Mode().Perm()), ModTime: fi.ModTime()}
	info.Real, _ = resolveExisting(real)
	writeJSON(w, info)
}

// --- read ---

func (s *server) handleRead(w http.ResponseWriter, r *http.Request) {
	var req ReadRequest
	if !readJSON(w, r, "read", &req) {
		return
	}
	out := bufs.Get()
	defer bufs.Put(out)
	res, err := s.read(req, out)
	if err != nil {
		writeError(w, asError("read", s.abs(req.Path), err))
		return
	}
	meta, _ := json.Marshal(res)
	w.Header().Set(readResultHeader, string(meta))
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	// Announced: sent in one piece, not chunked, and read by the host
	// into one buffer of its size.
	w.Header().Set("Content-Length", strconv.Itoa(out.Len()))
	w.Write(out.Bytes())
}

// A read's window, a write's body and the line reader are kept for the
// next call (see readall.BufferPool); a buffer that grew past what the
// file tools send and take (a default window, a write of the default
// limit) is not: a rare 8 MiB read is not held on to.
var (
	bufs        = readall.BufferPool{Max: DefaultWriteBytes + bytes.MinRead}
	lineReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 64<<10) }}
)

// readResultHeader carries a read's ReadResult but its Content, which is
// the body.
const readResultHeader = "Cellbox-Read-Result"

// read reads a window of a file: its content into out, the rest into the
// result (whose Content stays empty).
func (s *server) read(req ReadRequest, out *bytes.Buffer) (ReadResult, error) {
	display, real, err := s.resolve("read", req.Path, false)
	if err != nil {
		return ReadResult{}, err
	}
	f, fi, err := openFile("read", display, real, os.O_RDONLY, 0)
	if err != nil {
		return ReadResult{}, err
	}
	defer f.Close()
	if fi.IsDir() {
		return ReadResult{}, &Error{Op: "read", Path: display, Code: CodeIsDir, Message: fmt.Sprintf("read %s: is a directory (list it instead)", display)}
	}
	if req.ByteOffset < 0 || req.ByteLimit < 0 || req.Offset < 0 || req.Limit < 0 {
		return ReadResult{}, &Error{Op: "read", Path: display, Code: CodeInvalid, Message: fmt.Sprintf("read %s: offsets and limits must not be negative", display)}
	}
	maxBytes := req.MaxBytes
	if maxBytes <= 0 {
		maxBytes = DefaultReadBytes
	}
	maxBytes = min(maxBytes, maxReadBytesCap)
	res := ReadResult{Size: fi.Size(), Encoding: "utf-8"}
	if req.ByteLimit > 0 {
		return readBytes(f, res, req.ByteOffset, min(req.ByteLimit, int64(maxBytes)), req.ByteLimit > int64(maxBytes), out)
	}
	head := make([]byte, binarySniff)
	n, err := io.ReadFull(f, head)
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return res, err
	}
	if isBinary(head[:n], n < binarySniff) {
		return readBinary(f, res, req.Offset, maxBytes, out)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return res, err
	}
	return readLines(f, res, req, maxBytes, out)
}

// isBinary: a NUL byte, or invalid UTF-8 (a rune cut at the end of a sniff
// window that is not the whole file is fine).
func isBinary(b []byte, whole bool) bool {
	if bytes.IndexByte(b, 0) >= 0 {
		return true
	}
	if !whole {
		for i := 0; i < utf8.UTFMax-1 && len(b) > 0; i++ {
			if utf8.Valid(b) {
				return false
			}
			b = b[:len(b)-1]
		}
	}
	return !utf8.Valid(b)
}

// readBytes returns a raw byte window; text when it is valid UTF-8 without
// NUL bytes, base64 otherwise. It is truncated when the window was capped
// (not the caller's own limit) and the file goes on. The window is read
// into out's own room (out is empty): text stays there as it is; only
// binary is copied, to be encoded over it.
func readBytes(f *os.File, res ReadResult, off, limit int64, capped bool, out *bytes.Buffer) (ReadResult, error) {
	out.Grow(int(limit))
	buf := out.AvailableBuffer()[:limit]
	n, err := f.ReadAt(buf, off)
	if err != nil && err != io.EOF {
		return res, err
	}
	buf = buf[:n]
	if isBinary(buf, true) {
		res.Encoding = "base64"
		out.Write(base64.StdEncoding.AppendEncode(out.AvailableBuffer(), bytes.Clone(buf)))
	} else {
		out.Write(buf) // in place: buf is out's room
	}
	res.Truncated = capped && off+int64(n) < res.Size
	return res, nil
}

// readBinary reads a window of a binary file asked for by line: Offset
// counts bytes instead (1-indexed, as lines; 0 = 1), the window is
// maxBytes, always base64 (a window of a binary file may look like text),
// and NextOffset is the byte to read on from, so that a reader following it
// pages through the whole file. Line numbers stay 0.
func readBinary(f *os.File, res ReadResult, offset, maxBytes int, out *bytes.Buffer) (ReadResult, error) {
	start := int64(max(offset, 1)) - 1 // 0-indexed
	if start > 0 && start >= res.Size {
		return res, &Error{Op: "read", Code: CodeInvalid, Message: fmt.Sprintf("read: offset %d is past the end of the file (%d bytes; a binary file's offset counts bytes)", offset, res.Size)}
	}
	buf := make([]byte, min(int64(maxBytes), res.Size-start))
	n, err := f.ReadAt(buf, start)
	if err != nil && err != io.EOF {
		return res, err
	}
	res.Encoding = "base64"
	out.Write(base64.StdEncoding.AppendEncode(out.AvailableBuffer(), buf[:n]))
	if end := start + int64(n); end < res.Size {
		res.Truncated = true
		res.NextOffset = int(end) + 1
	}
	return res, nil
}

// readLines streams the file and keeps the requested line window; lines
// longer than MaxReadLineChars characters are cut and marked with
// LineCutMarker. It scans to the end to count the lines.
func readLines(f *os.File, res ReadResult, req ReadRequest, maxBytes int, out *bytes.Buffer) (ReadResult, error) {
	start := max(req.Offset, 1)
	maxLines := req.MaxLines
	if maxLines <= 0 {
		maxLines = DefaultReadLines
	}
	limit, capped := maxLines, true
	if req.Limit > 0 && req.Limit <= maxLines {
		limit, capped = req.Limit, false
	}
	const keep = MaxReadLineChars * utf8.UTFMax // bytes kept of one line: enough for MaxReadLineChars runes
	br := lineReaders.Get().(*bufio.Reader)
	br.Reset(f)
	defer func() { br.Reset(nil); lineReaders.Put(br) }()
	out.Grow(int(min(int64(maxBytes), res.Size))) // a window is at most maxBytes (but its first line): no regrowth
	var cur []byte
	line, taken, done, lineCut := 0, 0, false, false
	for {
		if done && res.NextOffset != 0 {
			// The window is taken: only count the lines left.
			n, err := countLines(br)
			if err != nil {
				return res, err
			}
			line += n
			break
		}
		inWindow := !done && line+1 >= start
		cur = cur[:0]
		long, got := false, false
		var err error
		for {
			var chunk []byte
			chunk, err = br.ReadSlice('\n')
			got = got || len(chunk) > 0
			if inWindow {
				room := keep - len(cur)
				if room < len(chunk) {
					chunk, long = chunk[:max(room, 0)], true
				}
				cur = append(cur, chunk...)
			}
			if err != bufio.ErrBufferFull {
				break
			}
		}
		if err != nil && err != io.EOF {
			return res, err
		}
		if !got {
			break
		}
		line++
		switch {
		case inWindow:
			text, cut := renderLine(cur, long, err == nil)
			if taken > 0 && out.Len()+len(text) > maxBytes {
				done, capped, res.NextOffset = true, true, line
				break
			}
			out.Write(text)
			lineCut = lineCut || cut
			taken++
			if res.StartLine == 0 {
				res.StartLine = line
			}
			res.EndLine = line
			done = taken == limit
		case done && res.NextOffset == 0:
			res.NextOffset = line
		}
		if err == io.EOF {
			break
		}
	}
	res.TotalLines = line
	if start > 1 && start > line {
		return res, &Error{Op: "read", Code: CodeInvalid, Message: fmt.Sprintf("read: offset %d is past the end of the file (%d lines)", start, line)}
	}
	res.Truncated = lineCut || capped && res.NextOffset != 0
	if !utf8.Valid(out.Bytes()) { // (ToValidUTF8 alone decodes every rune to find out)
		valid := bytes.ToValidUTF8(out.Bytes(), []byte("\uFFFD"))
		out.Reset()
		out.Write(valid)
	}
	return res, nil
}

// countLines counts the lines left in br, as readLines does: each newline
// ends one, and bytes after the last newline are one more.
func countLines(br *bufio.Reader) (int, error) {
	n, last := 0, byte('\n')
	for {
		chunk, err := br.ReadSlice('\n')
		if len(chunk) > 0 {
			n += bytes.Count(chunk, []byte{'\n'})
			last = chunk[len(chunk)-1]
		}
		switch err {
		case nil, bufio.ErrBufferFull:
		case io.EOF:
			if last != '\n' {
				n++
			}
			return n, nil
		default:
			return n, err
		}
	}
}

// renderLine returns a line with its terminator, cut to MaxReadLineChars
// characters and marked if it is longer (long: bytes were dropped
// already). A line that needs no cut is b itself: no copy.
func renderLine(b []byte, long, newline bool) ([]byte, bool) {
	s, nl := b, ""
	switch {
	case long:
		if newline {
			nl = "\n"
		}
	case bytes.HasSuffix(s, []byte("\r\n")):
		s, nl = s[:len(s)-2], "\r\n"
	case bytes.HasSuffix(s, []byte("\n")):
		s, nl = s[:len(s)-1], "\n"
	}
	if !long && len(s) <= MaxReadLineChars {
		return b, false
	}
	i, n := 0, 0
	for i < len(s) && n < MaxReadLineChars {
		_, size := utf8.DecodeRune(s[i:])
		i += size
		n++
	}
	if i == len(s) && !long {
		return b, false
	}
	return slices.Concat(s[:i:i], []byte(LineCutMarker), []byte(nl)), true
}

// --- write ---

// handleWrite takes the data as the raw body and the rest as query
// parameters (path, append=1, max_bytes, mode in octal).
func (s *server) handleWrite(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	req := WriteRequest{Path: q.Get("path"), Append: q.Get("append") == "1"}
	var err error
	if v := q.Get("max_bytes"); v != "" {
		req.MaxBytes, err = strconv.ParseInt(v, 10, 64)
	}
	if v := q.Get("mode"); v != "" && err == nil {
		var m uint64
		m, err = strconv.ParseUint(v, 8, 32)
		req.Mode = uint32(m)
	}
	if err != nil {
		writeError(w, &Error{Op: "write", Path: req.Path, Code: CodeInvalid, Message: fmt.Sprintf("write %s: bad query %q: %v", req.Path, r.URL.RawQuery, err)})
		return
	}
	limit := req.MaxBytes
	if limit <= 0 {
		limit = DefaultWriteBytes
	}
	// One byte over the limit is enough for write to refuse it. The body
	// is read into a kept buffer (see bufs), grown to its announced size
	// at once, not by doubling.
	body := bufs.Get()
	defer bufs.Put(body)
	if r.ContentLength > 0 && r.ContentLength <= limit {
		body.Grow(int(r.ContentLength) + bytes.MinRead) // room for ReadFrom to see EOF
	}
	if _, err = body.ReadFrom(io.LimitReader(r.Body, limit+1)); err != nil {
		writeError(w, asError("write", req.Path, err))
		return
	}
	req.Data = body.Bytes()
	res, err := s.write(req)
	if err != nil {
		writeError(w, asError("write", s.abs(req.Path), err))
		return
	}
	writeJSON(w, res)
}

func (s *server) write(req WriteRequest) (WriteResult, error) {
	display, real, err := s.resolve("write", req.Path, false)
	if err != nil {
		return WriteResult{}, err
	}
	limit := req.MaxBytes
	if limit <= 0 {
		limit = DefaultWriteBytes
	}
	if int64(len(req.Data)) > limit {
		return WriteResult{}, &Error{Op: "write", Path: display, Code: CodeTooLarge, Message: fmt.Sprintf(
			"write %s: more than the %d-byte write limit; write it in chunks with append, or upload it", display, limit)}
	}
	if !req.Append {
		n, created, err := writeAtomic(real, bytes.NewReader(req.Data), fs.FileMode(req.Mode))
		return WriteResult{Path: display, Size: n, Created: created}, err
	}
	mode := fs.FileMode(req.Mode).Perm()
	if mode == 0 {
		mode = 0o644
	}
	if err := os.MkdirAll(filepath.Dir(real), 0o755); err != nil {
		return WriteResult{}, err
	}
	_, statErr := os.Stat(real)
	f, _, err := openFile("write", display, real, os.O_WRONLY|os.O_APPEND|os.O_CREATE, mode)
	if err != nil {
		return WriteResult{}, err
	}
	if _, err := f.Write(req.Data); err != nil {
		f.Close()
		return WriteResult{}, err
	}
	fi, err := f.Stat()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return WriteResult{}, err
	}
	return WriteResult{Path: display, Size: fi.Size(), Created: statErr != nil}, nil
}

// openFile opens a regular file or a directory for op and returns it with
// its fstat. Anything else (a FIFO, a socket, a device) is refused with
// CodeInvalid: opening a FIFO waits for its other end and reading a device
// may never end, which would hang the request. O_NONBLOCK makes the open
// itself return at once (it changes nothing for regular files); the stat
// before the open gives the clear error, the fstat after it closes the race
// with a file swapped in between.
func openFile(op, display, real string, flag int, perm fs.FileMode) (*os.File, fs.FileInfo, error) {
	if fi, err := os.Stat(real); err == nil {
		if err := regularOrDir(op, display, fi); err != nil {
			return nil, nil, err
		}
	}
	f, err := os.OpenFile(real, flag|syscall.O_NONBLOCK, perm)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err == nil {
		err = regularOrDir(op, display, fi)
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}

func regularOrDir(op, display string, fi fs.FileInfo) error {
	if fi.Mode().IsRegular() || fi.IsDir() {
		return nil
	}
	kind := "special file"
	switch m := fi.Mode(); {
	case m&fs.ModeNamedPipe != 0:
		kind = "named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		kind = "unix socket"
	case m&fs.ModeDevice != 0:
		kind = "device"
	}
	return &Error{Op: op, Path: display, Code: CodeInvalid, Message: fmt.Sprintf(
		"%s %s: is a %s, not a regular file; %s works on regular files only", op, display, kind, op)}
}

// writeAtomic writes r to a temp file beside path and renames it over path.
// An existing file keeps its mode (and owner); a new one gets mode (0644).
func writeAtomic(path string, r io.Reader, mode fs.FileMode) (n int64, created bool, err error) {
	old, statErr := os.Stat(path)
	switch {
	case statErr == nil && old.IsDir():
		return 0, false, syscall.EISDIR
	case statErr == nil:
		mode = old.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	case !errors.Is(statErr, fs.ErrNotExist):
		return 0, false, statErr
	default:
		created = true
		if mode = mode.Perm(); mode == 0 {
			mode = 0o644
		}
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, created, err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".cellbox-*")
	if err != nil {
		return 0, created, err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if n, err = io.Copy(tmp, r); err != nil {
		return n, created, err
	}
	if err = tmp.Chmod(mode); err != nil {
		return n, created, err
	}
	if st, ok := statOwner(old); ok && !created {
		tmp.Chown(st.Uid, st.Gid) // best effort: only root may give files away
	}
	if err = tmp.Close(); err != nil {
		return n, created, err
	}
	return n, created, os.Rename(tmp.Name(), path)
}

type owner struct{ Uid, Gid int }

func statOwner(fi fs.FileInfo) (owner, bool) {
	if fi == nil {
		return owner{}, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return owner{}, false
	}
	return owner{int(st.Uid), int(st.Gid)}, true
}

// --- raw bytes ---

// streamError reports an error after a raw stream's body started, in the
// trailer; before that, as a normal error response.
func streamError(w http.ResponseWriter, started bool, e *Error) {
	if !started {
		writeError(w, e)
		return
	}
	short := *e // a trailer is bounded (net/http refuses one of a few KiB): a deep path is cut
	short.Path, short.Message = middle(short.Path, 512), middle(short.Message, 1024)
	b, _ := json.Marshal(short)
	w.Header().Set(errorTrailer, string(b))
}

// middle cuts s to at most n bytes (n >= 8) by taking out its middle,
// marked with "…", on rune boundaries.
func middle(s string, n int) string {
	if len(s) <= n {
		return s
	}
	head, tail := s[:n/2], s[len(s)-n/2+4:]
	return strings.ToValidUTF8(head, "") + "…" + strings.ToValidUTF8(tail, "")
}

func (s *server) handleDownload(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Query().Get("path")
	display, real, err := s.resolve("download", p, false)
	if err != nil {
		writeError(w, asError("download", display, err))
		return
	}
	f, fi, err := openFile("download", display, real, os.O_RDONLY, 0)
	if err != nil {
		writeError(w, asError("download", display, err))
		return
	}
	defer f.Close()
	if fi.IsDir() {
		writeError(w, &Error{Op: "download", Path: display, Code: CodeIsDir, Message: fmt.Sprintf("download %s: is a directory (use a tar for directories)", display)})
		return
	}
	w.Header().Set("Trailer", errorTrailer)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, f); err != nil {
		streamError(w, true, asError("download", display, err))
	}
}

func (s *server) handleUpload(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Query().Get("path")
	display, real, err := s.resolve("upload", p, false)
	if err != nil {
		writeError(w, asError("upload", display, err))
		return
	}
	var mode uint64
	if m := r.URL.Query().Get("mode"); m != "" {
		if mode, err = strconv.ParseUint(m, 8, 32); err != nil {
			writeError(w, &Error{Op: "upload", Path: display, Code: CodeInvalid, Message: fmt.Sprintf("upload %s: bad mode %q", display, m)})
			return
		}
	}
	n, created, err := writeAtomic(real, r.Body, fs.FileMode(mode))
	if err != nil {
		writeError(w, asError("upload", display, err))
		return
	}
	writeJSON(w, WriteResult{Path: display, Size: n, Created: created})
}

// --- mkdir, remove ---

func (s *server) handleMkdir(w http.ResponseWriter, r *http.Request) {
	var req pathRequest
	if !readJSON(w, r, "mkdir", &req) {
		return
	}
	display, real, err := s.resolve("mkdir", req.Path, false)
	if err == nil {
		err = os.MkdirAll(real, 0o755)
		if errors.Is(err, syscall.ENOTDIR) || errors.Is(err, fs.ErrExist) {
			err = &Error{Op: "mkdir", Path: display, Code: CodeExists, Message: fmt.Sprintf("mkdir %s: a file is in the way", display)}
		}
	}
	if err != nil {
		writeError(w, asError("mkdir", display, err))
		return
	}
	writeJSON(w, struct{}{})
}

func (s *server) handleRemove(w http.ResponseWriter, r *http.Request) {
	var req pathRequest
	if !readJSON(w, r, "remove", &req) {
		return
	}
	display, real, err := s.resolve("remove", req.Path, true)
	if err == nil {
		for _, root := range s.roots {
			if real == root {
				err = &Error{Op: "remove", Path: display, Code: CodeInvalid, Message: fmt.Sprintf("remove %s: refusing to remove a root directory; remove what is in it", display)}
			}
		}
	}
	if err == nil {
		if _, err = os.Lstat(real); err == nil {
			if req.Recursive {
				err = os.RemoveAll(real)
			} else {
				err = os.Remove(real)
			}
		}
	}
	if err != nil {
		writeError(w, asError("remove", display, err))
		return
	}
	writeJSON(w, struct{}{})
}

// --- tree ---

func (s *server) handleTree(w http.ResponseWriter, r *http.Request) {
	var req treeRequest
	if !readJSON(w, r, "tree", &req) {
		return
	}
	if req.Path == "" {
		req.Path = s.workspace
	}
	display, real, err := s.resolve("tree", req.Path, false)
	if err != nil {
		writeError(w, asError("tree", display, err))
		return
	}
	fi, err := os.Stat(real)
	if err != nil {
		writeError(w, asError("tree", display, err))
		return
	}
	if req.Depth <= 0 {
		req.Depth = 2
	}
	if req.MaxEntries <= 0 {
		req.MaxEntries = defaultTreeMax
	}
	t := &treeWalk{left: req.MaxEntries}
	root := TreeEntry{Path: display, Type: fileType(fi.Mode()), Size: fi.Size()}
	if fi.IsDir() {
		root.Size = 0
		root.Children = t.list(real, display, req.Depth)
	}
	writeJSON(w, treeResult{Root: root, Truncated: t.truncated})
}

type treeWalk struct {
	left      int
	truncated bool
}

// list returns dir's entries (dirs and files sorted by name), depth levels.
func (t *treeWalk) list(real, display string, depth int) []TreeEntry {
	des, err := os.ReadDir(real)
	if err != nil {
		return nil
	}
	sort.Slice(des, func(i, j int) bool { return des[i].Name() < des[j].Name() })
	out := make([]TreeEntry, 0, len(des))
	for _, de := range des {
		if t.left <= 0 {
			t.truncated = true
			break
		}
		t.left--
		e := TreeEntry{Path: filepath.Join(display, de.Name()), Type: fileType(de.Type())}
		if de.Type().IsRegular() {
			if fi, err := de.Info(); err == nil {
				e.Size = fi.Size()
			}
		}
		out = append(out, e)
	}
	// Breadth before depth: a level is listed whole before the next, so the
	// entry cap cuts the deepest part of the tree.
	if depth > 1 {
		for i := range out {
			if out[i].Type == "dir" && t.left > 0 {
				out[i].Children = t.list(filepath.Join(real, filepath.Base(out[i].Path)), out[i].Path, depth-1)
			} else if out[i].Type == "dir" {
				t.truncated = true
			}
		}
	}
	return out
}
