package sandbox

// The "fs-tools" tool profile (profiles.go): seed 003's names and fields,
// each tool a conversion onto a registry handler.

import (
	"context"
	"fmt"

	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/tools"
)

// --- seed 003: @cloudflare/fs-tools (sections read, write, edit, grep, exec) ---
//
// Its tools drive one workspace: here the session's default box.

// fs-tools' exec defaults (seed 003, "exec"): timeoutMs 60_000, stdout
// and stderr each capped at 32 KiB.
const (
	fsExecTimeoutMs = 60000
	fsExecOutputCap = 32 << 10
)

type fsReadInput struct {
	Path   string `json:"path" desc:"Absolute path (or relative to /workspace)."`
	Offset int    `json:"offset,omitempty" desc:"1-indexed start line (nextOffset of the previous call)." minimum:"0"`
	Limit  int    `json:"limit,omitempty" desc:"Max lines this call (at most 2000; at most 256 KiB are returned)." minimum:"0"`
}

type fsReadOutput struct {
	Content    string `json:"content"`
	NextOffset int    `json:"nextOffset,omitempty"`
}

type fsWriteInput struct {
	Path    string `json:"path" desc:"Absolute path (or relative to /workspace); parent directories are created."`
	Content string `json:"content" desc:"The whole new content (at most 2 MiB)."`
}

type fsWriteOutput struct {
	OK   bool  `json:"ok"`
	Size int64 `json:"size"`
}

type fsEditInput struct {
	Path  string     `json:"path" desc:"Absolute path (or relative to /workspace)."`
	Edits []api.Edit `json:"edits" desc:"Replacements, each matched against the ORIGINAL file (not applied one after another); they must not overlap."`
}

type fsGrepInput struct {
	Pattern    string `json:"pattern" desc:"Literal by default, or a regex if regex: true."`
	Path       string `json:"path" desc:"Absolute path; directory or file."`
	Regex      bool   `json:"regex,omitempty" desc:"Treat pattern as a regex (Go RE2 syntax)."`
	IgnoreCase bool   `json:"ignoreCase,omitempty" desc:"Match case-insensitively."`
	Glob       string `json:"glob,omitempty" desc:"Restrict to paths matching this glob."`
}

type fsExecInput struct {
	Command string `json:"command" desc:"Full command line, run through a shell."`
	Cwd     string `json:"cwd,omitempty" desc:"Absolute path inside the workspace." default:"/workspace"`
}

type fsExecOutput struct {
	ExitCode  int    `json:"exitCode"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	Truncated bool   `json:"truncated"`
}

// fsTools is seed 003's tool set.
func fsTools() []*tools.Tool {
	return []*tools.Tool{
		mapped("read_file", "read", "Read a text file, a window of lines at a time (at most 2000 lines / 256 KiB per call). When the file goes on, nextOffset is the offset to call read with next.", func(ctx context.Context, c *call, in fsReadInput) (fsReadOutput, error) {
			res, err := tools.ReadFile(ctx, c, "", agent.ReadRequest{Path: in.Path, Offset: in.Offset, Limit: in.Limit})
			if err != nil {
				return fsReadOutput{}, err
			}
			readNotices(c, res, "")
			return fsReadOutput{Content: res.Content, NextOffset: res.NextOffset}, nil
		}),
		mapped("write_file", "write", "Overwrite a file with content (at most 2 MiB). An existing file keeps its mode.", func(ctx context.Context, c *call, in fsWriteInput) (fsWriteOutput, error) {
			if len(in.Content) > tools.MaxFileBytes {
				return fsWriteOutput{}, fmt.Errorf("content is %d bytes; write takes at most %d (2 MiB): change a large file with edit", len(in.Content), tools.MaxFileBytes)
			}
			out, err := tools.WriteFile(ctx, c, api.WriteFileInput{Path: in.Path, Content: in.Content})
			return fsWriteOutput{OK: out.OK, Size: out.Size}, err
		}),
		mapped("edit", "edit", "Apply several replacements to a file at once. Each oldText is matched against the ORIGINAL file (not the result of the edits before it), so edits must not overlap; small whitespace differences are tolerated. Returns a unified diff.", func(ctx context.Context, c *call, in fsEditInput) (api.EditOutput, error) {
			return tools.Edit(ctx, c, api.EditInput{Path: in.Path, Edits: in.Edits})
		}),
		mapped("grep", "grep", "Search file contents under a path. Returns { hits: [{path, line, text}], truncated }; truncated means the hit cap (200) was reached — refine the query.", func(ctx context.Context, c *call, in fsGrepInput) (api.GrepOutput, error) {
			return tools.Grep(ctx, c, api.GrepInput{Pattern: in.Pattern, Path: in.Path, Regex: in.Regex, IgnoreCase: in.IgnoreCase, Glob: in.Glob})
		}),
		mapped("shell", "exec", "Run a shell command in the sandbox and return { exitCode, stdout, stderr, truncated }. stdout and stderr are each capped at 32 KiB; the command is killed after 60 s.", func(ctx context.Context, c *call, in fsExecInput) (fsExecOutput, error) {
			out, err := profileShell(ctx, c, api.ShellInput{Command: in.Command, WorkingDir: in.Cwd, TimeoutMs: fsExecTimeoutMs}, fsExecOutputCap)
			return fsExecOutput{ExitCode: out.ExitCode, Stdout: out.Stdout, Stderr: out.Stderr, Truncated: out.Truncated}, err
		}),
	}
}
