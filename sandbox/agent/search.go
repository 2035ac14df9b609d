package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"unicode/utf8"

	"github.com/bmatcuk/doublestar/v4"
)

const (
	defaultGlobMax = 1000
	maxGlobAlts    = 256
	maxGrepLine    = 16 << 20 // bytes of one line grep looks at (the rest of a longer line is not searched)
)

// --- glob: patterns are doublestar's (*, ?, [...] within a segment, ** across segments, {a,b}) ---

// checkGlob refuses a pattern doublestar rejects, and one with more than
// maxGlobAlts {a,b} alternatives: doublestar walks each combination of the
// alternatives in its directory part, so 30 groups of {a,b} would take
// hours (the count is the one check kept by hand).
func checkGlob(op, pattern string) error {
	if !doublestar.ValidatePattern(pattern) {
		return &Error{Op: op, Code: CodeInvalid, Message: fmt.Sprintf(
			"%s: bad glob pattern %q: a [ or { is not closed, or it ends in a lone \\", op, pattern)}
	}
	if n, _ := alternatives(pattern); n > maxGlobAlts {
		return &Error{Op: op, Code: CodeInvalid, Message: fmt.Sprintf(
			"%s: glob pattern %q expands to more than %d patterns: use fewer {a,b} groups", op, pattern, maxGlobAlts)}
	}
	return nil
}

// alternatives counts the patterns the {a,b} groups of p expand to (capped
// just above maxGlobAlts), and returns the rest of p after a closing } or a
// comma that ends the sequence it counted.
func alternatives(p string) (n int, rest string) {
	n = 1
	for len(p) > 0 {
		switch c := p[0]; c {
		case '\\':
			p = p[min(2, len(p)):]
			continue
		case '}', ',':
			return n, p
		case '{':
			sum := 0
			p = p[1:]
			for {
				var k int
				k, p = alternatives(p)
				sum = min(sum+k, maxGlobAlts+1)
				if p == "" || p[0] == '}' {
					break
				}
				p = p[1:] // the comma
			}
			n = min(n*sum, maxGlobAlts+1)
			if p == "" {
				return n, ""
			}
		}
		p = p[1:]
	}
	return n, ""
}

var globEscaper = strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`, `{`, `\{`, `}`, `\}`)

// errGlobFull stops a glob walk once it has found Max paths.
var errGlobFull = errors.New("glob: enough paths")

// globFS is the tree a glob walks: an os.Root at the walk's base, so no
// path (.. or a symlink) leads out of it, with .git hidden unless the
// pattern names it, and the request's context checked at each directory.
// Stat does not follow a final symlink: with doublestar.WithNoFollow no
// symlink to a directory is walked into, so a link is listed (when it
// matches) as itself, as the file tools describe it.
type globFS struct {
	ctx     context.Context
	root    fs.FS
	hideGit bool
}

func (g globFS) Open(name string) (fs.File, error) { return g.root.Open(name) }

func (g globFS) Stat(name string) (fs.FileInfo, error) {
	return fs.Lstat(g.root, name)
}

func (g globFS) ReadDir(name string) ([]fs.DirEntry, error) {
	if err := g.ctx.Err(); err != nil {
		return nil, err
	}
	ents, err := fs.ReadDir(g.root, name)
	if g.hideGit {
		ents = slices.DeleteFunc(ents, func(e fs.DirEntry) bool { return e.IsDir() && e.Name() == ".git" })
	}
	return ents, err
}

func (s *server) handleGlob(w http.ResponseWriter, r *http.Request) {
	var req globRequest
	if !readJSON(w, r, "glob", &req) {
		return
	}
	res, err := s.glob(r.Context(), req)
	if err != nil {
		writeError(w, asError("glob", "", err))
		return
	}
	writeJSON(w, res)
}

func (s *server) glob(ctx context.Context, req globRequest) (globResult, error) {
	if req.Pattern == "" {
		return globResult{}, &Error{Op: "glob", Code: CodeInvalid, Message: "glob: pattern is empty"}
	}
	if req.Max <= 0 {
		req.Max = defaultGlobMax
	}
	if err := checkGlob("glob", req.Pattern); err != nil {
		return globResult{}, err
	}
	pat := req.Pattern
	if !filepath.IsAbs(pat) {
		cwd := s.workspace
		if req.Cwd != "" {
			cwd = s.abs(req.Cwd)
		}
		pat = globEscaper.Replace(cwd) + "/" + pat // a directory named a[1] is not a pattern
	}
	// Walk from the longest literal directory prefix, checked like any path.
	base, rest := doublestar.SplitPattern(pat)
	display, real, err := s.resolve("glob", filepath.Clean(base), false)
	if err != nil {
		return globResult{}, err
	}
	res := globResult{Paths: []string{}}
	root, err := os.OpenRoot(real)
	if err != nil {
		return res, nil // no such directory: nothing matches
	}
	defer root.Close()
	fsys := globFS{ctx: ctx, root: root.FS(), hideGit: !strings.Contains(rest, ".git")}
	err = doublestar.GlobWalk(fsys, rest, func(p string, _ fs.DirEntry) error {
		if len(res.Paths) == req.Max {
			res.Truncated = true
			return errGlobFull
		}
		res.Paths = append(res.Paths, filepath.Join(display, p))
		return nil
	}, doublestar.WithFilesOnly(), doublestar.WithNoFollow())
	if err := ctx.Err(); err != nil {
		return globResult{}, err // unreadable directories are skipped, so look here
	}
	if err != nil && !errors.Is(err, errGlobFull) {
		return globResult{}, err
	}
	slices.Sort(res.Paths)
	res.Paths = slices.Compact(res.Paths) // {a,a} names a path twice
	return res, nil
}

// --- grep ---

func (s *server) handleGrep(w http.ResponseWriter, r *http.Request) {
	var req GrepRequest
	if !readJSON(w, r, "grep", &req) {
		return
	}
	res, err := s.grep(r.Context(), req)
	if err != nil {
		writeError(w, asError("grep", "", err))
		return
	}
	writeJSON(w, res)
}

func (s *server) grep(ctx context.Context, req GrepRequest) (GrepResult, error) {
	if req.Pattern == "" {
		return GrepResult{}, &Error{Op: "grep", Code: CodeInvalid, Message: "grep: pattern is empty"}
	}
	expr := req.Pattern
	if !req.Regex {
		expr = regexp.QuoteMeta(expr)
	}
	if req.IgnoreCase {
		expr = "(?i)" + expr
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		return GrepResult{}, &Error{Op: "grep", Code: CodeInvalid, Message: fmt.Sprintf("grep: bad regular expression: %v", err)}
	}
	filter := strings.Trim(req.Glob, "/")
	if err := checkGlob("grep", filter); err != nil {
		return GrepResult{}, err
	}
	if req.MaxHits <= 0 {
		req.MaxHits = DefaultGrepHits
	}
	if req.MaxLineBytes <= 0 {
		req.MaxLineBytes = DefaultGrepLineLen
	}
	if req.Path == "" {
		req.Path = s.workspace
	}
	display, real, err := s.resolve("grep", req.Path, false)
	if err != nil {
		return GrepResult{}, err
	}
	fi, err := os.Stat(real)
	if err != nil {
		return GrepResult{}, asError("grep", display, err)
	}
	g := &grepper{re: re, max: req.MaxHits, lineMax: req.MaxLineBytes, res: GrepResult{Hits: []GrepHit{}}}
	if !fi.IsDir() {
		g.file(real, display)
		return g.res, nil
	}
	slashGlob := strings.Contains(req.Glob, "/")
	err = filepath.WalkDir(real, func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			rel, _ := filepath.Rel(real, p)
			g.skip(filepath.Join(display, rel), err)
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case g.res.Truncated:
			return filepath.SkipAll
		case d.IsDir() && d.Name() == ".git":
			return filepath.SkipDir
		case !d.Type().IsRegular(): // directories; symlinks are not followed
			return nil
		}
		rel, _ := filepath.Rel(real, p)
		if filter != "" {
			name := d.Name()
			if slashGlob {
				name = rel
			}
			if !doublestar.MatchUnvalidated(filter, name) {
				return nil
			}
		}
		g.file(p, filepath.Join(display, rel))
		return nil
	})
	return g.res, err
}

type grepper struct {
	re      *regexp.Regexp
	max     int
	lineMax int
	res     GrepResult
	line    []byte
}

// skip notes that the path shown as display could not be searched.
func (g *grepper) skip(display string, err error) {
	if len(g.res.Skipped) >= MaxSkipped {
		return
	}
	why := err.Error()
	if errors.Is(err, syscall.ENAMETOOLONG) {
		why = "its path is longer than the system allows"
	} else if errors.Is(err, fs.ErrPermission) {
		why = "permission denied"
	}
	g.res.Skipped = append(g.res.Skipped, middle(display, 300)+": "+why)
}

// file searches one file unless it is binary (a NUL byte in its first 8 KiB).
func (g *grepper) file(real, display string) {
	f, fi, err := openFile("grep", display, real, os.O_RDONLY, 0)
	if err != nil {
		g.skip(display, err)
		return
	}
	defer f.Close()
	if fi.IsDir() {
		return
	}
	br := bufio.NewReaderSize(f, 64<<10)
	if head, _ := br.Peek(binarySniff); bytes.IndexByte(head, 0) >= 0 {
		return
	}
	g.res.FilesSearched++
	for n := 1; ; n++ {
		g.line = g.line[:0]
		got := false
		var err error
		for {
			var chunk []byte
			chunk, err = br.ReadSlice('\n')
			got = got || len(chunk) > 0
			if room := maxGrepLine - len(g.line); room > 0 {
				g.line = append(g.line, chunk[:min(room, len(chunk))]...)
			}
			if err != bufio.ErrBufferFull {
				break
			}
		}
		if !got {
			return
		}
		text := bytes.TrimRight(g.line, "\r\n")
		if loc := g.re.FindIndex(text); loc != nil {
			if len(g.res.Hits) == g.max {
				g.res.Truncated = true
				return
			}
			g.res.Hits = append(g.res.Hits, GrepHit{Path: display, Line: n, Text: excerpt(text, loc[0], g.lineMax)})
		}
		if err == io.EOF || err != nil {
			return
		}
	}
}

// excerpt returns at most max bytes of line (on rune boundaries) around the
// match at offset at, with "…" where it was cut.
func excerpt(line []byte, at, max int) string {
	if len(line) <= max {
		return strings.ToValidUTF8(string(line), "\uFFFD")
	}
	start := 0
	if at > max/4 {
		start = at - max/4
	}
	end := min(start+max, len(line))
	for start > 0 && start < len(line) && !utf8.RuneStart(line[start]) {
		start++
	}
	for end < len(line) && end > start && !utf8.RuneStart(line[end]) {
		end--
	}
	s := strings.ToValidUTF8(string(line[start:end]), "\uFFFD")
	if start > 0 {
		s = "…" + s
	}
	if end < len(line) {
		s += "…"
	}
	return s
}
