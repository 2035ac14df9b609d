package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/mcpserver"
	"github.com/cellbox/cellbox/sandboxclient"
)

func init() {
	register(command{
		name:  "mcp",
		usage: "[--server URL [--session ID --token T] | --data DIR --backend auto|docker|local] [--profile NAME]  serve the sandbox tools to an MCP client over stdio (in-process boxes, or a running cellbox serve)",
		run:   runMCP,
	})
}

// runMCP serves MCP on stdin/stdout; logs go to stderr only.
func runMCP(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("mcp", flag.ContinueOnError)
	cf := addClientFlags(fs, true)
	data := fs.String("data", defaultDataDir(), "data directory of the in-process boxes (with --server: of the server, where its key DATA/"+keyFile+" is, unless "+keyEnv+" is set)")
	backendName := fs.String("backend", "auto", "box backend without --server: docker, local (bubblewrap), or auto")
	agentBinary := fs.String("agent-binary", "", "static cellbox binary run as the agent in every box (default: this executable)")
	pool := fs.Int("pool", 1, "pre-started boxes kept for the default image (0: none)")
	profile := fs.String("profile", "", "tool set to serve: cellbox (default), cloudflare, fs-tools or deerflow")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if _, err := sandbox.LookupProfile(*profile); err != nil {
		return err
	}
	set := flagsGiven(fs)
	if set["server"] || os.Getenv("CELLBOX_SERVER") != "" {
		for _, local := range []string{"backend", "agent-binary", "pool"} {
			if set[local] {
				return fmt.Errorf("--%s is for in-process boxes; with --server (or CELLBOX_SERVER) the server's own are used", local)
			}
		}
		return mcpRemote(ctx, *cf.server, *cf.session, *cf.token, clientKey(*data), *profile)
	}
	if set["session"] || set["token"] {
		return errors.New("--session and --token need --server URL (or CELLBOX_SERVER)")
	}
	return mcpLocal(ctx, *data, *backendName, *agentBinary, *pool, *profile)
}

// mcpSessionFile (DATA/mcp.session) holds the id of the session cellbox mcp
// serves, while it runs.
const mcpSessionFile = "mcp.session"

// mcpLocal serves the tools of an in-process sandbox service, in one session
// that lives as long as the process (or, after a kill, until the next one
// over the data dir ends).
func mcpLocal(ctx context.Context, data, backendName, agentBinary string, pool int, profile string) error {
	dataDir, err := filepath.Abs(data)
	if err != nil {
		return err
	}
	be, err := openBackend(ctx, backendName, dataDir)
	if err != nil {
		return err
	}
	svc, err := sandbox.New(ctx, sandbox.Config{
		Backend:     be,
		DataDir:     dataDir,
		AgentBinary: agentBinary,
		Pool:        map[string]int{backend.DefaultImage: max(pool, 0)},
	})
	if err != nil {
		return fmt.Errorf("%w; to share a running cellbox serve, use cellbox mcp --server URL", err)
	}
	defer svc.Close()
	// The session's id is kept in the data dir while the process runs: a
	// cellbox mcp killed before it could delete its session leaves it to
	// the next one, which takes it over, boxes and files included (it was
	// left behind, unreachable, with its boxes).
	sessFile := filepath.Join(dataDir, mcpSessionFile)
	id := ""
	if b, err := os.ReadFile(sessFile); err == nil {
		if prev := strings.TrimSpace(string(b)); svc.Pin(prev) == nil {
			id = prev
			slog.Info("cellbox mcp: taking over the session of a cellbox mcp that did not end cleanly", "session", id)
		}
	}
	if id == "" {
		if id, _, err = svc.NewSession(ctx); err != nil {
			return err
		}
		if err := os.WriteFile(sessFile, []byte(id+"\n"), 0o600); err != nil {
			return fmt.Errorf("note the MCP session in the data dir: %w", err)
		}
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := svc.DeleteSession(dctx, id); err != nil {
			slog.Error("delete the MCP session", "session", id, "err", err)
		} else {
			os.Remove(sessFile)
		}
		// Other sessions of the data dir (a killed serve's, reattached
		// at start) are not this process's to delete, but nothing is
		// left to put their boxes to sleep once it exits.
		if err := svc.SleepAll(dctx); err != nil {
			slog.Error("put the data dir's other boxes to sleep", "err", err)
		}
	}()
	srv, err := mcpserver.ForSession(svc, id, profile)
	if err != nil {
		return err
	}
	slog.Info("cellbox mcp: serving on stdio", "backend", be.Name(), "data", dataDir, "session", id)
	return serveStdio(ctx, srv)
}

// mcpRemote serves the tools of a running cellbox serve: in session id, or
// in a new one deleted on exit.
func mcpRemote(ctx context.Context, server, id, token, key, profile string) error {
	var c *sandboxclient.HTTP
	switch {
	case id != "" && token == "":
		return errors.New("--session needs --token (or CELLBOX_TOKEN)")
	case id != "":
		c = sandboxclient.New(server, id, token)
	default:
		var err error
		if c, err = sandboxclient.NewSessionWithKey(ctx, server, key); err != nil {
			return fmt.Errorf("%s: %w (is cellbox serve running there?)", server, err)
		}
		id, _ = c.Session()
		defer func() {
			dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := c.DeleteSession(dctx); err != nil {
				slog.Error("delete the MCP session", "server", server, "session", id, "err", err)
			}
		}()
	}
	tools, err := c.ToolsFor(ctx, profile)
	if err != nil {
		return fmt.Errorf("list the tools of %s: %w", server, err)
	}
	slog.Info("cellbox mcp: serving on stdio", "server", server, "session", id, "profile", profile)
	caller := remoteTools{c, profile}
	return serveStdio(ctx, mcpserver.New(profile, tools, func(context.Context, mcp.Request) (mcpserver.ToolCaller, error) { return caller, nil }))
}

// serveStdio serves MCP on stdin/stdout until stdin ends or ctx does.
func serveStdio(ctx context.Context, srv *mcp.Server) error {
	out := &lockedWriter{w: os.Stdout}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(jsonLines(os.Stdin, pw, out)) }()
	err := srv.Run(ctx, &mcp.IOTransport{Reader: pr, Writer: out})
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return nil // interrupted: a normal stop
	}
	if errors.Is(err, mcp.ErrConnectionClosed) || errors.Is(err, io.EOF) {
		return nil // the client closed stdin
	}
	return err
}

// jsonLines copies the lines of in that are JSON-RPC messages to to, and
// answers the others on out with a JSON-RPC error: -32700 for a line that
// is not JSON, -32600 for JSON that is no message (with the line's id when
// it has one). The SDK's stdio transport ends the connection, and with it
// the session and its boxes, at the first such line; MCP's stdio framing
// is one message per line, so a bad line can be answered and skipped.
func jsonLines(in io.Reader, to io.Writer, out io.Writer) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), mcp.DefaultMaxLineLength)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		if answer := badMessage(line); answer != nil {
			if _, err := out.Write(answer); err != nil {
				return err
			}
			continue
		}
		// A copy: line is the scanner's buffer.
		if _, err := to.Write(append(slices.Clip(line), '\n')); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read stdin: %w (at most %d bytes a line)", err, mcp.DefaultMaxLineLength)
	}
	return nil
}

// badMessage returns the error answer to line, or nil when line is a
// JSON-RPC message (or a non-empty batch of them) the SDK can decode.
func badMessage(line []byte) []byte {
	if !json.Valid(line) {
		return rpcError(nil, jsonrpc.CodeParseError, "parse error: a line that is not JSON; send one JSON-RPC message per line")
	}
	msgs := []json.RawMessage{line}
	if line[0] == '[' {
		if json.Unmarshal(line, &msgs) != nil || len(msgs) == 0 {
			return rpcError(nil, jsonrpc.CodeInvalidRequest, "invalid request: a batch is a non-empty array of JSON-RPC messages")
		}
	}
	for _, m := range msgs {
		if _, err := jsonrpc.DecodeMessage(m); err != nil {
			var probe struct {
				ID json.RawMessage `json:"id"`
			}
			_ = json.Unmarshal(m, &probe)
			return rpcError(probe.ID, jsonrpc.CodeInvalidRequest, "invalid request: "+err.Error()+` (want {"jsonrpc": "2.0", "id": …, "method": "…", "params": {…}})`)
		}
	}
	return nil
}

// rpcError is a JSON-RPC error response line; an id that is not a string
// or a number becomes null.
func rpcError(id json.RawMessage, code int64, msg string) []byte {
	var v any
	if json.Unmarshal(id, &v) != nil {
		v = nil
	}
	switch v.(type) {
	case string, float64:
	default:
		id = json.RawMessage("null")
	}
	b, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   jsonrpc.Error   `json:"error"`
	}{"2.0", id, jsonrpc.Error{Code: code, Message: msg}})
	return append(b, '\n')
}

// lockedWriter writes whole messages to w, one at a time: the SDK's answers
// and jsonLines' parse errors share stdout. Close leaves w open.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (l *lockedWriter) Close() error { return nil }

// remoteTools calls the tools of profile on a server, in one of its
// sessions.
type remoteTools struct {
	c       *sandboxclient.HTTP
	profile string
}

func (r remoteTools) CallTool(ctx context.Context, name string, args json.RawMessage) (json.RawMessage, error) {
	res, err := r.c.ToolAs(ctx, r.profile, name, args)
	var te *sandboxclient.ToolError
	if errors.As(err, &te) {
		return res, nil // is_error: true is a result, for the model to read
	}
	return res, err
}
