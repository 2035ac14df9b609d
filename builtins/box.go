package builtins

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/sandboxclient"
)

// What the box-driving kinds share: box names, file bindings, reading files
// back.

// MaxOutputFile caps an output file read back from a box (an exec node's
// files, a sandbox node's output files): a larger one is not read, and
// the node says so.
const MaxOutputFile = 16 << 20

// boxBase is a box-name-safe rendering of a node's address: "pattern.node",
// prefixed by the space unless it is "default", at most max bytes (longer
// ones are cut and end with a hash of the whole, so they stay unique).
func boxBase(a cells.Address, max int) string {
	s := a.Pattern + "." + a.Name
	if a.Space != "default" {
		s = a.Space + "." + s
	}
	s = strings.Map(func(r rune) rune {
		if r == '_' || r == '-' || r == '.' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, s)
	if len(s) > max {
		sum := sha256.Sum256([]byte(s))
		s = s[:max-9] + "-" + hex.EncodeToString(sum[:4])
	}
	return s
}

// boxFileRoots are where a box's files may be read and written: the
// agent's file tools serve no other place (the sandbox's workspace and its
// /tmp).
var boxFileRoots = []string{"/workspace", "/tmp"}

// inBoxFileRoot reports whether p lies strictly inside a boxFileRoot.
func inBoxFileRoot(p string) bool {
	return slices.ContainsFunc(boxFileRoots, func(root string) bool { return strings.HasPrefix(p, root+"/") })
}

// CheckBoxPath checks that p can name a file bound to a box: a clean
// absolute path inside /workspace or /tmp.
func CheckBoxPath(p string) error {
	if !path.IsAbs(p) || path.Clean(p) != p {
		suggest := path.Clean(p) // "/workspace/a/../b": "/workspace/b"
		if !path.IsAbs(p) {
			suggest = path.Join("/workspace", p)
		}
		if !inBoxFileRoot(suggest) { // "../etc/x", "/workspace/"
			suggest = "/workspace/out.txt"
			if b := path.Base(p); b != "/" && b != "." && b != ".." && !slices.Contains(boxFileRoots, "/"+b) {
				suggest = path.Join("/workspace", b)
			}
		}
		return fmt.Errorf("%q is not a clean absolute path in the box (e.g. %q)", p, suggest)
	}
	if inBoxFileRoot(p) {
		return nil
	}
	return fmt.Errorf("%q is outside %s, where a box's files are read and written (e.g. %q)", p, strings.Join(boxFileRoots, " and "), path.Join("/workspace", path.Base(p)))
}

// checkFiles checks file bindings: paths CheckBoxPath takes, outputs text
// or json.
func checkFiles(files map[string]File) error {
	for p, f := range files {
		if err := CheckBoxPath(p); err != nil {
			return fmt.Errorf("file %w", err)
		}
		switch {
		case f.Input == nil && f.Output != OutputText && f.Output != OutputJSON:
			return fmt.Errorf("file %q: output format %q: want %q or %q", p, f.Output, OutputText, OutputJSON)
		case f.Input != nil && f.Output != "":
			return fmt.Errorf("file %q: both an input and an output", p)
		}
	}
	return nil
}

// evalEnv evaluates env values as text.
func evalEnv(env map[string]Field, in map[string]any) (map[string]string, error) {
	if len(env) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(env))
	for k, f := range env {
		v, err := evalText(f, in, "env "+k)
		if err != nil {
			return nil, err
		}
		out[k] = v
	}
	return out, nil
}

// evalImage evaluates an image field ("" when unset: the default image).
func evalImage(f Field, in map[string]any) (string, error) {
	if f == nil {
		return "", nil
	}
	return evalText(f, in, "image")
}

// upload writes content to path in box.
func upload(ctx context.Context, c sandboxclient.Client, box, p, content string) error {
	if _, err := c.Upload(ctx, box, p, strings.NewReader(content)); err != nil {
		return fmt.Errorf("write input file %s in box %q: %w", p, box, err)
	}
	return nil
}

// readOutput reads the output file p of box as format says: "text" gives a
// string, "json" the parsed value. A missing file gives found=false.
func readOutput(ctx context.Context, c sandboxclient.Client, box, p, format string) (v any, found bool, err error) {
	w := &capped{max: MaxOutputFile}
	if _, err := c.Download(ctx, box, p, w); err != nil {
		switch {
		case w.over:
			return nil, true, fmt.Errorf("output file %s is larger than %d MiB, the cap on an output file: it was not read; have the command write less (keep big data in the box and bind a smaller file)", p, MaxOutputFile>>20)
		case notFound(err):
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("read output file %s in box %q: %w", p, box, err)
	}
	if format == OutputText {
		if b := w.buf.Bytes(); !utf8.Valid(b) {
			// A cell holds JSON text: the bytes would be replaced with
			// U+FFFD without a word.
			at := 0
			for {
				r, size := utf8.DecodeRune(b[at:])
				if r == utf8.RuneError && size == 1 {
					break
				}
				at += size
			}
			return nil, true, fmt.Errorf("output file %s is not UTF-8 text (byte %d is 0x%02x): a text output holds text; write it as UTF-8, or base64 it (base64 -w0) and decode it where it is used", p, at, b[at])
		}
		return w.buf.String(), true, nil
	}
	d := json.NewDecoder(bytes.NewReader(w.buf.Bytes()))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		return nil, true, fmt.Errorf("output file %s is not JSON: %w", p, err)
	}
	if d.More() {
		return nil, true, fmt.Errorf("output file %s is not JSON: more than one value", p)
	}
	return v, true, nil
}

// notFound reports whether err says a file does not exist (both clients
// return sandboxclient.ErrNotFound).
func notFound(err error) bool {
	return errors.Is(err, sandboxclient.ErrNotFound)
}

// capped is a buffer that refuses to grow past max bytes: the download
// into it fails at the first write past max, which ends the stream, so a
// file of any size costs at most max bytes of memory.
//
// The buffer is a field, not embedded: an embedded bytes.Buffer's
// ReadFrom is promoted, io.Copy prefers it to Write, and the whole file
// would be read past the cap (it was: a 100 MB output file became a
// 100 MB cell).
type capped struct {
	buf  bytes.Buffer
	max  int
	over bool
}

func (c *capped) Write(p []byte) (int, error) {
	if c.buf.Len()+len(p) > c.max {
		c.over = true
		return 0, fmt.Errorf("more than %d bytes", c.max)
	}
	return c.buf.Write(p)
}

// lastLine returns the last non-empty line of s, cut to 200 bytes.
func lastLine(s string) string {
	s = strings.TrimRight(s, "\r\n\t ")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	s = strings.TrimSpace(s)
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// destroyQuietly destroys box under a context detached from ctx's
// cancellation (cleanup must happen on abort too), bounded by 30 s.
func destroyQuietly(ctx context.Context, env Env, box string) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if err := env.Client.DestroyBox(dctx, box); err != nil && !noSuchBox(err) {
		env.logger().Warn("destroy box", "box", box, "error", err)
	}
}

// noSuchBox reports whether err says the session has no box of that name
// (both clients return sandboxclient.ErrNoBox).
func noSuchBox(err error) bool {
	return errors.Is(err, sandboxclient.ErrNoBox)
}
