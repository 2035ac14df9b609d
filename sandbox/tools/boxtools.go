package tools

import (
	"fmt"

	"github.com/cellbox/cellbox/sandbox/agent"
)

// The box tools: the registry's tools that work on one session's boxes
// through their agents (sandbox/agent), with handlers in this package
// (shell.go, files.go, code.go, port.go). The sandbox service lists them
// among its own tools (which make, list, snapshot and remove boxes) and
// runs them with its per-call value, a Call.

// BoxTools are shell, process, and the file tools, in the order the
// registry lists them.
func BoxTools() []*Tool {
	return []*Tool{
		Define("shell", Meta{Title: "Run a shell command", Destructive: true, OpenWorld: true},
			"Run a shell command in a sandbox and return its stdout, stderr and exit code (each stream capped at 64 KiB; truncated says so). The command is killed with its whole process group after timeout_ms. Every process the command leaves running (`cmd &`, nohup, setsid) is ended when the call returns: start servers and long jobs with background: true and follow them with the process tool. If the sandbox is out of processes (a fork bomb), leftovers and then every other process are ended so the command can run; a notice says so.",
			shellTool),
		Define("process", Meta{Title: "Manage background processes", Destructive: true},
			"Manage background processes of a sandbox: list them, read a process's output from an offset (logs), or kill it (and its process group); kill_all ends every process of the sandbox but its agent.",
			processTool),
		Define("read_file", Meta{Title: "Read a file", ReadOnly: true, Idempotent: true},
			"Read a text file, a window of lines at a time (at most 2000 lines / 256 KiB per call; next_offset continues). A line longer than 2000 characters is cut, marked \"… [line truncated]\" (read a minified file with grep, or shell with head -c / cut). Binary files come back base64-encoded, 256 KiB at a time; their offset and next_offset count bytes.",
			readFileTool),
		Define("write_file", Meta{Title: "Write a file", Destructive: true},
			"Write (or append to) a file (at most 2 MiB). Parent directories are created; an existing file keeps its mode.",
			WriteFile),
		Define("edit", Meta{Title: "Edit a file", Destructive: true},
			"Apply several replacements to a file at once. Each oldText must occur exactly once in the ORIGINAL file; edits must not overlap. Line endings and BOM are kept; small whitespace differences are tolerated. Returns a unified diff.",
			Edit),
		Define("str_replace", Meta{Title: "Replace text in a file", Destructive: true},
			"Replace old_str by new_str in a file. old_str must occur exactly once unless replace_all is set. Returns a unified diff.",
			StrReplace),
		Define("grep", Meta{Title: "Search file contents", ReadOnly: true, Idempotent: true},
			"Search file contents under a path (literal text, or a regular expression with regex: true). Returns matching lines with path and line number; truncated says the hit cap was reached — refine the query.",
			Grep),
		Define("glob", Meta{Title: "Find files by pattern", ReadOnly: true, Idempotent: true},
			"List files matching a glob pattern (** matches across directories), sorted.",
			Glob),
		Define("ls", Meta{Title: "List a directory", ReadOnly: true, Idempotent: true},
			"List a directory two levels deep as a tree.",
			Ls),
		Define("transfer", Meta{Title: "Copy between sandboxes", Destructive: true, Idempotent: true},
			"Copy a file, or with recursive a directory tree, from one sandbox of this session to another (or within one, though not a directory into itself). Binary-safe and streamed; an existing directory as the destination receives the copy inside it, as cp does.",
			Transfer),
	}
}

// WaitPortTool is wait_port.
func WaitPortTool() *Tool {
	return Define("wait_port", Meta{Title: "Wait for a server's port", ReadOnly: true, Idempotent: true},
		"Wait until a TCP port inside a sandbox accepts connections (a server started in the background is up), at most timeout_ms. listening says whether it does.",
		waitPortTool)
}

// CodeTools are run_code and the code context tools.
func CodeTools() []*Tool {
	return []*Tool{
		Define("run_code", Meta{Title: "Run code", Destructive: true, OpenWorld: true},
			"Run Python, JavaScript (node) or bash code in a sandbox and return stdout, stderr, the value of the last expression (repr / util.inspect), an exception with its traceback (bash: exit_code), and rich outputs (matplotlib plots as PNG; display(...) of HTML, SVG, JSON, images). Top-level await works in Python and JavaScript. Stateless by default (a fresh interpreter per call); pass context (from code_context_create) to keep variables, imports and definitions between calls. timeout_ms interrupts the code (a context survives). Images: python has matplotlib and numpy, node has node, host uses the host's /usr (python3).",
			runCodeTool),
		Define("code_context_create", Meta{Title: "Create a code context"},
			fmt.Sprintf("Start a code context: a long-running python, javascript (node) or bash interpreter in a sandbox whose variables, imports, definitions (and for bash cwd and shell variables) persist between run_code calls that name it. At most %d per sandbox; a context ends when its sandbox stops (restart or idle sleep).", agent.MaxCodeContexts),
			codeContextCreateTool),
		Define("code_context_list", Meta{Title: "List code contexts", ReadOnly: true, Idempotent: true},
			"List the code contexts of a sandbox with their language, number of calls and whether one is running.",
			codeContextListTool),
		Define("code_context_delete", Meta{Title: "Delete a code context", Destructive: true},
			"End a code context: its interpreter (and what it started) is killed and its state is gone.",
			codeContextDeleteTool),
	}
}
