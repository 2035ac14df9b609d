package agent

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"unicode/utf8"
)

const (
	defaultGlobMax = 1000
	maxBraceExpand = 256
	maxGrepLine    = 16 << 20 // bytes of one line grep looks at (the rest of a longer line is not searched)
)

// --- glob patterns: *, ?, [...] within a segment, ** across segments, {a,b} ---

// expandBraces expands {a,b} alternatives (nested allowed).
func expandBraces(p string) ([]string, error) {
	open := strings.IndexByte(p, '{')
	if open < 0 {
		return []string{p}, nil
	}
	depth, closing := 0, -1
	var commas []int
	for i := open; i < len(p) && closing < 0; i++ {
		switch p[i] {
		case '{':
			depth++
		case '}':
			if depth--; depth == 0 {
				closing = i
			}
		case ',':
			if depth == 1 {
				commas = append(commas, i)
			}
		}
	}
	if closing < 0 {
		return nil, fmt.Errorf("unclosed { in %q", p)
	}
	var out []string
	last := open
	for _, c := range append(commas, closing) {
		alts, err := expandBraces(p[:open] + p[last+1:c] + p[closing+1:])
		if err != nil {
			return nil, err
		}
		out = append(out, alts...)
		if len(out) > maxBraceExpand {
			return nil, fmt.Errorf("%q expands to more than %d patterns", p, maxBraceExpand)
		}
		last = c
	}
	return out, nil
}

// globPattern is one brace-free pattern split into segments.
type globPattern []string

func compileGlob(p string) ([]globPattern, error) {
	alts, err := expandBraces(p)
	if err != nil {
		return nil, err
	}
	out := make([]globPattern, len(alts))
	for i, a := range alts {
		segs := strings.Split(strings.Trim(a, "/"), "/")
		for _, s := range segs {
			if _, err := path.Match(s, ""); err != nil {
				return nil, fmt.Errorf("bad pattern %q", a)
			}
		}
		out[i] = segs
	}
	return out, nil
}

// match reports whether the path segments name match the pattern.
func (g globPattern) match(name []string) bool {
	if len(g) == 0 {
		return len(name) == 0
	}
	if g[0] == "**" {
		for i := 0; i <= len(name); i++ {
			if g[1:].match(name[i:]) {
				return true
			}
		}
		return false
	}
	if len(name) == 0 {
		return false
	}
	ok, _ := path.Match(g[0], name[0])
	return ok && g[1:].match(name[1:])
}

// mayContain reports whether something under the directory dir could match.
func (g globPattern) mayContain(dir []string) bool {
	if len(dir) == 0 {
		return len(g) > 0
	}
	if len(g) == 0 {
		return false
	}
	if g[0] == "**" {
		return true
	}
	ok, _ := path.Match(g[0], dir[0])
	return ok && g[1:].mayContain(dir[1:])
}

func anyMatch(gs []globPattern, name []string) bool {
	for _, g := range gs {
		if g.match(name) {
			return true
		}
	}
	return false
}

func hasMeta(s string) bool { return strings.ContainsAny(s, "*?[{\\") }

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
	pat := req.Pattern
	if !filepath.IsAbs(pat) {
		cwd := s.workspace
		if req.Cwd != "" {
			cwd = s.abs(req.Cwd)
		}
		pat = cwd + "/" + pat
	}
	// Walk from the longest literal directory prefix.
	segs := strings.Split(pat, "/")
	i := 0
	for i < len(segs)-1 && !hasMeta(segs[i]) {
		i++
	}
	base := filepath.Clean("/" + strings.Join(segs[:i], "/"))
	rest := strings.Join(segs[i:], "/")
	gs, err := compileGlob(rest)
	if err != nil {
		return globResult{}, &Error{Op: "glob", Code: CodeInvalid, Message: "glob: " + err.Error()}
	}
	display, real, err := s.resolve("glob", base, false)
	if err != nil {
		return globResult{}, err
	}
	found := map[string]bool{}
	truncated := false
	walkErr := filepath.WalkDir(real, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // unreadable: skip
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		rel, _ := filepath.Rel(real, p)
		if rel == "." {
			return nil
		}
		name := strings.Split(rel, "/")
		if d.IsDir() {
			if d.Name() == ".git" && !strings.Contains(rest, ".git") {
				return filepath.SkipDir
			}
			for _, g := range gs {
				if g.mayContain(name) {
					return nil
				}
			}
			return filepath.SkipDir
		}
		if anyMatch(gs, name) {
			if len(found) == req.Max {
				truncated = true
				return filepath.SkipAll
			}
			found[filepath.Join(display, rel)] = true
		}
		return nil
	})
	if walkErr != nil {
		return globResult{}, walkErr
	}
	res := globResult{Paths: make([]string, 0, len(found)), Truncated: truncated}
	for p := range found {
		res.Paths = append(res.Paths, p)
	}
	sort.Strings(res.Paths)
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
	var filter []globPattern
	if req.Glob != "" {
		if filter, err = compileGlob(req.Glob); err != nil {
			return GrepResult{}, &Error{Op: "grep", Code: CodeInvalid, Message: "grep: glob: " + err.Error()}
		}
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
		if filter != nil {
			name := []string{d.Name()}
			if slashGlob {
				name = strings.Split(rel, "/")
			}
			if !anyMatch(filter, name) {
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

// file searches one file unless it is binary (a NUL byte in its first 8 KiB).
func (g *grepper) file(real, display string) {
	f, fi, err := openFile("grep", display, real, os.O_RDONLY, 0)
	if err != nil {
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
