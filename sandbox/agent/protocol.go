// Package agent is the cellbox agent: the server that runs as PID 1 inside
// every box and answers the pool's requests over a unix socket (exec,
// background processes, files, watch, port tunnels), and the host-side
// Client that talks to it.
//
// The transport is HTTP/1.1 over the unix socket. Every response carries the
// header Cellbox-Agent-Protocol; JSON bodies; streams are NDJSON.
package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"time"
)

// ProtocolVersion is the version of the wire protocol between Client and
// server. A mismatch means the box runs an older cellbox binary: the host
// restarts the box (its workspace kept), so that it runs the host's agent.
//
// 2: process kill_all, code contexts, the egress forwarder.
// 3: sparse files in tar streams (PAXSparseSize, PAXSparseMap).
const ProtocolVersion = 3

// ProtocolHeader is the response header that carries ProtocolVersion.
const ProtocolHeader = "Cellbox-Agent-Protocol"

// Options configure Serve.
type Options struct {
	// Socket is the unix socket path to listen on (a stale socket is
	// removed), or "tcp:HOST:PORT": a TCP address of the box, for a
	// backend that reaches the agent through a port (kubernetes, through
	// the API server's port-forward); then Token is required.
	Socket string
	// Token is the box's secret: on a TCP Socket every connection must
	// open with it (Handshake) before anything else is read, so that
	// nothing that reaches the port without it can drive the agent.
	Token string
	// Workspace is the box's working directory, created if missing.
	// Default /workspace.
	Workspace string
	// AllowedRoots are the directories file operations may touch (after
	// resolving `..` and symlinks). Default {Workspace, "/tmp"}.
	AllowedRoots []string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// EgressListen, if set, is the TCP address in the box (127.0.0.1:3128)
	// whose connections the agent pipes to EgressSocket, the host's egress
	// proxy (see sandbox/egress).
	EgressListen string
	EgressSocket string
	// PidsLimit and MemoryLimit are the box's limits as the backend set
	// them, for messages when the box runs out (0: read them from the
	// box's cgroup files if visible).
	PidsLimit, MemoryLimit int64
}

// Version is what the agent reports about itself.
type Version struct {
	Protocol  int    `json:"protocol"`
	PID       int    `json:"pid"`
	Workspace string `json:"workspace"`
}

// Error codes of *Error.
const (
	CodeNotFound         = "not_found"
	CodeOutsideWorkspace = "outside_workspace"
	CodeIsDir            = "is_dir"
	CodeNotDir           = "not_dir"
	CodeTooLarge         = "too_large"
	CodeInvalid          = "invalid"
	CodeExists           = "exists"
	CodeTimeout          = "timeout"
)

// Error is an error the agent reports about a request (bad path, not found,
// too big, ...). Message is meant for a human or an LLM, e.g.
// `read /workspace/x: no such file`.
type Error struct {
	Op      string `json:"op"`
	Path    string `json:"path,omitempty"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string {
	if e.Message != "" {
		return e.Message
	}
	if e.Path != "" {
		return fmt.Sprintf("%s %s: %s", e.Op, e.Path, e.Code)
	}
	return fmt.Sprintf("%s: %s", e.Op, e.Code)
}

// Is makes errors.Is(err, fs.ErrNotExist) true for not_found (and
// fs.ErrExist for exists).
func (e *Error) Is(target error) bool {
	switch target {
	case fs.ErrNotExist:
		return e.Code == CodeNotFound
	case fs.ErrExist:
		return e.Code == CodeExists
	}
	return false
}

// IsCode reports whether err is an *Error with the given code.
func IsCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// ExecRequest is a command to run in the box.
type ExecRequest struct {
	Command   string            `json:"command,omitempty"`    // run with bash -c if /bin/bash exists, else /bin/sh -c
	Argv      []string          `json:"argv,omitempty"`       // or exactly this argv
	Cwd       string            `json:"cwd,omitempty"`        // default workspace
	Env       map[string]string `json:"env,omitempty"`        // added to the box env
	Stdin     []byte            `json:"stdin,omitempty"`      //
	TimeoutMs int               `json:"timeout_ms,omitempty"` // 0 = none; on timeout the whole process group is killed
	MaxOutput int               `json:"max_output,omitempty"` // bytes kept per stream (default 1 MiB); the rest is drained and dropped
	// Follow, on a streamed exec, streams all the output however much
	// there is and keeps none (a server's output, for as long as it runs).
	Follow bool `json:"follow,omitempty"`
	// KeepLeftovers lets the processes an exec leaves running (`cmd &`)
	// outlive it, as in a shell of one's own; by default they are ended
	// when it returns. For tools that have no background mode.
	KeepLeftovers bool `json:"keep_leftovers,omitempty"`
}

// DefaultMaxOutput is ExecRequest.MaxOutput's default.
const DefaultMaxOutput = 1 << 20

// ExecResult is the outcome of Exec.
type ExecResult struct {
	Stdout     string `json:"stdout"` // UTF-8 (invalid bytes replaced)
	Stderr     string `json:"stderr"`
	ExitCode   int    `json:"exit_code"` // -1 if killed by a signal or the timeout
	Truncated  bool   `json:"truncated,omitempty"`
	TimedOut   bool   `json:"timed_out,omitempty"`
	ProcessID  string `json:"process_id"`
	DurationMs int64  `json:"duration_ms"`
	// Notices say what the agent did around the command: processes it
	// left running that were ended, a box out of processes or memory.
	Notices []string `json:"notices,omitempty"`
}

// Process is an entry of the agent's process table.
type Process struct {
	ID       string     `json:"id"`
	Command  string     `json:"command"`
	PID      int        `json:"pid"`
	Running  bool       `json:"running"`
	ExitCode *int       `json:"exit_code,omitempty"`
	Started  time.Time  `json:"started"`
	Ended    *time.Time `json:"ended,omitempty"`
}

// FileInfo describes one file.
type FileInfo struct {
	Path    string    `json:"path"`
	Type    string    `json:"type"` // file|dir|symlink|other
	Size    int64     `json:"size"`
	Mode    uint32    `json:"mode"` // permission bits
	ModTime time.Time `json:"mod_time"`
	// Real is Path with every symlink resolved, the last one too (stat
	// only): where a write through Path lands.
	Real string `json:"real,omitempty"`
}

// ReadRequest selects a window of a file: lines (Offset, Limit) or, when
// ByteLimit > 0, a raw byte range.
type ReadRequest struct {
	Path       string `json:"path"`
	Offset     int    `json:"offset,omitempty"`      // 1-indexed first line; 0 = 1. Of a binary file (base64), the 1-indexed first byte
	Limit      int    `json:"limit,omitempty"`       // lines; 0 = MaxLines
	ByteOffset int64  `json:"byte_offset,omitempty"` //
	ByteLimit  int64  `json:"byte_limit,omitempty"`  // raw byte range mode when > 0
	MaxLines   int    `json:"max_lines,omitempty"`   // default 2000
	MaxBytes   int    `json:"max_bytes,omitempty"`   // default 256 KiB
}

// Read defaults and caps.
const (
	DefaultReadLines   = 2000
	DefaultReadBytes   = 256 << 10
	MaxReadLineChars   = 2000 // longer lines are cut and marked with LineCutMarker
	LineCutMarker      = "… [line truncated]"
	DefaultWriteBytes  = 2 << 20
	DefaultGrepHits    = 200
	DefaultGrepLineLen = 1024
	DefaultLogBuffer   = 1 << 20
)

// ReadResult is a window of a file.
type ReadResult struct {
	Content    string `json:"content"`
	Encoding   string `json:"encoding"` // "utf-8" | "base64" (binary: NUL byte or invalid UTF-8)
	Size       int64  `json:"size"`
	TotalLines int    `json:"total_lines"`
	StartLine  int    `json:"start_line"`
	EndLine    int    `json:"end_line"`
	NextOffset int    `json:"next_offset,omitempty"` // the Offset to read on from (of a binary file, a byte); 0 = no more
	Truncated  bool   `json:"truncated,omitempty"`
}

// WriteRequest writes (or appends to) a file.
type WriteRequest struct {
	Path     string `json:"path"`
	Data     []byte `json:"data"`
	Append   bool   `json:"append,omitempty"`
	MaxBytes int64  `json:"max_bytes,omitempty"` // default 2 MiB
	Mode     uint32 `json:"mode,omitempty"`      // for new files, default 0644
}

// WriteResult reports a write.
type WriteResult struct {
	Path    string `json:"path"`
	Size    int64  `json:"size"`
	Created bool   `json:"created"`
}

// TreeEntry is one node of a directory tree.
type TreeEntry struct {
	Path     string      `json:"path"`
	Type     string      `json:"type"`
	Size     int64       `json:"size"`
	Children []TreeEntry `json:"children,omitempty"`
}

// GrepRequest searches files under Path.
type GrepRequest struct {
	Pattern      string `json:"pattern"`
	Path         string `json:"path,omitempty"`
	Regex        bool   `json:"regex,omitempty"`
	IgnoreCase   bool   `json:"ignore_case,omitempty"`
	Glob         string `json:"glob,omitempty"`           // filter on the path relative to Path (or the base name)
	MaxHits      int    `json:"max_hits,omitempty"`       // default 200
	MaxLineBytes int    `json:"max_line_bytes,omitempty"` // default 1024
}

// GrepHit is one matching line.
type GrepHit struct {
	Path string `json:"path"`
	Line int    `json:"line"`
	Text string `json:"text"`
}

// GrepResult is the outcome of Grep.
type GrepResult struct {
	Hits          []GrepHit `json:"hits"`
	Truncated     bool      `json:"truncated,omitempty"`
	FilesSearched int       `json:"files_searched"`
	// Skipped names what could not be searched, with why (at most
	// MaxSkipped): a search that missed it must not look complete.
	Skipped []string `json:"skipped,omitempty"`
}

// MaxSkipped bounds GrepResult.Skipped.
const MaxSkipped = 20

// Event is a file system change seen by Watch.
type Event struct {
	Path string    `json:"path"`
	Op   string    `json:"op"` // create|write|remove|rename
	Time time.Time `json:"time"`
}

// ProtocolError is returned (wrapped) by every Client call when the agent
// speaks another protocol version than ProtocolVersion: the box runs another
// cellbox binary and must be restarted (to run this host's agent).
type ProtocolError struct {
	Got int // 0 when the agent sent no (or a bad) protocol header
}

func (e *ProtocolError) Error() string {
	if e.Got == 0 {
		return fmt.Sprintf("agent sent no valid %s header: not a cellbox agent or too old (host expects protocol %d): restart the box to run this host's agent", ProtocolHeader, ProtocolVersion)
	}
	return fmt.Sprintf("agent speaks protocol %d, host expects %d: restart the box to run this host's agent", e.Got, ProtocolVersion)
}
