package sandbox

// The "cloudflare" tool profile (profiles.go): seed 000's names and fields,
// each tool a conversion onto a registry handler.

import (
	"cmp"
	"context"
	"encoding/base64"
	"fmt"

	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/tools"
)

// --- seed 000: the Cloudflare agent tool API ("## Tool Definitions") ---

type cfShellInput struct {
	Sandbox    string `json:"sandbox,omitempty" desc:"Name of the sandbox (box) in this session; created on first use." default:"default"`
	Command    string `json:"command" desc:"Shell command line, run with bash -c."`
	TimeoutMs  int    `json:"timeout_ms,omitempty" desc:"Kill the command (its whole process group) after this many milliseconds." default:"30000" minimum:"1"`
	WorkingDir string `json:"working_dir,omitempty" desc:"Directory to run in." default:"/workspace"`
}

type cfShellOutput struct {
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	ExitCode int    `json:"exit_code"`
}

type cfReadFileInput struct {
	Sandbox string `json:"sandbox,omitempty" desc:"Name of the sandbox (box) in this session; created on first use." default:"default"`
	Path    string `json:"path" desc:"File path, absolute or relative to /workspace."`
	Offset  int64  `json:"offset,omitempty" desc:"Byte offset" minimum:"0"`
	Limit   int64  `json:"limit,omitempty" desc:"Max bytes to read (at most 256 KiB per call)" minimum:"0"`
}

type cfReadFileOutput struct {
	Content string `json:"content"`
	Size    int64  `json:"size"`
}

type cfWriteFileInput struct {
	Sandbox string `json:"sandbox,omitempty" desc:"Name of the sandbox (box) in this session; created on first use." default:"default"`
	Path    string `json:"path" desc:"File path, absolute or relative to /workspace; parent directories are created."`
	Content string `json:"content" desc:"The file content (at most 2 MiB)."`
	Append  bool   `json:"append,omitempty" desc:"Append to the file instead of replacing it." default:"false"`
}

type cfWriteFileOutput struct {
	OK   bool  `json:"ok"`
	Size int64 `json:"size"`
}

type cfGlobInput struct {
	Sandbox string `json:"sandbox,omitempty" desc:"Name of the sandbox (box) in this session; created on first use." default:"default"`
	Pattern string `json:"pattern" desc:"Glob pattern; ** matches any number of directories."`
	Cwd     string `json:"cwd,omitempty" desc:"Directory relative patterns start from." default:"/workspace"`
}

type cfGlobOutput struct {
	Files []string `json:"files"`
}

type cfBrowseInput struct {
	Sandbox string `json:"sandbox,omitempty" desc:"Name of the sandbox (box) in this session; created on first use." default:"default"`
	Port    int    `json:"port" desc:"TCP port a server listens on inside the sandbox." minimum:"1" maximum:"65535"`
}

type cfBrowseOutput struct {
	URL string `json:"url"`
}

type cfSandboxCreateInput struct {
	Sandbox      string `json:"sandbox" desc:"Name of the sandbox in this session."`
	Image        string `json:"image,omitempty" desc:"Image: host (the host's /usr read-only) or cellbox/NAME built by cellbox image build." default:"host"`
	SleepAfterMs int64  `json:"sleep_after_ms,omitempty" desc:"Stop the sandbox after this many idle milliseconds; its files are kept." default:"600000" minimum:"0"`
}

type cfSandboxCreateOutput struct {
	Sandbox string `json:"sandbox"`
	Created bool   `json:"created"`
}

type cfSandbox struct {
	Name   string `json:"name"`
	Image  string `json:"image"`
	Status string `json:"status"`
}

type cfSandboxListOutput struct {
	Sandboxes []cfSandbox `json:"sandboxes"`
}

type cfTransferInput struct {
	FromSandbox string `json:"from_sandbox" desc:"Sandbox to copy from."`
	FromPath    string `json:"from_path" desc:"File (or, with recursive, directory) to copy."`
	ToSandbox   string `json:"to_sandbox" desc:"Sandbox to copy to."`
	ToPath      string `json:"to_path" desc:"Destination path."`
	Recursive   bool   `json:"recursive,omitempty" desc:"Copy a directory tree." default:"false"`
}

type cfTransferOutput struct {
	OK    bool  `json:"ok"`
	Bytes int64 `json:"bytes"`
}

// cloudflareTools is seed 000's tool set; descriptions are the seed's.
func cloudflareTools() []*tools.Tool {
	return []*tools.Tool{
		mapped("shell", "shell", "Execute a shell command in the sandbox.", func(ctx context.Context, c *call, in cfShellInput) (cfShellOutput, error) {
			out, err := profileShell(ctx, c, api.ShellInput{Sandbox: in.Sandbox, Command: in.Command, TimeoutMs: cmp.Or(in.TimeoutMs, tools.ShellTimeoutMs), WorkingDir: in.WorkingDir}, tools.ShellOutputCap)
			return cfShellOutput{Stdout: out.Stdout, Stderr: out.Stderr, ExitCode: out.ExitCode}, err
		}),
		mapped("read_file", "read_file", "Read a file from the sandbox filesystem.", func(ctx context.Context, c *call, in cfReadFileInput) (cfReadFileOutput, error) {
			limit := in.Limit
			if limit == 0 || limit > agent.DefaultReadBytes {
				limit = agent.DefaultReadBytes
			}
			res, err := tools.ReadFile(ctx, c, in.Sandbox, agent.ReadRequest{Path: in.Path, ByteOffset: in.Offset, ByteLimit: limit})
			if err != nil {
				return cfReadFileOutput{}, err
			}
			n := int64(len(res.Content))
			if res.Encoding == "base64" {
				n = int64(base64.StdEncoding.DecodedLen(len(res.Content)))
				if raw, err := base64.StdEncoding.DecodeString(res.Content); err == nil {
					n = int64(len(raw))
				}
			}
			more := ""
			if end := in.Offset + n; end < res.Size && (in.Limit == 0 || n < in.Limit) {
				more = fmt.Sprintf("read bytes %d to %d of %d; call read_file with offset %d for more", in.Offset, end, res.Size, end)
			}
			readNotices(c, res, more)
			return cfReadFileOutput{Content: res.Content, Size: res.Size}, nil
		}),
		mapped("write_file", "write_file", "Write content to a file in the sandbox.", func(ctx context.Context, c *call, in cfWriteFileInput) (cfWriteFileOutput, error) {
			out, err := tools.WriteFile(ctx, c, api.WriteFileInput{Sandbox: in.Sandbox, Path: in.Path, Content: in.Content, Append: in.Append})
			return cfWriteFileOutput{OK: out.OK, Size: out.Size}, err
		}),
		mapped("glob", "glob", "List files matching a glob pattern.", func(ctx context.Context, c *call, in cfGlobInput) (cfGlobOutput, error) {
			out, err := tools.Glob(ctx, c, api.GlobInput{Sandbox: in.Sandbox, Pattern: in.Pattern, Cwd: in.Cwd})
			if out.Truncated {
				c.Notice(fmt.Sprintf("only the first %d files are listed; narrow the pattern", tools.GlobMax))
			}
			return cfGlobOutput{Files: out.Files}, err
		}),
		mapped("browse", "browse", "Expose a port from the sandbox and return a public URL.", func(ctx context.Context, c *call, in cfBrowseInput) (cfBrowseOutput, error) {
			out, err := browseTool(ctx, c, api.BrowseInput{Sandbox: in.Sandbox, Port: in.Port})
			return cfBrowseOutput{URL: out.URL}, err
		}),
		mapped("sandbox_create", "sandbox_create", "Create a named sandbox. No-op if it already exists.", func(ctx context.Context, c *call, in cfSandboxCreateInput) (cfSandboxCreateOutput, error) {
			out, err := sandboxCreateTool(ctx, c, api.SandboxCreateInput{Sandbox: in.Sandbox, Image: in.Image, SleepAfterMs: in.SleepAfterMs})
			return cfSandboxCreateOutput{Sandbox: out.Sandbox, Created: out.Created}, err
		}),
		mapped("sandbox_list", "sandbox_list", "List all active sandboxes in this session.", func(ctx context.Context, c *call, in api.SandboxListInput) (cfSandboxListOutput, error) {
			out, err := sandboxListTool(ctx, c, in)
			list := cfSandboxListOutput{Sandboxes: []cfSandbox{}}
			for _, b := range out.Sandboxes {
				list.Sandboxes = append(list.Sandboxes, cfSandbox{Name: b.Name, Image: b.Image, Status: b.Status})
			}
			return list, err
		}),
		mapped("transfer", "transfer", "Copy files between sandboxes.", func(ctx context.Context, c *call, in cfTransferInput) (cfTransferOutput, error) {
			out, err := tools.Transfer(ctx, c, api.TransferInput{FromSandbox: in.FromSandbox, FromPath: in.FromPath, ToSandbox: in.ToSandbox, ToPath: in.ToPath, Recursive: in.Recursive})
			return cfTransferOutput{OK: out.OK, Bytes: out.Bytes}, err
		}),
	}
}
