// Package api holds the wire types shared by the sandbox service and its
// clients (sandboxclient): the tools' input and output objects, the
// streaming exec frames, watch events and errors, and the checks of a
// box's network rules (NetworkRules.Check), which the egress proxy compiles
// and the pattern compiler runs on a pattern's. It imports nothing of
// cellbox but internal leaves, so both sides can use it.
//
// Every tool input struct is also the source of the tool's JSON Schema
// (internal/jsonschema): json tags name the fields, omitempty makes a field
// optional, and desc/default/enum/minimum tags document it.
package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

// DefaultBox is the box name used when a tool input names none.
const DefaultBox = "default"

// Tool result fields every result object carries.
const (
	FieldIsError = "is_error"
	FieldError   = "error"
	FieldCode    = "code" // with error: one of the Code constants
	FieldNotice  = "notice"
)

// ToolInfo describes one tool (GET /v1/tools).
type ToolInfo struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// ToolError is a tool result with is_error: true, returned as a Go error by
// the clients. Message is written for a model (or a person) to act on.
type ToolError struct {
	Tool    string
	Code    string // one of the Code constants ("" from a server without codes)
	Message string
	// Result is the whole result object.
	Result json.RawMessage
}

func (e *ToolError) Error() string { return e.Tool + ": " + e.Message }

// ErrorCode returns the code of the result.
func (e *ToolError) ErrorCode() string { return e.Code }

// Is makes errors.Is(err, ErrNoBox) (and the other sentinels) hold for the
// result's code.
func (e *ToolError) Is(target error) bool { return target != nil && target == Sentinel(e.Code) }

// ErrorBody is the body of every 4xx/5xx answer of the HTTP API.
type ErrorBody struct {
	Error string `json:"error"`
	Code  string `json:"code,omitempty"` // one of the Code constants
}

// NewSessionRequest is the (optional) body of POST /v1/sessions.
type NewSessionRequest struct {
	// AllowedCommands, if not empty, limits every command of the session
	// (shell and its profile forms, the exec endpoint) to command lines
	// starting with one of these prefixes (seed 003's allowedCommands).
	// A command outside the list is refused before it reaches a box.
	AllowedCommands []string `json:"allowed_commands,omitempty"`
	// The session's defaults for its boxes (seed 002's workspace
	// settings); sandbox_create's inputs of the same names override them.
	BoxDefaults
}

// BoxDefaults are the settings every box of a session gets unless
// sandbox_create says otherwise.
type BoxDefaults struct {
	// Env is merged under each box's own env (the box's keys win).
	Env map[string]string `json:"env,omitempty"`
	// WorkspaceDir is the boxes' working directory (default /workspace).
	WorkspaceDir string `json:"workspace_dir,omitempty"`
	// DestroyOnClose destroys the boxes when the session closes: it is
	// deleted or expires (as every box), or the last MCP session served
	// on it ends (without it, boxes outlive MCP sessions and sleep).
	DestroyOnClose bool `json:"destroy_on_close,omitempty"`
}

// NewSessionResult is the answer of POST /v1/sessions.
type NewSessionResult struct {
	ID    string `json:"id"`
	Token string `json:"token"`
}

// Limits bound what a box may use; zero means the backend default.
type Limits struct {
	MemoryBytes int64   `json:"memory_bytes,omitempty" desc:"Memory limit in bytes (default 1 GiB)." minimum:"0"`
	CPUs        float64 `json:"cpus,omitempty" desc:"CPU limit in cores (default 1)." minimum:"0"`
	Pids        int64   `json:"pids,omitempty" desc:"Maximum number of processes (default 256)." minimum:"0"`
	DiskBytes   int64   `json:"disk_bytes,omitempty" desc:"Disk cap in bytes for /workspace and /tmp together (default 4 GiB, at least 64 MiB); past it writes fail with 'No space left on device'." minimum:"0"`
}

// ShellInput is the input of the shell tool.
type ShellInput struct {
	Sandbox    string            `json:"sandbox,omitempty" desc:"Name of the sandbox (box) in this session; created on first use." default:"default"`
	Command    string            `json:"command" desc:"Shell command line, run with bash -c (sh if bash is missing)."`
	WorkingDir string            `json:"working_dir,omitempty" desc:"Directory to run in." default:"/workspace"`
	TimeoutMs  int               `json:"timeout_ms,omitempty" desc:"Kill the command (its whole process group) after this many milliseconds. Use background for servers." default:"30000" minimum:"1"`
	Env        map[string]string `json:"env,omitempty" desc:"Extra environment variables."`
	Background bool              `json:"background,omitempty" desc:"Start the command in the background and return its process_id at once (dev servers, long jobs); see the process tool."`
}

// ShellOutput is the result of the shell tool.
type ShellOutput struct {
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	ExitCode   int    `json:"exit_code"`
	Truncated  bool   `json:"truncated"`
	TimedOut   bool   `json:"timed_out,omitempty"`
	ProcessID  string `json:"process_id,omitempty"`
	DurationMs int64  `json:"duration_ms"`
	Hint       string `json:"hint,omitempty"`
}

// ProcessInput is the input of the process tool.
type ProcessInput struct {
	Sandbox string `json:"sandbox,omitempty" desc:"Name of the sandbox (box) in this session; created on first use." default:"default"`
	Action  string `json:"action" desc:"list: all processes; logs: output of process id from offset; kill: terminate process id (and its group); kill_all: end every process of the sandbox (background ones included) but its agent, e.g. after a fork bomb." enum:"list,logs,kill,kill_all"`
	ID      string `json:"id,omitempty" desc:"Process id (from shell with background: true, or from list); needed by logs and kill."`
	Offset  int64  `json:"offset,omitempty" desc:"logs: byte offset to read from (next_offset of the previous call). The last 1 MiB of a process's output is kept: output from before it is gone, and the result's dropped says how many bytes from offset on were (its output then starts at offset + dropped)." minimum:"0"`
}

// Process is one entry of the process list.
type Process struct {
	ID       string     `json:"id"`
	Command  string     `json:"command"`
	PID      int        `json:"pid"`
	Running  bool       `json:"running"`
	ExitCode *int       `json:"exit_code,omitempty"`
	Started  time.Time  `json:"started"`
	Ended    *time.Time `json:"ended,omitempty"`
}

// ProcessOutput is the result of the process tool; which fields are set
// depends on the action.
type ProcessOutput struct {
	Processes  []Process `json:"processes,omitempty"`
	Output     string    `json:"output,omitempty"`
	NextOffset int64     `json:"next_offset,omitempty"` // logs: where the next call reads on from
	Dropped    int64     `json:"dropped,omitempty"`     // logs: bytes from offset on no longer kept (the last 1 MiB is); output starts at offset + dropped
	Truncated  bool      `json:"truncated,omitempty"`   // logs: more output follows (at most 64 KiB a call)
	Running    *bool     `json:"running,omitempty"`
	ExitCode   *int      `json:"exit_code,omitempty"`
	OK         bool      `json:"ok,omitempty"`
	Ended      *int      `json:"ended,omitempty"` // kill_all: how many processes were ended
}

// ReadFileInput is the input of the read_file tool.
type ReadFileInput struct {
	Sandbox string `json:"sandbox,omitempty" desc:"Name of the sandbox (box) in this session; created on first use." default:"default"`
	Path    string `json:"path" desc:"File path, absolute or relative to /workspace."`
	Offset  int    `json:"offset,omitempty" desc:"1-indexed line to start at (next_offset of the previous call). Of a binary file (encoding base64) it counts bytes instead: the 1-indexed byte to start at." minimum:"0"`
	Limit   int    `json:"limit,omitempty" desc:"Maximum number of lines (at most 2000; at most 256 KiB are returned per call). A binary file comes in windows of 256 KiB whatever the limit." minimum:"0"`
}

// ReadFileOutput is the result of the read_file tool.
type ReadFileOutput struct {
	Content    string `json:"content"`
	Encoding   string `json:"encoding"`
	TotalLines int    `json:"total_lines"`
	StartLine  int    `json:"start_line"`
	EndLine    int    `json:"end_line"`
	NextOffset int    `json:"next_offset,omitempty"` // the offset to read on from (a line; of a binary file, a byte); none at the end
	Truncated  bool   `json:"truncated"`
	Size       int64  `json:"size"`
}

// WriteFileInput is the input of the write_file tool.
type WriteFileInput struct {
	Sandbox  string `json:"sandbox,omitempty" desc:"Name of the sandbox (box) in this session; created on first use." default:"default"`
	Path     string `json:"path" desc:"File path, absolute or relative to /workspace; parent directories are created."`
	Content  string `json:"content" desc:"The file content (at most 2 MiB)."`
	Append   bool   `json:"append,omitempty" desc:"Append to the file instead of replacing it."`
	Encoding string `json:"encoding,omitempty" desc:"Encoding of content: utf-8 text or base64 for binary data." default:"utf-8" enum:"utf-8,base64"`
}

// WriteFileOutput is the result of the write_file tool.
type WriteFileOutput struct {
	OK   bool   `json:"ok"`
	Size int64  `json:"size"`
	Path string `json:"path"`
}

// Edit is one replacement of the edit tool. The field names are those of
// seed 003's edit tool (fs-tools), so an agent written against it works
// unchanged.
type Edit struct {
	OldText string `json:"oldText" desc:"Text to replace; must occur exactly once in the original file."`
	NewText string `json:"newText" desc:"Replacement text."`
}

// EditInput is the input of the edit tool.
type EditInput struct {
	Sandbox string `json:"sandbox,omitempty" desc:"Name of the sandbox (box) in this session; created on first use." default:"default"`
	Path    string `json:"path" desc:"File path, absolute or relative to /workspace."`
	Edits   []Edit `json:"edits" desc:"Replacements, each matched against the ORIGINAL file (not applied one after another); they must not overlap."`
}

// EditOutput is the result of the edit and str_replace tools.
type EditOutput struct {
	OK           bool   `json:"ok"`
	Diff         string `json:"diff"`
	Replacements int    `json:"replacements"`
	Fuzzy        []int  `json:"fuzzy,omitempty"`
}

// StrReplaceInput is the input of the str_replace tool.
type StrReplaceInput struct {
	Sandbox    string `json:"sandbox,omitempty" desc:"Name of the sandbox (box) in this session; created on first use." default:"default"`
	Path       string `json:"path" desc:"File path, absolute or relative to /workspace."`
	OldStr     string `json:"old_str" desc:"Text to replace; must occur exactly once unless replace_all."`
	NewStr     string `json:"new_str" desc:"Replacement text."`
	ReplaceAll bool   `json:"replace_all,omitempty" desc:"Replace every occurrence."`
}

// GrepInput is the input of the grep tool.
type GrepInput struct {
	Sandbox    string `json:"sandbox,omitempty" desc:"Name of the sandbox (box) in this session; created on first use." default:"default"`
	Pattern    string `json:"pattern" desc:"Text to search for (literal unless regex)."`
	Path       string `json:"path,omitempty" desc:"File or directory to search." default:"/workspace"`
	Regex      bool   `json:"regex,omitempty" desc:"Treat pattern as a regular expression (Go RE2 syntax)."`
	IgnoreCase bool   `json:"ignore_case,omitempty" desc:"Match case-insensitively."`
	Glob       string `json:"glob,omitempty" desc:"Only search files whose path matches this glob (e.g. **/*.go)."`
	MaxHits    int    `json:"max_hits,omitempty" desc:"Maximum number of hits." default:"200" minimum:"0"`
}

// GrepHit is one matching line.
type GrepHit struct {
	Path string `json:"path"`
	Line int    `json:"line"`
	Text string `json:"text"`
}

// GrepOutput is the result of the grep tool.
type GrepOutput struct {
	Hits      []GrepHit `json:"hits"`
	Truncated bool      `json:"truncated"`
	// Skipped names what could not be searched (unreadable, or a path
	// longer than the system allows), with why; at most 20.
	Skipped []string `json:"skipped,omitempty" desc:"What could not be searched, with why (at most 20): a match there was missed."`
}

// GlobInput is the input of the glob tool.
type GlobInput struct {
	Sandbox string `json:"sandbox,omitempty" desc:"Name of the sandbox (box) in this session; created on first use." default:"default"`
	Pattern string `json:"pattern" desc:"Glob pattern; ** matches any number of directories (e.g. src/**/*.ts)."`
	Cwd     string `json:"cwd,omitempty" desc:"Directory relative patterns start from." default:"/workspace"`
}

// GlobOutput is the result of the glob tool.
type GlobOutput struct {
	Files     []string `json:"files"`
	Truncated bool     `json:"truncated"`
}

// LsInput is the input of the ls tool.
type LsInput struct {
	Sandbox string `json:"sandbox,omitempty" desc:"Name of the sandbox (box) in this session; created on first use." default:"default"`
	Path    string `json:"path,omitempty" desc:"Directory to list (two levels deep)." default:"/workspace"`
}

// Entry is one node of an ls listing.
type Entry struct {
	Path     string  `json:"path"`
	Type     string  `json:"type"`
	Size     int64   `json:"size"`
	Children []Entry `json:"children,omitempty"`
}

// LsOutput is the result of the ls tool.
type LsOutput struct {
	Tree      string  `json:"tree"`
	Entries   []Entry `json:"entries"`
	Truncated bool    `json:"truncated"`
}

// TransferInput is the input of the transfer tool.
type TransferInput struct {
	FromSandbox string `json:"from_sandbox,omitempty" desc:"Sandbox to copy from." default:"default"`
	FromPath    string `json:"from_path" desc:"File (or, with recursive, directory) to copy."`
	ToSandbox   string `json:"to_sandbox,omitempty" desc:"Sandbox to copy to." default:"default"`
	ToPath      string `json:"to_path" desc:"Destination path; if it is an existing directory the source is copied into it."`
	Recursive   bool   `json:"recursive,omitempty" desc:"Copy a directory tree."`
}

// TransferOutput is the result of the transfer tool.
type TransferOutput struct {
	OK    bool   `json:"ok"`
	Bytes int64  `json:"bytes"`
	Path  string `json:"path"`
}

// BrowseInput is the input of the browse tool.
type BrowseInput struct {
	Sandbox string `json:"sandbox,omitempty" desc:"Name of the sandbox (box) in this session; created on first use." default:"default"`
	Port    int    `json:"port" desc:"TCP port a server listens on inside the box (on 127.0.0.1 or 0.0.0.0)." minimum:"1" maximum:"65535"`
}

// BrowseOutput is the result of the browse tool.
type BrowseOutput struct {
	// URL is http://ID.localhost:PORT/ (browsers and curl resolve
	// *.localhost to the loopback address): the preview's own origin, never
	// the API's; the app sees whole paths.
	URL string `json:"url"`
	// HostURL is the same URL (kept for clients that read it).
	HostURL   string `json:"host_url,omitempty"`
	Port      int    `json:"port"`
	Listening bool   `json:"listening"`
}

// WaitPortInput is the input of the wait_port tool.
type WaitPortInput struct {
	Sandbox   string `json:"sandbox,omitempty" desc:"Name of the sandbox (box) in this session; created on first use." default:"default"`
	Port      int    `json:"port" desc:"TCP port a server listens on inside the box (on 127.0.0.1 or 0.0.0.0)." minimum:"1" maximum:"65535"`
	TimeoutMs int    `json:"timeout_ms,omitempty" desc:"Give up after this many milliseconds (at most 600000)." default:"30000" minimum:"1" maximum:"600000"`
}

// WaitPortOutput is the result of the wait_port tool.
type WaitPortOutput struct {
	Port      int   `json:"port"`
	Listening bool  `json:"listening"`
	WaitedMs  int64 `json:"waited_ms"`
}

// SandboxCreateInput is the input of the sandbox_create tool.
type SandboxCreateInput struct {
	Sandbox             string            `json:"sandbox,omitempty" desc:"Name of the sandbox in this session." default:"default"`
	Image               string            `json:"image,omitempty" desc:"Image: host (the host's /usr read-only: bash, coreutils, python3) or cellbox/NAME built by cellbox image build." default:"host"`
	Env                 map[string]string `json:"env,omitempty" desc:"Environment variables of every command in the box."`
	Limits              *Limits           `json:"limits,omitempty" desc:"Resource limits."`
	Network             *Network          `json:"network,omitempty" desc:"The box's network. Omitted: none (loopback only). true: full network (its own interface, any destination; cannot be narrowed later). An object {allow, inject} (the fields of network_set): egress only to the allow list, through a proxy on the host that the box cannot bypass (HTTP_PROXY/HTTPS_PROXY are set in the box; names are resolved on the host); change it later with network_set."`
	SleepAfterMs        int64             `json:"sleep_after_ms,omitempty" desc:"Stop the box after this many idle milliseconds; its files are kept and the next call wakes it." default:"600000" minimum:"0"`
	BoxID               string            `json:"box_id,omitempty" desc:"Attach to the box with this explicit id, shared by every session that names it. Requires share_across_sessions: true."`
	ShareAcrossSessions bool              `json:"share_across_sessions,omitempty" desc:"Confirm that box_id is meant to be shared across sessions."`
	WorkspaceDir        string            `json:"workspace_dir,omitempty" desc:"Working directory of the box: where commands run and relative file paths resolve; made if missing. /workspace, /tmp or a directory below them (the box's writable disk). Default: the session's, else /workspace."`
	DestroyOnClose      *bool             `json:"destroy_on_close,omitempty" desc:"Destroy the box when the session closes, also when the last MCP session served on it ends (one-shot runs); false keeps it (asleep) for the next connection. Default: the session's setting, else false."`
}

// Network is a box's network: closed (loopback only) when absent, full
// (the JSON true), or an allow list enforced by the host's egress proxy
// (an object). Only the last can change on a running box (network_set).
type Network struct {
	// Full is the JSON true: the box gets its own network interface.
	Full bool `json:"-"`
	NetworkRules
}

// NetworkRules is an allow list with its header rules.
type NetworkRules struct {
	Allow  []string `json:"allow,omitempty" desc:"Destinations the box may reach: a name (example.org), its subdomains (*.example.org), any name (*), an IP or a CIDR (10.1.2.0/24), each optionally with :PORT (example.org:443). A name that resolves to a loopback, private or link-local address is refused unless that address is allowed too (as an IP or CIDR)."`
	Inject []Inject `json:"inject,omitempty" desc:"Headers the host's proxy sets on plain http:// requests to a host (an API key the box never sees), each {host, header, value or secret, tls}: secret names the server's environment variable CELLBOX_SECRET_<secret>; values are never shown again. https:// requests are end-to-end TLS tunnels the proxy does not open, so they get no header: for an HTTPS API set tls: true and call it with http:// URLs."`
}

// Inject is a header the egress proxy sets on requests to Host. Value (or
// the server's secret named by Secret) never enters the box and is never
// returned by a tool.
type Inject struct {
	Host   string `json:"host" desc:"Host the header goes to: a name (api.example.org), *.example.org, or an IP, without a port: the header goes on requests to every port of it that the allow list lets through. It must also be allowed."`
	Header string `json:"header" desc:"Header name, e.g. Authorization or X-Api-Key; it replaces one the box sends."`
	Value  string `json:"value,omitempty" desc:"The header's value (stored on the server, never shown again). Give value or secret."`
	Secret string `json:"secret,omitempty" desc:"Name of a secret the server holds: the value of its environment variable CELLBOX_SECRET_<secret>, read at each request. Give value or secret."`
	TLS    bool   `json:"tls,omitempty" desc:"Upgrade to HTTPS: the box calls http://HOST/..., the proxy adds the header and sends the request to https://HOST/... (port 443 unless the URL names one), checking the certificate. Use this for HTTPS APIs: the key never enters the box and is encrypted on the wire."`
}

// Redacted is what a tool returns in place of an injected header's value.
const Redacted = "[redacted]"

// Redact returns rules whose header values are replaced by Redacted.
func (r NetworkRules) Redact() NetworkRules {
	out := NetworkRules{Allow: r.Allow}
	for _, in := range r.Inject {
		if in.Value != "" {
			in.Value = Redacted
		}
		out.Inject = append(out.Inject, in)
	}
	return out
}

// JSONSchemaAnyOf says the JSON of a Network is a boolean or an object.
func (Network) JSONSchemaAnyOf() []any { return []any{false, NetworkRules{}} }

// MarshalJSON writes true for a full network, else the rules' object.
func (n Network) MarshalJSON() ([]byte, error) {
	if n.Full {
		return []byte("true"), nil
	}
	return json.Marshal(n.NetworkRules)
}

// UnmarshalJSON reads true (full), false or null (closed), or an object.
func (n *Network) UnmarshalJSON(b []byte) error {
	switch string(bytes.TrimSpace(b)) {
	case "true":
		*n = Network{Full: true}
		return nil
	case "false", "null":
		*n = Network{}
		return nil
	}
	if t := bytes.TrimSpace(b); len(t) > 0 && t[0] != '{' {
		return fmt.Errorf("network: want true, false, or an object {\"allow\": [...], \"inject\": [...]}; got %s", t)
	}
	var r NetworkRules
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return fmt.Errorf("network: want true, or an object {\"allow\": [...], \"inject\": [...]}: %w", err)
	}
	*n = Network{NetworkRules: r}
	return nil
}

// NetworkSetInput is the input of the network_set tool.
type NetworkSetInput struct {
	Sandbox string `json:"sandbox,omitempty" desc:"Name of the sandbox (box) in this session; created on first use." default:"default"`
	NetworkRules
}

// NetworkInfo is a box's network as tools show it: header values redacted.
type NetworkInfo struct {
	// Mode is "none" (loopback only), "full", or "allow" (the list,
	// through the host's proxy; an empty list reaches nothing).
	Mode string `json:"mode"`
	NetworkRules
}

// NetworkSetOutput is the result of the network_set tool.
type NetworkSetOutput struct {
	Sandbox string      `json:"sandbox"`
	Network NetworkInfo `json:"network"`
}

// SandboxCreateOutput is the result of the sandbox_create tool.
type SandboxCreateOutput struct {
	Sandbox string `json:"sandbox"`
	Created bool   `json:"created"`
	ID      string `json:"id"`
}

// SandboxListInput is the input of the sandbox_list tool.
type SandboxListInput struct{}

// SandboxInfo describes one box of a session.
type SandboxInfo struct {
	Name    string      `json:"name"`
	ID      string      `json:"id"`
	Image   string      `json:"image"`
	Status  string      `json:"status"` // running|sleeping
	Shared  bool        `json:"shared,omitempty"`
	Network NetworkInfo `json:"network"`
	// WorkspaceDir is the box's working directory.
	WorkspaceDir   string    `json:"workspace_dir"`
	DestroyOnClose bool      `json:"destroy_on_close,omitempty"`
	Created        time.Time `json:"created"`
	LastUsed       time.Time `json:"last_used"`
}

// SandboxListOutput is the result of the sandbox_list tool.
type SandboxListOutput struct {
	Sandboxes []SandboxInfo `json:"sandboxes"`
}

// SandboxDestroyInput is the input of the sandbox_destroy tool.
type SandboxDestroyInput struct {
	Sandbox string `json:"sandbox" desc:"Name of the sandbox to destroy (its files are deleted)."`
}

// SnapshotInput is the input of the snapshot tool.
type SnapshotInput struct {
	Sandbox string `json:"sandbox,omitempty" desc:"Name of the sandbox whose workspace to snapshot." default:"default"`
	Label   string `json:"label,omitempty" desc:"A label to recognize the snapshot by (e.g. 'tests pass'), at most 256 bytes."`
}

// SnapshotInfo describes one snapshot (the result of snapshot, an entry of
// snapshot_list).
type SnapshotInfo struct {
	ID         string    `json:"id"`
	Label      string    `json:"label,omitempty"`
	Sandbox    string    `json:"sandbox"` // the box it was taken of
	Created    time.Time `json:"created"`
	Size       int64     `json:"size"`        // bytes of its files, as ls shows them (apparent size: holes of sparse files included)
	DataBytes  int64     `json:"data_bytes"`  // bytes of its files' data: holes of sparse files not counted, nor stored
	Files      int       `json:"files"`       // regular files (not directories, links or FIFOs)
	AddedBytes int64     `json:"added_bytes"` // bytes it added to the store (its data, less what earlier snapshots of the session shared)
}

// SnapshotListInput is the input of the snapshot_list tool.
type SnapshotListInput struct{}

// SnapshotListOutput is the result of the snapshot_list tool.
type SnapshotListOutput struct {
	Snapshots []SnapshotInfo `json:"snapshots"`
	// StoreBytes is the size of the (deduplicated) content of the
	// session's snapshots.
	StoreBytes int64 `json:"store_bytes"`
}

// SnapshotDeleteInput is the input of the snapshot_delete tool.
type SnapshotDeleteInput struct {
	Snapshot string `json:"snapshot" desc:"Id of the snapshot to delete (see snapshot_list)."`
}

// SnapshotDeleteOutput is the result of the snapshot_delete tool.
type SnapshotDeleteOutput struct {
	OK         bool  `json:"ok"`
	FreedBytes int64 `json:"freed_bytes"` // content no other snapshot shared
}

// RestoreInput is the input of the restore tool.
type RestoreInput struct {
	Sandbox  string `json:"sandbox,omitempty" desc:"Name of the sandbox whose workspace is replaced." default:"default"`
	Snapshot string `json:"snapshot" desc:"Id of the snapshot to restore (see snapshot_list)."`
}

// SeedOutput is the result of restore and branch: the box and what was
// put in its workspace.
type SeedOutput struct {
	Sandbox string `json:"sandbox"`
	ID      string `json:"id"` // the box's id
	Files   int    `json:"files"`
	Bytes   int64  `json:"bytes"`
}

// BranchInput is the input of the branch tool.
type BranchInput struct {
	Snapshot string `json:"snapshot" desc:"Id of the snapshot to start from (see snapshot_list)."`
	Name     string `json:"name" desc:"Name of the NEW sandbox (must not exist in this session)."`
}

// ForkInput is the input of the fork tool.
type ForkInput struct {
	Sandbox string   `json:"sandbox,omitempty" desc:"Name of the running sandbox to fork." default:"default"`
	Count   int      `json:"count" desc:"Number of new sandboxes (1 to 16, within the session's sandbox cap)." minimum:"1" maximum:"16"`
	Names   []string `json:"names,omitempty" desc:"Names of the new sandboxes (count of them); default SANDBOX-1, SANDBOX-2, ... (the first free ones)."`
}

// ForkOutput is the result of the fork tool.
type ForkOutput struct {
	Sandboxes []string `json:"sandboxes"`       // the new boxes' names
	Files     int      `json:"files,omitempty"` // files copied (tar)
	Bytes     int64    `json:"bytes,omitempty"` // bytes copied (tar)
	// Method is how the workspace was copied: "clone" (the backend copied
	// the box's disk, copy-on-write where the filesystem allows) or "tar"
	// (the files through the sandboxes' agents).
	Method string `json:"method"`
}

// OKOutput is a result that only says it worked.
type OKOutput struct {
	OK bool `json:"ok"`
}

// ExecRequest is the body of the streaming exec endpoint
// (POST /v1/sessions/{id}/boxes/{box}/exec).
type ExecRequest struct {
	Command   string            `json:"command,omitempty"`
	Argv      []string          `json:"argv,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Stdin     []byte            `json:"stdin,omitempty"`
	TimeoutMs int               `json:"timeout_ms,omitempty"` // 0: no timeout
	MaxOutput int               `json:"max_output,omitempty"` // bytes kept per stream in the result (default 1 MiB)
	// Follow streams all the output however much there is (for as long
	// as a server runs) and keeps none in the result.
	Follow bool `json:"follow,omitempty"`
}

// ExecResult is the final outcome of a streaming exec.
type ExecResult struct {
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	ExitCode   int    `json:"exit_code"`
	Truncated  bool   `json:"truncated,omitempty"`
	TimedOut   bool   `json:"timed_out,omitempty"`
	ProcessID  string `json:"process_id,omitempty"`
	DurationMs int64  `json:"duration_ms"`
	// Notices say what the box's agent did around the command: processes
	// it left running that were ended, a box out of processes or memory.
	Notices []string `json:"notices,omitempty"`
}

// ExecFrame is one NDJSON line of the streaming exec endpoint: an output
// chunk (Stream and Data), then exactly one final frame with Result or Error.
type ExecFrame struct {
	Stream string      `json:"stream,omitempty"` // stdout|stderr
	Data   []byte      `json:"data,omitempty"`
	Result *ExecResult `json:"result,omitempty"`
	Error  string      `json:"error,omitempty"`
	Code   string      `json:"code,omitempty"` // with Error: one of the Code constants
	Notice string      `json:"notice,omitempty"`
}

// WatchEvent is one file change in a box (the watch endpoint sends
// batches of them as server-sent events of type "changes").
type WatchEvent struct {
	Path string    `json:"path"`
	Op   string    `json:"op"` // create|write|remove|rename
	Time time.Time `json:"time"`
}

// UploadResult is the answer of PUT .../files/{path}.
type UploadResult struct {
	Path  string `json:"path"`
	Bytes int64  `json:"bytes"`
}

// RunCodeInput is the input of the run_code tool.
type RunCodeInput struct {
	Sandbox   string `json:"sandbox,omitempty" desc:"Name of the sandbox (box) in this session; created on first use." default:"default"`
	Language  string `json:"language,omitempty" desc:"python (python3), javascript (node) or bash. Needed without context; with a context it may be left out (it must match the context's)." enum:"python,javascript,bash"`
	Code      string `json:"code" desc:"The code (a cell). The value of its last expression comes back as value (Python repr, node util.inspect); matplotlib figures as PNG outputs."`
	Context   string `json:"context,omitempty" desc:"Id of a code context (from code_context_create) to run in: variables, imports and definitions of earlier calls in it are there. Without it the code runs in a fresh interpreter that ends with the call."`
	TimeoutMs int    `json:"timeout_ms,omitempty" desc:"Interrupt the code after this many milliseconds (KeyboardInterrupt in Python, TimeoutError in node, status 130 in bash). In node, a loop that runs after an await or in a timer callback cannot be interrupted: the context ends; a context keeps its state." default:"30000" minimum:"1"`
}

// CodeOutput is one rich output of run_code: an image, SVG, HTML, JSON, ...
type CodeOutput struct {
	MIME     string `json:"mime"`               // image/png, image/svg+xml, text/html, application/json, ...
	Data     string `json:"data"`               // the content: text, or base64 when Encoding says so
	Encoding string `json:"encoding,omitempty"` // "base64" for binary data (PNG, JPEG); absent for text
}

// CodeException is an exception (error) the code raised.
type CodeException struct {
	Name      string `json:"name"`                // ZeroDivisionError, TypeError, KeyboardInterrupt, ...
	Message   string `json:"message"`             //
	Traceback string `json:"traceback,omitempty"` // Python traceback / JavaScript stack, the cell's frames only
}

// RunCodeOutput is the result of the run_code tool.
type RunCodeOutput struct {
	Stdout     string         `json:"stdout"`
	Stderr     string         `json:"stderr"`
	Value      *string        `json:"value,omitempty"`     // the last expression's repr; absent when there is none (or it is None/undefined)
	Outputs    []CodeOutput   `json:"outputs,omitempty"`   // rich outputs: plots (PNG), display(...) calls, _repr_html_ ...
	Exception  *CodeException `json:"exception,omitempty"` // the code raised (or, in bash, see exit_code)
	ExitCode   *int           `json:"exit_code,omitempty"` // bash: status of the last command
	Truncated  bool           `json:"truncated"`           // stdout, stderr or value was cut at 64 KiB
	TimedOut   bool           `json:"timed_out,omitempty"` // interrupted after timeout_ms
	Context    string         `json:"context,omitempty"`   // the context it ran in (absent for a stateless run)
	DurationMs int64          `json:"duration_ms"`
	Hint       string         `json:"hint,omitempty"`
}

// CodeContextCreateInput is the input of the code_context_create tool.
type CodeContextCreateInput struct {
	Sandbox    string            `json:"sandbox,omitempty" desc:"Name of the sandbox (box) in this session; created on first use." default:"default"`
	Language   string            `json:"language" desc:"python (python3), javascript (node) or bash." enum:"python,javascript,bash"`
	WorkingDir string            `json:"working_dir,omitempty" desc:"Directory the interpreter starts in." default:"/workspace"`
	Env        map[string]string `json:"env,omitempty" desc:"Extra environment variables of the interpreter."`
}

// CodeContext describes a code context.
type CodeContext struct {
	ID       string    `json:"id"`
	Language string    `json:"language"`
	PID      int       `json:"pid"`
	Created  time.Time `json:"created"`
	Cells    int       `json:"cells"` // calls of run_code so far
	Busy     bool      `json:"busy"`  // a call is running
}

// CodeContextCreateOutput is the result of the code_context_create tool.
type CodeContextCreateOutput struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Hint     string `json:"hint"`
}

// CodeContextListInput is the input of the code_context_list tool.
type CodeContextListInput struct {
	Sandbox string `json:"sandbox,omitempty" desc:"Name of the sandbox (box) in this session; created on first use." default:"default"`
}

// CodeContextListOutput is the result of the code_context_list tool.
type CodeContextListOutput struct {
	Contexts []CodeContext `json:"contexts"`
}

// CodeContextDeleteInput is the input of the code_context_delete tool.
type CodeContextDeleteInput struct {
	Sandbox string `json:"sandbox,omitempty" desc:"Name of the sandbox (box) in this session; created on first use." default:"default"`
	ID      string `json:"id" desc:"Id of the context (from code_context_create or code_context_list)."`
}
