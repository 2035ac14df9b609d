package tools

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"

	"github.com/cellbox/cellbox/internal/safe"
	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/textedit"
)

const (
	// MaxFileBytes is the most a file tool reads or writes in one call (2 MiB).
	MaxFileBytes = 2 << 20
	// GlobMax is the most files glob lists.
	GlobMax = 1000
	lsMax   = 500
)

func readFileTool(ctx context.Context, c Call, in api.ReadFileInput) (api.ReadFileOutput, error) {
	res, err := ReadFile(ctx, c, in.Sandbox, agent.ReadRequest{Path: in.Path, Offset: in.Offset, Limit: in.Limit})
	if err != nil {
		return api.ReadFileOutput{}, err
	}
	return api.ReadFileOutput{
		Content: res.Content, Encoding: res.Encoding, TotalLines: res.TotalLines, StartLine: res.StartLine,
		EndLine: res.EndLine, NextOffset: res.NextOffset, Truncated: res.Truncated, Size: res.Size,
	}, nil
}

// ReadFile is read_file's handler for any window: lines (read_file, and
// the profiles' line readers) or bytes (seed 000's read_file).
func ReadFile(ctx context.Context, c Call, box string, req agent.ReadRequest) (agent.ReadResult, error) {
	l, err := c.Box(ctx, box)
	if err != nil {
		return agent.ReadResult{}, err
	}
	return l.Client.ReadFile(ctx, req)
}

// WriteFile is write_file's handler.
func WriteFile(ctx context.Context, c Call, in api.WriteFileInput) (api.WriteFileOutput, error) {
	// Text goes to the agent from the string itself: a megabyte is not
	// copied into bytes first.
	var data interface {
		io.Reader
		Len() int
	} = strings.NewReader(in.Content)
	if in.Encoding == "base64" {
		b, err := base64.StdEncoding.DecodeString(in.Content)
		if err != nil {
			return api.WriteFileOutput{}, api.WithCode(api.CodeInvalidInput, fmt.Errorf("content is not valid base64 (encoding: base64): %w", err))
		}
		data = bytes.NewReader(b)
	}
	if size := data.Len(); size > MaxFileBytes {
		return api.WriteFileOutput{}, api.WithCode(api.CodeTooLarge, fmt.Errorf("content is %d bytes; write_file takes at most %d (2 MiB). Write it in parts with append: true, change a large file with edit, or upload it through the files endpoint", size, MaxFileBytes))
	}
	l, err := c.Box(ctx, in.Sandbox)
	if err != nil {
		return api.WriteFileOutput{}, err
	}
	res, err := l.Client.WriteFileFrom(ctx, agent.WriteRequest{Path: in.Path, Append: in.Append, MaxBytes: MaxFileBytes}, data)
	if err != nil {
		return api.WriteFileOutput{}, err
	}
	return api.WriteFileOutput{OK: true, Size: res.Size, Path: res.Path}, nil
}

// Edit is edit's handler: several replacements, each matched against the
// original file.
func Edit(ctx context.Context, c Call, in api.EditInput) (api.EditOutput, error) {
	if len(in.Edits) == 0 {
		return api.EditOutput{}, api.WithCode(api.CodeInvalidInput, errors.New("edits is empty; give at least one {oldText, newText}"))
	}
	edits := make([]textedit.Replacement, len(in.Edits))
	for i, e := range in.Edits {
		edits[i] = textedit.Replacement{OldText: e.OldText, NewText: e.NewText}
	}
	return rewriteFile(ctx, c, in.Sandbox, in.Path, func(orig []byte) (textedit.Result, error) {
		return textedit.Edit(orig, edits, textedit.DiffOptions{Path: in.Path})
	})
}

// StrReplace is str_replace's handler.
func StrReplace(ctx context.Context, c Call, in api.StrReplaceInput) (api.EditOutput, error) {
	return rewriteFile(ctx, c, in.Sandbox, in.Path, func(orig []byte) (textedit.Result, error) {
		return textedit.StrReplace(orig, in.OldStr, in.NewStr, in.ReplaceAll, textedit.DiffOptions{Path: in.Path})
	})
}

// rewriteFile reads a file (at most 2 MiB), changes it with edit and
// writes it back (keeping its mode).
func rewriteFile(ctx context.Context, c Call, box, p string, edit func([]byte) (textedit.Result, error)) (api.EditOutput, error) {
	var out api.EditOutput
	l, err := c.Box(ctx, box)
	if err != nil {
		return out, err
	}
	fi, err := l.Client.Stat(ctx, p)
	if err != nil {
		return out, err
	}
	if fi.Type != "file" {
		return out, api.WithCode(api.CodeInvalidInput, fmt.Errorf("%s is %s, not a file", fi.Path, KindOf(fi.Type)))
	}
	if fi.Size > MaxFileBytes {
		return out, api.WithCode(api.CodeTooLarge, fmt.Errorf("%s is %d bytes; edit works on files up to 2 MiB — use shell (sed, patch) for larger ones", fi.Path, fi.Size))
	}
	var buf bytes.Buffer
	if _, err := l.Client.Download(ctx, p, &buf); err != nil {
		return out, err
	}
	res, err := edit(buf.Bytes())
	if err != nil { // old text missing, ambiguous, overlapping: the input's fault
		return out, api.WithCode(api.CodeInvalidInput, fmt.Errorf("%s: %w", fi.Path, err))
	}
	if _, err := l.Client.WriteFile(ctx, agent.WriteRequest{Path: p, Data: res.Content, MaxBytes: MaxFileBytes + int64(len(res.Content))}); err != nil {
		return out, err
	}
	return api.EditOutput{OK: true, Diff: res.Diff, Replacements: res.Replacements, Fuzzy: res.Fuzzy}, nil
}

// Grep is grep's handler.
func Grep(ctx context.Context, c Call, in api.GrepInput) (api.GrepOutput, error) {
	l, err := c.Box(ctx, in.Sandbox)
	if err != nil {
		return api.GrepOutput{}, err
	}
	res, err := l.Client.Grep(ctx, agent.GrepRequest{Pattern: in.Pattern, Path: in.Path, Regex: in.Regex, IgnoreCase: in.IgnoreCase, Glob: in.Glob, MaxHits: in.MaxHits})
	if err != nil {
		return api.GrepOutput{}, err
	}
	out := api.GrepOutput{Hits: make([]api.GrepHit, len(res.Hits)), Truncated: res.Truncated, Skipped: res.Skipped}
	for i, h := range res.Hits {
		out.Hits[i] = api.GrepHit(h)
	}
	return out, nil
}

// Glob is glob's handler.
func Glob(ctx context.Context, c Call, in api.GlobInput) (api.GlobOutput, error) {
	l, err := c.Box(ctx, in.Sandbox)
	if err != nil {
		return api.GlobOutput{}, err
	}
	files, truncated, err := l.Client.Glob(ctx, in.Pattern, in.Cwd, GlobMax)
	if err != nil {
		return api.GlobOutput{}, err
	}
	if files == nil {
		files = []string{}
	}
	return api.GlobOutput{Files: files, Truncated: truncated}, nil
}

// Ls is ls's handler: a tree two levels deep.
func Ls(ctx context.Context, c Call, in api.LsInput) (api.LsOutput, error) {
	l, err := c.Box(ctx, in.Sandbox)
	if err != nil {
		return api.LsOutput{}, err
	}
	root, truncated, err := l.Client.Tree(ctx, in.Path, 2, lsMax)
	if err != nil {
		return api.LsOutput{}, renameOp(err, "tree", "ls")
	}
	if root.Type != "dir" {
		return api.LsOutput{}, api.WithCode(api.CodeInvalidInput, fmt.Errorf("ls %s: not a directory (it is a %s); use read_file to read a file", root.Path, root.Type))
	}
	var b strings.Builder
	b.WriteString(root.Path + "/\n")
	if len(root.Children) == 0 {
		b.WriteString("(empty)\n")
	}
	renderTree(&b, root.Children, "")
	if truncated {
		fmt.Fprintf(&b, "… (listing cut at %d entries; ls a subdirectory or use glob)\n", lsMax)
	}
	return api.LsOutput{Tree: b.String(), Entries: toEntries(root.Children), Truncated: truncated}, nil
}

// renameOp names the tool the user called in an agent error whose message
// names the agent's own op (ls is the agent's tree), keeping its code.
func renameOp(err error, op, tool string) error {
	var e *agent.Error
	if !errors.As(err, &e) || e.Op != op {
		return err
	}
	r := *e
	r.Op = tool
	if rest, ok := strings.CutPrefix(e.Message, op+" "); ok {
		r.Message = tool + " " + rest
	} else if rest, ok := strings.CutPrefix(e.Message, op+":"); ok {
		r.Message = tool + ":" + rest
	}
	return &r
}

func renderTree(b *strings.Builder, entries []agent.TreeEntry, indent string) {
	for i, e := range entries {
		branch, next := "├── ", "│   "
		if i == len(entries)-1 {
			branch, next = "└── ", "    "
		}
		name := path.Base(e.Path)
		switch e.Type {
		case "dir":
			name += "/"
		case "file":
			name += " (" + humanSize(e.Size) + ")"
		case "symlink":
			name += "@"
		}
		b.WriteString(indent + branch + name + "\n")
		renderTree(b, e.Children, indent+next)
	}
}

func toEntries(in []agent.TreeEntry) []api.Entry {
	out := make([]api.Entry, len(in))
	for i, e := range in {
		out[i] = api.Entry{Path: e.Path, Type: e.Type, Size: e.Size, Children: toEntries(e.Children)}
		if len(e.Children) == 0 {
			out[i].Children = nil
		}
	}
	return out
}

func humanSize(n int64) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	case n < 1<<30:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}

// Transfer is transfer's handler: a file or tree from one box of the
// session to another, as a tar stream between their agents.
func Transfer(ctx context.Context, c Call, in api.TransferInput) (api.TransferOutput, error) {
	var out api.TransferOutput
	src, err := c.Box(ctx, in.FromSandbox)
	if err != nil {
		return out, err
	}
	dst, err := c.Box(ctx, in.ToSandbox)
	if err != nil {
		return out, err
	}
	fi, err := src.Client.Stat(ctx, in.FromPath)
	if err != nil {
		return out, err
	}
	to := in.ToPath
	if dfi, err := dst.Client.Stat(ctx, to); err == nil && dfi.Type == "dir" {
		to = path.Join(dfi.Path, path.Base(fi.Path))
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return out, err
	}
	if fi.Type == "dir" && src.ID == dst.ID {
		if err := notInside(ctx, dst.Client, fi, to); err != nil {
			return out, err
		}
	}
	switch fi.Type {
	case "file", "dir":
		if fi.Type == "dir" && !in.Recursive {
			return out, api.WithCode(api.CodeInvalidInput, fmt.Errorf("%s is a directory; set recursive: true to copy the tree", fi.Path))
		}
		// A file too goes as a tar of one entry: its mode, and a sparse
		// file's holes, are kept (a 1 GiB file of holes arrived as 1 GiB).
		n, err := copyTree(ctx, src.Client, dst.Client, fi.Path, to)
		if err != nil {
			return out, err
		}
		out.Bytes = n
	default:
		return out, api.WithCode(api.CodeInvalidInput, fmt.Errorf("%s is %s; transfer copies files and directories", fi.Path, KindOf(fi.Type)))
	}
	dfi, err := dst.Client.Stat(ctx, to)
	if err != nil {
		return out, err
	}
	out.OK, out.Path = true, dfi.Path
	return out, nil
}

// notInside refuses a copy of directory dir (stat'd as fi) of a box to
// path to of the same box when to is dir or lies inside it (as cp does):
// the copy would read what it writes, and end with truncated files. The
// agent resolves the paths (Real), so a symlink into dir counts too.
func notInside(ctx context.Context, cl *agent.Client, fi agent.FileInfo, to string) error {
	dir := cmp.Or(fi.Real, fi.Path)
	real, rest := to, "" // the deepest existing ancestor of to, and the rest
	for {
		ti, err := cl.Stat(ctx, real)
		if err == nil {
			real = path.Join(cmp.Or(ti.Real, ti.Path), rest)
			break
		}
		if !errors.Is(err, fs.ErrNotExist) || real == "/" || real == "." {
			return err
		}
		real, rest = path.Dir(real), path.Join(path.Base(real), rest)
	}
	if real == dir || strings.HasPrefix(real, strings.TrimSuffix(dir, "/")+"/") {
		return api.WithCode(api.CodeInvalidInput, fmt.Errorf("cannot copy %s into itself (%s is inside it); copy it to a path outside %s, or into another sandbox", fi.Path, to, fi.Path))
	}
	return nil
}

// copyTree streams the tree from (entries named base/...) through a tar
// rewriter that renames its top to path.Base(to), into dst under
// path.Dir(to). It returns the bytes of the files copied.
func copyTree(ctx context.Context, src, dst *agent.Client, from, to string) (int64, error) {
	outR, srcErr := safe.PipeFrom("transfer", func(w io.Writer) error {
		_, err := src.TarOut(ctx, from, w)
		return err
	})
	inR, inW := io.Pipe()
	done := make(chan int64, 1)
	go func() {
		var n int64
		var err error
		defer func() { outR.CloseWithError(err); inW.CloseWithError(err); done <- n }()
		defer safe.Recover(nil, "transfer", &err)
		n, err = renameTar(outR, inW, path.Base(from), path.Base(to))
	}()
	_, err := dst.TarIn(ctx, path.Dir(to), inR)
	inR.CloseWithError(err)
	files := <-done
	if err = safe.PipeError(<-srcErr, err); err != nil {
		return 0, fmt.Errorf("transfer %s to %s: %w", from, to, err)
	}
	return files, nil
}

// renameTar copies a tar stream, renaming the top-level entry oldTop to
// newTop, and returns the size of the regular files (a sparse file's
// holes included; its data alone is copied, see agent.SparseOf).
func renameTar(r io.Reader, w io.Writer, oldTop, newTop string) (int64, error) {
	tr, tw := tar.NewReader(r), tar.NewWriter(w)
	var n int64
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return n, tw.Close()
		}
		if err != nil {
			return n, fmt.Errorf("read tar: %w", err)
		}
		rename := func(name string) string {
			name = strings.TrimPrefix(name, "./")
			if rest, ok := strings.CutPrefix(name, oldTop); ok && (rest == "" || rest[0] == '/') {
				return newTop + rest
			}
			return name
		}
		h.Name = rename(h.Name)
		if h.Typeflag == tar.TypeLink { // names a file of the tree, by its name in the tree
			h.Linkname = rename(h.Linkname)
		}
		if err := tw.WriteHeader(h); err != nil {
			return n, fmt.Errorf("write tar: %w", err)
		}
		if h.Typeflag == tar.TypeReg {
			c, err := io.Copy(tw, tr)
			n += c
			if err != nil {
				return n, fmt.Errorf("copy tar entry %s: %w", h.Name, err)
			}
			if m, ok, err := agent.SparseOf(h); err != nil {
				return n, err
			} else if ok {
				n += m.Size - c
			}
		}
	}
}

// KindOf names a type of agent.FileInfo for a message.
func KindOf(typ string) string {
	switch typ {
	case "file":
		return "a file"
	case "dir":
		return "a directory"
	case "symlink":
		return "a symlink"
	}
	return "a special file (device, FIFO or socket)"
}
