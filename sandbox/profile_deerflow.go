package sandbox

// The "deerflow" tool profile (profiles.go): seed 004's names and fields,
// each tool a conversion onto a registry handler.

import (
	"context"
	"fmt"

	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/tools"
)

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
func deerflowTools() []*tools.Tool {
	return []*tools.Tool{
		mapped("shell", "bash", "Execute a bash command in a Linux environment.", func(ctx context.Context, c *call, in dfBashInput) (textOutput, error) {
			out, err := profileShell(ctx, c, api.ShellInput{Command: in.Command, TimeoutMs: dfBashTimeoutMs}, tools.ShellOutputCap)
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
			out, err := tools.Ls(ctx, c, api.LsInput{Path: in.Path})
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
			res, err := tools.ReadFile(ctx, c, "", req)
			if err != nil {
				return textOutput{}, err
			}
			more := ""
			switch {
			case res.NextOffset > 0 && res.Encoding == "base64": // a binary file: offsets count bytes
				more = fmt.Sprintf("bytes %d-%d of %d shown; read on with start_line %d (of a binary file, it counts bytes)", max(in.StartLine, 1), res.NextOffset-1, res.Size, res.NextOffset)
			case res.NextOffset > 0 && (in.EndLine == 0 || res.NextOffset <= in.EndLine):
				more = fmt.Sprintf("lines %d-%d of %d shown; read on with start_line %d", res.StartLine, res.EndLine, res.TotalLines, res.NextOffset)
			}
			readNotices(c, res, more)
			if res.Size == 0 {
				return textOutput{Output: "(empty)"}, nil
			}
			return textOutput{Output: res.Content}, nil
		}),
		mapped("write_file", "write_file", "Write text content to a file.", func(ctx context.Context, c *call, in dfWriteFileInput) (textOutput, error) {
			_, err := tools.WriteFile(ctx, c, api.WriteFileInput{Path: in.Path, Content: in.Content, Append: in.Append})
			return textOutput{Output: "OK"}, err
		}),
		mapped("str_replace", "str_replace", "Replace a substring in a file with another substring.", func(ctx context.Context, c *call, in dfStrReplaceInput) (textOutput, error) {
			_, err := tools.StrReplace(ctx, c, api.StrReplaceInput{Path: in.Path, OldStr: in.OldStr, NewStr: in.NewStr, ReplaceAll: in.ReplaceAll})
			return textOutput{Output: "OK"}, err
		}),
	}
}
