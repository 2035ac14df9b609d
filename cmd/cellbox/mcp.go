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
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/mcpserver"
	"github.com/cellbox/cellbox/sandboxclient"
	"github.com/cellbox/cellbox/server"
)

func init() {
	register(command{
		name:  "mcp",
		usage: "[--server URL [--session ID --token T] | --data DIR --backend auto|docker|docker-remote|kubernetes|local] [--profile NAME]  serve the sandbox tools to an MCP client over stdio (in-process boxes, or a running cellbox serve)",
		run:   runMCP,
	})
}

// runMCP serves MCP on stdin/stdout; logs go to stderr only.
func runMCP(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("mcp", flag.ContinueOnError)
	cf := addClientFlags(fs, true)
	data := fs.String("data", server.DefaultDataDir(), "data directory of the in-process boxes (with --server: of the server, where its key DATA/"+server.KeyFile+" is, unless "+server.KeyEnv+" is set)")
	backendName := addBackendFlag(fs, "box backend `name` (without --server): docker, docker-remote (DOCKER_HOST on another machine), kubernetes (KUBECONFIG; docs/kubernetes.md), local (bubblewrap), or auto")
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
		return mcpRemote(ctx, *cf.server, *cf.session, *cf.token, server.ClientKey(*data), *profile)
	}
	if set["session"] || set["token"] {
		return errors.New("--session and --token need --server URL (or CELLBOX_SERVER)")
	}
	if err := needCluster(*backendName, false); err != nil {
		return err
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
	be, err := server.OpenBackend(ctx, backendName, dataDir, agentBinary)
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
	// The session goes only when the client ends it (stdin ends) or the
	// user stops the process (SIGINT, SIGTERM). An exit on an error (stdin
	// could not be read, stdout not written) leaves it and its boxes, asleep,
	// to the next cellbox mcp over the data dir, as a kill does: the client
	// did not say it was done with them.
	clean := false
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if !clean {
			slog.Warn("cellbox mcp: ended by an error: the session and its boxes are kept; the next cellbox mcp over the data dir takes them over",
				"session", id, "data", dataDir)
		} else if err := svc.DeleteSession(dctx, id); err != nil {
			slog.Error("delete the MCP session", "session", id, "err", err)
		} else {
			os.Remove(sessFile)
		}
		// The boxes left (this session's when kept; other sessions' of
		// the data dir, a killed serve's reattached at start, which are
		// not this process's to delete) go to sleep: nothing is left to
		// do it once it exits.
		if err := svc.SleepAll(dctx); err != nil {
			slog.Error("put the data dir's boxes to sleep", "err", err)
		}
	}()
	srv, err := mcpserver.ForSession(svc, id, profile)
	if err != nil {
		return err
	}
	slog.Info("cellbox mcp: serving on stdio", "backend", be.Name(), "data", dataDir, "session", id)
	err = serveStdio(ctx, srv)
	clean = err == nil
	return err
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

// serveStdio serves MCP on stdin/stdout until stdin ends or ctx does. Nil
// is a clean end; an error (stdin could not be read, stdout not written)
// is not.
func serveStdio(ctx context.Context, srv *mcp.Server) error {
	track := newInflight()
	out := &lockedWriter{w: os.Stdout, wrote: track.written}
	pr, pw := io.Pipe()
	go func() {
		err := jsonLines(os.Stdin, pw, out, maxLine, track)
		if err == nil {
			// The end of stdin: answer what was asked before it (MCP's
			// stdio shutdown closes stdin first); the SDK would end the
			// connection at once, cancelling the calls in flight.
			track.wait(ctx)
		}
		pw.CloseWithError(err)
	}()
	// jsonLines passes on only whole, valid lines of at most maxLine
	// bytes: the SDK's own cap (which ends the connection) is off.
	err := srv.Run(ctx, &mcp.IOTransport{Reader: pr, Writer: out, MaxLineLength: -1})
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return nil // interrupted: a normal stop
	}
	if errors.Is(err, mcp.ErrConnectionClosed) || errors.Is(err, io.EOF) {
		return nil // the client closed stdin
	}
	return err
}

// maxLine is the longest message line cellbox mcp reads (the SDK's
// default).
const maxLine = mcp.DefaultMaxLineLength

// jsonLines copies the lines of in that are JSON-RPC messages to to, and
// answers the others on out with a JSON-RPC error: -32700 for a line that
// is not JSON, -32600 for JSON that is no message (with the line's id when
// it has one), for a batch where the protocol has none, and for a line
// longer than limit bytes, which is read to its end without being kept.
// The SDK's stdio transport ends the connection, and with it the session
// and its boxes, at the first such line; MCP's stdio framing is one
// message per line, so a bad line can be answered and skipped. It returns
// nil at the end of in, else the read or write error. The requests it
// passes on are noted in track (nil: none).
func jsonLines(in io.Reader, to io.Writer, out io.Writer, limit int, track *inflight) error {
	r := bufio.NewReaderSize(in, 64<<10)
	check := lineChecker{track: track}
	for {
		line, long, rerr := readLine(r, limit)
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			return fmt.Errorf("read stdin: %w", rerr)
		}
		line = bytes.TrimSpace(line)
		var answer []byte
		switch {
		case long != nil:
			answer = rpcError(long.id(), jsonrpc.CodeInvalidRequest, fmt.Sprintf(
				"message too long: a line of %d bytes, over the limit of %d bytes (%d MiB) a message; it was skipped. "+
					"Send less in one call: write_file takes at most %d MiB, so write a big file in parts (append: true), "+
					"or upload it over the HTTP API of cellbox serve (PUT /v1/sessions/{id}/boxes/{box}/files/{path}, no size limit)",
				long.n, limit, limit>>20, sandbox.MaxFileBytes>>20))
		case len(line) > 0:
			answer = check.badMessage(line)
			if answer == nil {
				if _, err := to.Write(append(line, '\n')); err != nil {
					return err
				}
			}
		}
		if answer != nil {
			if _, err := out.Write(answer); err != nil {
				return err
			}
		}
		if rerr != nil {
			return nil // io.EOF
		}
	}
}

// readLine reads a line of r, without its newline, into memory of its
// own. A line longer than limit is read to its end but not kept: long
// describes it, line is nil. At the end of r the error is io.EOF, with
// the last line if it had no newline.
func readLine(r *bufio.Reader, limit int) (line []byte, long *longLine, err error) {
	for {
		chunk, err := r.ReadSlice('\n')
		end := err == nil
		if end {
			chunk = chunk[:len(chunk)-1]
		}
		switch {
		case long != nil:
			long.add(chunk)
		case len(line)+len(chunk) > limit:
			long = &longLine{}
			long.add(line)
			long.add(chunk)
			line = nil
		default:
			line = append(line, chunk...)
		}
		if end {
			return line, long, nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return line, long, err
		}
	}
}

// idProbe is how many bytes of a line too long to read are kept at each
// end, to find its id.
const idProbe = 4 << 10

// longLine is a line too long to read: its size, and its first and last
// idProbe bytes.
type longLine struct {
	n          int64
	head, tail []byte
}

func (l *longLine) add(b []byte) {
	l.n += int64(len(b))
	if len(l.head) < idProbe {
		l.head = append(l.head, b[:min(len(b), idProbe-len(l.head))]...)
	}
	l.tail = append(l.tail, b[max(0, len(b)-idProbe):]...)
	if over := len(l.tail) - idProbe; over > 0 {
		l.tail = l.tail[:copy(l.tail, l.tail[over:])]
	}
}

// tailID matches a message's id as its last member: `,"id":5}`.
var tailID = regexp.MustCompile(`[{,]\s*"id"\s*:\s*(-?[0-9]+|"[^"\\]*")\s*}\s*$`)

// id returns the id of a message too long to read, so that its answer
// reaches the call that waits for it: clients write the id first
// ({"jsonrpc":"2.0","id":5,…}: the Go and Python SDKs) or last
// ({"method":…,"jsonrpc":"2.0","id":5}: the TypeScript SDK). Nil when
// neither end tells.
func (l *longLine) id() json.RawMessage {
	dec := json.NewDecoder(bytes.NewReader(l.head))
	if t, err := dec.Token(); err == nil && t == json.Delim('{') {
		for dec.More() {
			key, err := dec.Token()
			var v json.RawMessage
			if err != nil || dec.Decode(&v) != nil {
				break // the head ends inside a member
			}
			if key == "id" {
				return v
			}
		}
	}
	if m := tailID.FindSubmatch(l.tail); m != nil {
		return m[1]
	}
	return nil
}

// lineChecker finds the lines the SDK would end the connection at.
type lineChecker struct {
	// batches: the client's initialize asked for a protocol version with
	// JSON-RPC batches (those before 2025-06-18); in the later ones the
	// SDK ends the connection at a batch. Only the first initialize
	// counts: the SDK refuses the others.
	batches, initialized bool
	// track, if set, notes the requests of the lines passed on.
	track *inflight
}

// badMessage returns the error answer to line, or nil when line is a
// JSON-RPC message (or a batch of them, where the protocol has batches)
// the SDK takes.
func (c *lineChecker) badMessage(line []byte) []byte {
	if !json.Valid(line) {
		return rpcError(nil, jsonrpc.CodeParseError, "parse error: a line that is not JSON; send one JSON-RPC message per line")
	}
	raws := []json.RawMessage{line}
	batch := line[0] == '['
	if batch {
		// Into a new slice: decoding into raws would write the first
		// element over line itself (RawMessage reuses its array).
		raws = nil
		if json.Unmarshal(line, &raws) != nil || len(raws) == 0 {
			return rpcError(nil, jsonrpc.CodeInvalidRequest, "invalid request: a batch is a non-empty array of JSON-RPC messages")
		}
		if !c.batches {
			return rpcError(nil, jsonrpc.CodeInvalidRequest, "invalid request: a batch, which the protocol version in use does not have (MCP dropped batches in 2025-06-18); send one JSON-RPC message per line")
		}
	}
	ids := map[any]bool{}
	var req *jsonrpc.Request
	msgs := make([]jsonrpc.Message, 0, len(raws))
	for _, raw := range raws {
		msg, err := jsonrpc.DecodeMessage(raw)
		if err != nil {
			return rpcError(probeID(raw), jsonrpc.CodeInvalidRequest, "invalid request: "+err.Error()+` (want {"jsonrpc": "2.0", "id": …, "method": "…", "params": {…}})`)
		}
		if resp, ok := msg.(*jsonrpc.Response); ok && resp.Result == nil && resp.Error == nil {
			// A response carries result or error; the SDK would drop
			// this one without a word.
			return rpcError(probeID(raw), jsonrpc.CodeInvalidRequest, `invalid request: a message with an id but no method, result or error (want {"jsonrpc": "2.0", "id": …, "method": "…", "params": {…}})`)
		}
		msgs = append(msgs, msg)
		req, _ = msg.(*jsonrpc.Request)
		if req != nil && req.ID.IsValid() {
			if ids[req.ID.Raw()] {
				return rpcError(nil, jsonrpc.CodeInvalidRequest, fmt.Sprintf("invalid request: a batch with two requests of id %v; give each its own", req.ID.Raw()))
			}
			ids[req.ID.Raw()] = true
		}
	}
	if !batch && req != nil && req.Method == "initialize" && !c.initialized {
		var p struct {
			ProtocolVersion string `json:"protocolVersion"`
		}
		_ = json.Unmarshal(req.Params, &p)
		c.batches = p.ProtocolVersion == "2024-11-05" || p.ProtocolVersion == "2025-03-26"
		c.initialized = true
	}
	if c.track != nil {
		c.track.passed(msgs)
	}
	return nil
}

// probeID is the id of a message, raw, as far as it can be read.
func probeID(raw []byte) json.RawMessage {
	var probe struct {
		ID json.RawMessage `json:"id"`
	}
	_ = json.Unmarshal(raw, &probe)
	return probe.ID
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
	// wrote, if set, sees each message line written (the SDK writes one
	// line per Write).
	wrote func(line []byte)
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, err := l.w.Write(p)
	if l.wrote != nil {
		l.wrote(p)
	}
	return n, err
}

func (l *lockedWriter) Close() error { return nil }

// inflight is the set of the client's requests passed to the SDK and not
// answered yet, by id (jsonrpc.ID.Raw), so that cellbox mcp answers them
// before it exits at the end of stdin.
type inflight struct {
	mu      sync.Mutex
	ids     map[any]bool
	changed chan struct{} // a token after each answer
}

func newInflight() *inflight {
	return &inflight{ids: map[any]bool{}, changed: make(chan struct{}, 1)}
}

// passed notes the messages of a line passed to the SDK (lineChecker
// decoded them): its requests are in flight; a notifications/cancelled
// takes its request out (a cancelled request is answered with nothing).
func (f *inflight) passed(msgs []jsonrpc.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, msg := range msgs {
		req, ok := msg.(*jsonrpc.Request)
		switch {
		case !ok:
		case req.Method == "notifications/cancelled":
			var p struct {
				RequestID any `json:"requestId"`
			}
			if json.Unmarshal(req.Params, &p) == nil {
				delete(f.ids, p.RequestID)
			}
		case req.ID.IsValid():
			f.ids[req.ID.Raw()] = true
		}
	}
	f.signal()
}

// written notes a line written to the client (the SDK writes one message,
// or one batch, per line): its responses answer requests.
func (f *inflight) written(line []byte) {
	raws := []json.RawMessage{bytes.TrimSpace(line)}
	if len(raws[0]) > 0 && raws[0][0] == '[' {
		raws = nil
		json.Unmarshal(line, &raws)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, raw := range raws {
		if resp, err := jsonrpc.DecodeMessage(raw); err == nil {
			if r, ok := resp.(*jsonrpc.Response); ok {
				delete(f.ids, r.ID.Raw())
			}
		}
	}
	f.signal()
}

func (f *inflight) signal() {
	select {
	case f.changed <- struct{}{}:
	default:
	}
}

// wait returns once no request is in flight, or when ctx ends.
func (f *inflight) wait(ctx context.Context) {
	for {
		f.mu.Lock()
		n := len(f.ids)
		f.mu.Unlock()
		if n == 0 {
			return
		}
		select {
		case <-f.changed:
		case <-ctx.Done():
			return
		}
	}
}

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
