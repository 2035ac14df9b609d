package sandbox

import (
	"cmp"
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/cellbox/cellbox/internal/safe"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/tools"
)

// The tool registry: the box tools of sandbox/tools (shell, process, the
// file tools, code, wait_port), the tools this service defines
// (tools_sandboxes.go, tools_snap.go, preview.go, network.go) and the
// profiles mapped onto them (profiles.go), on the machinery of
// sandbox/tools. The HTTP API, MCP, the CLI and the llm built-in all serve
// these.

// defaultTools is cellbox's own tool set, the registry itself.
var defaultTools = sync.OnceValue(func() *tools.Profile {
	return tools.NewProfile(DefaultProfile, "cellbox's own tools (docs/tools.md)", allTools())
})

// toolSet is the default profile and the others.
var toolSet = sync.OnceValue(func() *tools.Set {
	return tools.NewSet(defaultTools(),
		tools.NewProfile("cloudflare", "seed 000, the Cloudflare agent tool API", cloudflareTools()),
		tools.NewProfile("fs-tools", "seed 003, @cloudflare/fs-tools", fsTools()),
		tools.NewProfile("deerflow", "seed 004, the DeerFlow sandbox tools", deerflowTools()),
	)
})

// Tools returns the registry (the default profile's tools), in a stable
// order.
func Tools() []*tools.Tool { return defaultTools().Tools() }

// LookupTool returns the registry's tool called name.
func LookupTool(name string) (*tools.Tool, bool) { return defaultTools().Tool(name) }

// ToolInfos describes every tool of the default profile (GET /v1/tools).
func ToolInfos() []api.ToolInfo { return defaultTools().Infos() }

// Profiles returns every profile, the default first.
func Profiles() []*tools.Profile { return toolSet().Profiles() }

// LookupProfile returns the profile called name ("" is the default); an
// unknown one is a tools.ErrUnknownProfile.
func LookupProfile(name string) (*tools.Profile, error) { return toolSet().Profile(name) }

// ToolInfosFor describes the tools of profile (GET /v1/tools?profile=).
func ToolInfosFor(profile string) ([]api.ToolInfo, error) {
	p, err := LookupProfile(profile)
	if err != nil {
		return nil, err
	}
	return p.Infos(), nil
}

// LookupToolIn returns the tool called name in profile ("" is the
// default), for a face that needs the tool itself (its Base, ResultText);
// an unknown one is a tools.ErrUnknownTool.
func LookupToolIn(profile, name string) (*tools.Tool, error) {
	return toolSet().Lookup(profile, name)
}

// call is one tool call: its session, the boxes it leased and the notices
// for the result.
type call struct {
	s       *Service
	sess    *Session
	mu      sync.Mutex // guards notices: a heal may add one from a goroutine of the call
	notices []string
	leases  []*lease
}

// box leases the session's box name (lazily created, woken if asleep)
// until the call ends.
func (c *call) box(ctx context.Context, name string) (*lease, error) {
	return c.lease(ctx, name, false)
}

// existingBox is box for a tool that has nothing to do with a new, empty
// sandbox (snapshot, fork): a name the session has no sandbox of is no_box.
func (c *call) existingBox(ctx context.Context, name string) (*lease, error) {
	return c.lease(ctx, name, true)
}

func (c *call) lease(ctx context.Context, name string, mustExist bool) (*lease, error) {
	l, err := c.s.acquireBox(ctx, c.sess, name, c.Notice, mustExist)
	if err != nil {
		return nil, err
	}
	c.leases = append(c.leases, l)
	return l, nil
}

// Box leases the session's box name for a box tool (tools.Call).
func (c *call) Box(ctx context.Context, name string) (tools.Box, error) {
	l, err := c.box(ctx, name)
	if err != nil {
		return tools.Box{}, err
	}
	return tools.Box{ID: l.b.rec.ID, Client: l.client, Env: l.b.rec.Env}, nil
}

// Notice adds n to the call's result (tools.Call).
func (c *call) Notice(n string) {
	c.mu.Lock()
	c.notices = append(c.notices, n)
	c.mu.Unlock()
}

// Allowed is the session's allowed_commands (tools.Call).
func (c *call) Allowed() tools.AllowList { return c.sess.allowed }

func (c *call) done() {
	for _, l := range c.leases {
		l.release()
	}
}

// CallTool runs tool name for session id with the JSON input raw and
// returns the result object: the tool's output plus "is_error" (and
// "error" with a message a model can act on when it failed, "notice" when
// something happened worth knowing, e.g. a lost box was recreated). The
// error is non-nil only for an unknown session or tool.
func (s *Service) CallTool(ctx context.Context, sessionID, name string, raw json.RawMessage) (json.RawMessage, error) {
	return s.CallToolAs(ctx, sessionID, DefaultProfile, name, raw)
}

// CallToolAs is CallTool with the tool named as in profile ("" is the
// default profile); an unknown profile is an ErrUnknownProfile.
func (s *Service) CallToolAs(ctx context.Context, sessionID, profile, name string, raw json.RawMessage) (json.RawMessage, error) {
	return s.AppendToolResult(ctx, nil, sessionID, profile, name, raw)
}

// AppendToolResult is CallToolAs appending the result object to dst: the
// HTTP API renders a result (a read_file window is 256 KiB) into a buffer
// it keeps for the next call. The call keeps nothing of raw: it may be
// reused once this returns.
func (s *Service) AppendToolResult(ctx context.Context, dst []byte, sessionID, profile, name string, raw json.RawMessage) (json.RawMessage, error) {
	t, err := LookupToolIn(profile, name)
	if err != nil {
		return nil, err
	}
	sess, err := s.session(sessionID)
	if err != nil {
		return nil, err
	}
	return s.callTool(ctx, dst, sess, t, raw)
}

func (s *Service) callTool(ctx context.Context, dst []byte, sess *Session, t *tools.Tool, raw json.RawMessage) (json.RawMessage, error) {
	name := t.Name
	if t.Profile != DefaultProfile {
		name = t.Profile + "/" + t.Name // the metric's label
	}
	start := time.Now()
	c := &call{s: s, sess: sess}
	out, err := s.runTool(withCall(ctx, sess, c.Notice), t, c, raw)
	if err != nil {
		for _, l := range c.leases {
			err = s.explain(ctx, sess, l, err)
		}
		// The caller ended the call with a reason (a server that
		// stops): that is the answer (what failed then is the echo of
		// it in the agent's connection), with the reason's code, or
		// unavailable: the call did not fail, it was not let finish,
		// and may be made again once the server is back. (The one
		// caller that gives a reason is cellbox's HTTP server when its
		// --shutdown-grace runs out; its reason has no code.)
		if cause := context.Cause(ctx); ctx.Err() != nil && cause != ctx.Err() {
			err = api.WithCode(cmp.Or(api.CodeOf(cause), api.CodeUnavailable), cause)
		}
	}
	c.done()
	s.metrics.observeTool(name, err == nil, time.Since(start))
	if err != nil {
		s.log.Debug("tool failed", "tool", name, "session", sess.ID, "err", err)
	}
	return toolResult(dst, out, err, c.notices), nil
}

// runTool runs t's handler; a panic in it is an error result.
func (s *Service) runTool(ctx context.Context, t *tools.Tool, c *call, raw json.RawMessage) (out any, err error) {
	defer safe.Recover(s.log, "tool "+t.Name, &err)
	return t.Run(ctx, c, raw)
}

// ErrorResult is the result object of a call that failed with err before
// any tool ran (a face that could not bind it to a session): what
// CallTool answers for a failed tool, {"is_error": true, "error", "code"}.
func ErrorResult(err error) json.RawMessage { return toolResult(nil, nil, err, nil) }

// toolResult appends the result object of a call to dst, with err's code.
func toolResult(dst []byte, out any, err error, notices []string) json.RawMessage {
	return tools.AppendResult(dst, out, err, ErrorCode(err), notices)
}
