package sandbox

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/api"
)

// Tool profiles: the tool sets agents are already written against (the
// seed documents beside DESIGN.md), served under their own names, fields
// and result shapes. A profile's tool does no work itself: it converts its
// input into the input of one registry handler (tools_box.go,
// tools_files.go), calls it, and converts the result. So every rule of the
// registry — paths confined to the box, caps, allowed_commands, notices —
// holds in every profile.

// DefaultProfile is cellbox's own tool set, the registry itself.
const DefaultProfile = "cellbox"

// ErrUnknownProfile is returned (wrapped) for a profile name that does not
// exist.
var ErrUnknownProfile = errors.New("unknown tool profile")

// Profile is a named tool set.
type Profile struct {
	Name string
	// Seed says where the names, fields and result shapes come from.
	Seed   string
	tools  []*Tool
	byName map[string]*Tool
}

// Tools returns the profile's tools, in the order its seed lists them.
func (p *Profile) Tools() []*Tool { return p.tools }

var (
	profilesOnce sync.Once
	profileList  []*Profile
)

// Profiles returns every profile, the default first.
func Profiles() []*Profile {
	profilesOnce.Do(func() {
		profileList = []*Profile{
			{Name: DefaultProfile, Seed: "cellbox's own tools (docs/tools.md)", tools: Tools()},
			{Name: "cloudflare", Seed: "seed 000, the Cloudflare agent tool API", tools: cloudflareTools()},
			{Name: "fs-tools", Seed: "seed 003, @cloudflare/fs-tools", tools: fsTools()},
			{Name: "deerflow", Seed: "seed 004, the DeerFlow sandbox tools", tools: deerflowTools()},
		}
		for _, p := range profileList {
			p.byName = map[string]*Tool{}
			for _, t := range p.tools {
				if p.byName[t.Name] != nil {
					panic("sandbox: tool defined twice in profile " + p.Name + ": " + t.Name)
				}
				if p.Name != DefaultProfile {
					if _, ok := LookupTool(t.Base); !ok {
						panic("sandbox: profile tool " + p.Name + "/" + t.Name + " maps onto no registry tool")
					}
					t.Profile = p.Name
				}
				p.byName[t.Name] = t
			}
		}
	})
	return profileList
}

func profileNames() []string {
	var names []string
	for _, p := range Profiles() {
		names = append(names, p.Name)
	}
	return names
}

// LookupProfile returns the profile called name ("" is the default).
func LookupProfile(name string) (*Profile, error) {
	if name == "" {
		name = DefaultProfile
	}
	for _, p := range Profiles() {
		if p.Name == name {
			return p, nil
		}
	}
	return nil, fmt.Errorf("%w %q; profiles: %s", ErrUnknownProfile, name, strings.Join(profileNames(), ", "))
}

// ToolInfosFor describes the tools of profile (GET /v1/tools?profile=).
func ToolInfosFor(profile string) ([]api.ToolInfo, error) {
	p, err := LookupProfile(profile)
	if err != nil {
		return nil, err
	}
	return toolInfos(p.tools), nil
}

// LookupToolIn returns the tool called name in profile ("" is the
// default), for a face that needs the tool itself (its Base, ResultText).
func LookupToolIn(profile, name string) (*Tool, error) {
	p, err := LookupProfile(profile)
	if err != nil {
		return nil, err
	}
	t, ok := p.byName[name]
	if !ok {
		return nil, fmt.Errorf("%w %q in profile %s; tools: %s", ErrUnknownTool, name, p.Name, strings.Join(toolNames(p.tools), ", "))
	}
	return t, nil
}

// ResultText is the text a model should see for a result object of t: for
// a tool whose seed returns a plain string (TextResult), that string (or
// the error message, with any notice after it); otherwise the object
// itself.
func (t *Tool) ResultText(result json.RawMessage) string {
	if !t.TextResult {
		return string(result)
	}
	var r struct {
		Error  string `json:"error"`
		Notice string `json:"notice"`
		Output string `json:"output"`
	}
	if err := json.Unmarshal(result, &r); err != nil {
		return string(result)
	}
	text := r.Output
	if r.Error != "" {
		text = "Error: " + r.Error
	}
	if r.Notice != "" {
		text += "\n(" + r.Notice + ")"
	}
	return text
}

// mapped defines a profile's tool: name and input type In are the seed's,
// base is the registry tool whose handler h calls.
func mapped[In any, Out any](base, name, description string, h func(ctx context.Context, c *call, in In) (Out, error)) *Tool {
	t := defineTool(name, description, h)
	t.Base = base
	_, t.TextResult = any(*new(Out)).(textOutput)
	return t
}

// textOutput is the result of a tool whose seed returns a plain string.
type textOutput struct {
	Output string `json:"output"`
}

// readNotices tells, in a notice, what a read result's content field does
// not: that it is base64, or that the file goes on.
func readNotices(c *call, res agent.ReadResult, more string) {
	if res.Encoding == "base64" {
		c.notice("the file is not UTF-8 text; content is its bytes base64-encoded")
	}
	if more != "" {
		c.notice(more)
	}
}

// profileShell runs a command for a profile's command tool. shell's hint
// names fields these tools lack (background, timeout_ms), so a timeout or a
// cut is told in a notice of its own.
func profileShell(ctx context.Context, c *call, in api.ShellInput, maxOutput int) (api.ShellOutput, error) {
	out, err := runShell(ctx, c, in, maxOutput)
	switch {
	case err != nil:
	case out.TimedOut:
		c.notice(fmt.Sprintf("the command was still running after %d ms and was killed with its process group; the output so far is above. Run long jobs in the background (nohup CMD > log 2>&1 &) and read their log.", in.TimeoutMs))
	case out.Truncated:
		c.notice(fmt.Sprintf("output was cut at %d KiB per stream; redirect it to a file and read that", maxOutput>>10))
	}
	return out, err
}

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
func cloudflareTools() []*Tool {
	return []*Tool{
		mapped("shell", "shell", "Execute a shell command in the sandbox.", func(ctx context.Context, c *call, in cfShellInput) (cfShellOutput, error) {
			out, err := profileShell(ctx, c, api.ShellInput{Sandbox: in.Sandbox, Command: in.Command, TimeoutMs: cmp.Or(in.TimeoutMs, shellTimeoutMs), WorkingDir: in.WorkingDir}, shellOutputCap)
			return cfShellOutput{Stdout: out.Stdout, Stderr: out.Stderr, ExitCode: out.ExitCode}, err
		}),
		mapped("read_file", "read_file", "Read a file from the sandbox filesystem.", func(ctx context.Context, c *call, in cfReadFileInput) (cfReadFileOutput, error) {
			limit := in.Limit
			if limit == 0 || limit > agent.DefaultReadBytes {
				limit = agent.DefaultReadBytes
			}
			res, err := readFile(ctx, c, in.Sandbox, agent.ReadRequest{Path: in.Path, ByteOffset: in.Offset, ByteLimit: limit})
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
			out, err := writeFileTool(ctx, c, api.WriteFileInput{Sandbox: in.Sandbox, Path: in.Path, Content: in.Content, Append: in.Append})
			return cfWriteFileOutput{OK: out.OK, Size: out.Size}, err
		}),
		mapped("glob", "glob", "List files matching a glob pattern.", func(ctx context.Context, c *call, in cfGlobInput) (cfGlobOutput, error) {
			out, err := globTool(ctx, c, api.GlobInput{Sandbox: in.Sandbox, Pattern: in.Pattern, Cwd: in.Cwd})
			if out.Truncated {
				c.notice(fmt.Sprintf("only the first %d files are listed; narrow the pattern", globMax))
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
			out, err := transferTool(ctx, c, api.TransferInput{FromSandbox: in.FromSandbox, FromPath: in.FromPath, ToSandbox: in.ToSandbox, ToPath: in.ToPath, Recursive: in.Recursive})
			return cfTransferOutput{OK: out.OK, Bytes: out.Bytes}, err
		}),
	}
}

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
func fsTools() []*Tool {
	return []*Tool{
		mapped("read_file", "read", "Read a text file, a window of lines at a time (at most 2000 lines / 256 KiB per call). When the file goes on, nextOffset is the offset to call read with next.", func(ctx context.Context, c *call, in fsReadInput) (fsReadOutput, error) {
			res, err := readFile(ctx, c, "", agent.ReadRequest{Path: in.Path, Offset: in.Offset, Limit: in.Limit})
			if err != nil {
				return fsReadOutput{}, err
			}
			readNotices(c, res, "")
			return fsReadOutput{Content: res.Content, NextOffset: res.NextOffset}, nil
		}),
		mapped("write_file", "write", "Overwrite a file with content (at most 2 MiB). An existing file keeps its mode.", func(ctx context.Context, c *call, in fsWriteInput) (fsWriteOutput, error) {
			if len(in.Content) > fileToolMaxBytes {
				return fsWriteOutput{}, fmt.Errorf("content is %d bytes; write takes at most %d (2 MiB): change a large file with edit", len(in.Content), fileToolMaxBytes)
			}
			out, err := writeFileTool(ctx, c, api.WriteFileInput{Path: in.Path, Content: in.Content})
			return fsWriteOutput{OK: out.OK, Size: out.Size}, err
		}),
		mapped("edit", "edit", "Apply several replacements to a file at once. Each oldText is matched against the ORIGINAL file (not the result of the edits before it), so edits must not overlap; small whitespace differences are tolerated. Returns a unified diff.", func(ctx context.Context, c *call, in fsEditInput) (api.EditOutput, error) {
			return editTool(ctx, c, api.EditInput{Path: in.Path, Edits: in.Edits})
		}),
		mapped("grep", "grep", "Search file contents under a path. Returns { hits: [{path, line, text}], truncated }; truncated means the hit cap (200) was reached — refine the query.", func(ctx context.Context, c *call, in fsGrepInput) (api.GrepOutput, error) {
			return grepTool(ctx, c, api.GrepInput{Pattern: in.Pattern, Path: in.Path, Regex: in.Regex, IgnoreCase: in.IgnoreCase, Glob: in.Glob})
		}),
		mapped("shell", "exec", "Run a shell command in the sandbox and return { exitCode, stdout, stderr, truncated }. stdout and stderr are each capped at 32 KiB; the command is killed after 60 s.", func(ctx context.Context, c *call, in fsExecInput) (fsExecOutput, error) {
			out, err := profileShell(ctx, c, api.ShellInput{Command: in.Command, WorkingDir: in.Cwd, TimeoutMs: fsExecTimeoutMs}, fsExecOutputCap)
			return fsExecOutput{ExitCode: out.ExitCode, Stdout: out.Stdout, Stderr: out.Stderr, Truncated: out.Truncated}, err
		}),
	}
}

// --- seed 004: the DeerFlow sandbox tools (sections bash, ls, read_file,
// write_file, str_replace) ---
//
// Each takes description first; each returns a string. They drive the
// session's default box.

// dfBashTimeoutMs bounds a bash call, whose seed has no timeout field.
const dfBashTimeoutMs = 10 * 60 * 1000

type dfBashInput struct {
	Description string `json:"description" desc:"Explain why you are running this command in short words. ALWAYS PROVIDE THIS PARAMETER FIRST."`
	Command     string `json:"command" desc:"The bash command to execute. Always use absolute paths for files and directories."`
}

type dfLsInput struct {
	Description string `json:"description" desc:"Explain why you are listing this directory in short words. ALWAYS PROVIDE THIS PARAMETER FIRST."`
	Path        string `json:"path" desc:"The absolute path to the directory to list."`
}

type dfReadFileInput struct {
	Description string `json:"description" desc:"Explain why you are reading this file in short words. ALWAYS PROVIDE THIS PARAMETER FIRST."`
	Path        string `json:"path" desc:"The absolute path to the file to read."`
	StartLine   int    `json:"start_line,omitempty" desc:"Optional starting line number (1-indexed, inclusive). Use with end_line to read a specific range." minimum:"1"`
	EndLine     int    `json:"end_line,omitempty" desc:"Optional ending line number (1-indexed, inclusive). Use with start_line to read a specific range." minimum:"1"`
}

type dfWriteFileInput struct {
	Description string `json:"description" desc:"Explain why you are writing to this file in short words. ALWAYS PROVIDE THIS PARAMETER FIRST."`
	Path        string `json:"path" desc:"The absolute path to the file to write to. ALWAYS PROVIDE THIS PARAMETER SECOND."`
	Content     string `json:"content" desc:"The content to write to the file. ALWAYS PROVIDE THIS PARAMETER THIRD."`
	Append      bool   `json:"append,omitempty" desc:"Whether to append to the file instead of overwriting. Default is False." default:"false"`
}

type dfStrReplaceInput struct {
	Description string `json:"description" desc:"Explain why you are replacing the substring in short words. ALWAYS PROVIDE THIS PARAMETER FIRST."`
	Path        string `json:"path" desc:"The absolute path to the file to replace the substring in. ALWAYS PROVIDE THIS PARAMETER SECOND."`
	OldStr      string `json:"old_str" desc:"The substring to replace. ALWAYS PROVIDE THIS PARAMETER THIRD."`
	NewStr      string `json:"new_str" desc:"The new substring. ALWAYS PROVIDE THIS PARAMETER FOURTH."`
	ReplaceAll  bool   `json:"replace_all,omitempty" desc:"Whether to replace all occurrences of the substring. If False (default), the substring must appear exactly once in the file." default:"false"`
}

// deerflowTools is seed 004's tool set; descriptions are the seed's.
func deerflowTools() []*Tool {
	return []*Tool{
		mapped("shell", "bash", "Execute a bash command in a Linux environment.", func(ctx context.Context, c *call, in dfBashInput) (textOutput, error) {
			out, err := profileShell(ctx, c, api.ShellInput{Command: in.Command, TimeoutMs: dfBashTimeoutMs}, shellOutputCap)
			if err != nil {
				return textOutput{}, err
			}
			text := out.Stdout
			if out.Stderr != "" {
				text += "\nStd Error:\n" + out.Stderr
			}
			if out.ExitCode != 0 {
				text += fmt.Sprintf("\nExit Code: %d", out.ExitCode)
			}
			if text == "" {
				text = "(no output)"
			}
			return textOutput{Output: text}, nil
		}),
		mapped("ls", "ls", "List the contents of a directory up to 2 levels deep in tree format.", func(ctx context.Context, c *call, in dfLsInput) (textOutput, error) {
			out, err := lsTool(ctx, c, api.LsInput{Path: in.Path})
			return textOutput{Output: out.Tree}, err
		}),
		mapped("read_file", "read_file", "Read the contents of a text file. Use this to examine source code, configuration files, logs, or any text-based file.", func(ctx context.Context, c *call, in dfReadFileInput) (textOutput, error) {
			req := agent.ReadRequest{Path: in.Path, Offset: in.StartLine}
			if in.EndLine > 0 {
				if in.EndLine < max(in.StartLine, 1) {
					return textOutput{}, fmt.Errorf("end_line %d is before start_line %d", in.EndLine, in.StartLine)
				}
				req.Limit = in.EndLine - max(in.StartLine, 1) + 1
			}
			res, err := readFile(ctx, c, "", req)
			if err != nil {
				return textOutput{}, err
			}
			more := ""
			if res.NextOffset > 0 && (in.EndLine == 0 || res.NextOffset <= in.EndLine) {
				more = fmt.Sprintf("lines %d-%d of %d shown; read on with start_line %d", res.StartLine, res.EndLine, res.TotalLines, res.NextOffset)
			}
			readNotices(c, res, more)
			if res.Size == 0 {
				return textOutput{Output: "(empty)"}, nil
			}
			return textOutput{Output: res.Content}, nil
		}),
		mapped("write_file", "write_file", "Write text content to a file.", func(ctx context.Context, c *call, in dfWriteFileInput) (textOutput, error) {
			_, err := writeFileTool(ctx, c, api.WriteFileInput{Path: in.Path, Content: in.Content, Append: in.Append})
			return textOutput{Output: "OK"}, err
		}),
		mapped("str_replace", "str_replace", "Replace a substring in a file with another substring.", func(ctx context.Context, c *call, in dfStrReplaceInput) (textOutput, error) {
			_, err := strReplaceTool(ctx, c, api.StrReplaceInput{Path: in.Path, OldStr: in.OldStr, NewStr: in.NewStr, ReplaceAll: in.ReplaceAll})
			return textOutput{Output: "OK"}, err
		}),
	}
}
