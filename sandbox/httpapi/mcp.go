package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/mcpserver"
)

// mcpHTTP serves MCP's Streamable HTTP transport with the SDK's handler
// (sessions by Mcp-Session-Id, POST answered as JSON or an event stream,
// GET for the server's own stream, DELETE to end a session) on two routes:
//
//   - /v1/mcp, behind the server key (checked by the server in front of
//     Handler): every MCP session gets a cellbox session of its own,
//     made on its first tool call or resource read and deleted with its
//     boxes when the MCP session ends (DELETE, or idle for idleTTL:
//     Options.MCPIdleTTL).
//   - /v1/sessions/{id}/mcp, with session id's token: the tools run in that
//     existing session, which outlives the MCP sessions.
//
// Both share one SDK server; bind tells the routes apart by the token info
// the second route puts on its requests (the SDK also refuses an MCP
// session of one cellbox session on another's requests by it).
//
// ?profile=NAME on either route serves that tool set (cloudflare,
// fs-tools, deerflow; cellbox's own without it): one SDK server a profile.
type mcpHTTP struct {
	s       *sandbox.Service
	keyed   http.Handler // /v1/mcp
	session http.Handler // /v1/sessions/{id}/mcp, after authed

	mu  sync.Mutex
	ids map[*mcp.ServerSession]string // the cellbox session of each MCP session
	// keyedServers and sessionServers are the MCP servers of the profiles
	// on each route, each once.
	keyedServers, sessionServers []*mcp.Server
	open                         map[string]int // /v1/sessions/{id}/mcp: MCP sessions open on cellbox session id
}

// newMCPHTTP makes the MCP routes of s. idleTTL (0: none) is how long an
// MCP session of /v1/mcp may go without a request. The SDK's
// SessionTimeout does the counting: its timer stops while a POST of the
// session runs (a long call is no idleness) and closes the session when
// it fires, which ends ss.Wait in end, which deletes the cellbox session
// with its boxes. An MCP session of /v1/sessions/{id}/mcp holds no boxes
// of its own and keeps the service's SessionTTL.
func newMCPHTTP(s *sandbox.Service, idleTTL time.Duration) *mcpHTTP {
	m := &mcpHTTP{s: s, ids: map[*mcp.ServerSession]string{}, open: map[string]int{}}
	opts := func(timeout time.Duration) *mcp.StreamableHTTPOptions {
		return &mcp.StreamableHTTPOptions{
			SessionTimeout: timeout,
			// The server in front of Handler checks Host and Origin (see
			// server.Guard, which also knows --allowed-host names).
			DisableLocalhostProtection: true,
			MaxRequestBodyBytes:        MaxToolBody,
			Logger:                     s.Logger(),
		}
	}
	var get func(r *http.Request) *mcp.Server
	get, m.keyedServers = m.servers()
	m.keyed = m.admit(mcp.NewStreamableHTTPHandler(get, opts(idleTTL)), true)
	get, m.sessionServers = m.servers()
	m.session = mcp.NewStreamableHTTPHandler(get, opts(max(s.Config().SessionTTL, 0)))
	return m
}

// servers makes an MCP server for each profile and returns the SDK's
// picker of one by ?profile= (an unknown profile gets none: the SDK
// answers 400) with the list of them. Each route has its own, so that
// their sessions are told apart (admit).
func (m *mcpHTTP) servers() (func(r *http.Request) *mcp.Server, []*mcp.Server) {
	byName := map[string]*mcp.Server{}
	var list []*mcp.Server
	for _, p := range sandbox.Profiles() {
		tools, _ := sandbox.ToolInfosFor(p.Name)
		byName[p.Name] = mcpserver.New(p.Name, tools, func(ctx context.Context, req mcp.Request) (mcpserver.ToolCaller, error) {
			return m.bind(ctx, req, p.Name)
		})
		list = append(list, byName[p.Name])
	}
	byName[""] = byName[sandbox.DefaultProfile]
	return func(r *http.Request) *mcp.Server { return byName[r.URL.Query().Get("profile")] }, list
}

// serveSession serves /v1/sessions/{id}/mcp once authed has checked the
// token: the session id travels as the SDK's token info, so the tools run
// in that session and an MCP session is used by its cellbox session only.
func (m *mcpHTTP) serveSession(w http.ResponseWriter, r *http.Request, sess *sandbox.Session) {
	info := &auth.TokenInfo{UserID: sess.ID}
	verified := func(context.Context, string, *http.Request) (*auth.TokenInfo, error) { return info, nil }
	m.admit(auth.RequireBearerToken(verified, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(m.session), false).ServeHTTP(w, r)
}

// admit answers a request for an unknown ?profile= with 400 and the list
// of profiles, before it reaches the SDK (which would only say it has no
// server), and a request that would open an MCP session past the
// service's MaxSessions with 429 (code limit): the SDK keeps an MCP
// session until it is deleted or idle (for Options.MCPIdleTTL on
// /v1/mcp, SessionTTL on the other route), and has no cap of
// its own, so a client that opens sessions in a loop would otherwise grow
// the server without bound. On /v1/mcp (newSession), where an MCP session
// makes a cellbox session at its first call, the cellbox sessions count
// too, with the MCP sessions that have not made theirs yet: a session let
// in there can always make its own.
func (m *mcpHTTP) admit(h http.Handler, newSession bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := sandbox.LookupProfile(r.URL.Query().Get("profile")); err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		var method string
		var id json.RawMessage
		if r.Method == http.MethodPost && r.Header.Get("Mcp-Session-Id") == "" {
			method, id = rpcMethod(r)
		}
		if method == "server/discover" {
			// The stateless protocol's probe (SEP-2575), which clients
			// send first: served by the SDK, it opened a session that
			// lingered while the client went on to initialize, so an
			// initialize within the cap was refused now and then. This
			// server is stateful: the probe is answered "method not
			// found", and the client falls back to initialize.
			writeJSON(w, http.StatusOK, map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{
				"code": -32601, "message": "server/discover is not served here (a stateful server): send initialize"}})
			return
		}
		if method == "initialize" {
			keyed, unbound := m.sessions(m.keyedServers)
			other, _ := m.sessions(m.sessionServers)
			open, limit := keyed+other, m.s.Config().MaxSessions
			msg := fmt.Sprintf("%d MCP sessions are open, the most this server keeps (--max-sessions)", open)
			if n := m.s.ClientSessions() + unbound; newSession && n >= open {
				open, msg = n, fmt.Sprintf("this server has %d sessions (with MCP sessions that will make theirs), the most it keeps (--max-sessions)", n)
			}
			if open >= limit {
				writeJSON(w, http.StatusTooManyRequests, api.ErrorBody{Code: api.CodeLimit, Error: msg + ": end yours with DELETE and its Mcp-Session-Id header when done (cellbox session rm for others), or wait for idle ones to end (after --mcp-idle-ttl on /v1/mcp, --session-ttl on /v1/sessions/{id}/mcp)"})
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// rpcMethod returns the method and id of the JSON-RPC message r's body
// holds (r: a POST without Mcp-Session-Id), putting the body back: of an
// initialize, the one message that opens an MCP session, only these are
// held to the cap (a batch, or a body that does not parse, counts as one).
func rpcMethod(r *http.Request) (method string, id json.RawMessage) {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, MaxToolBody))
	r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), r.Body))
	var msg struct {
		Method string          `json:"method"`
		ID     json.RawMessage `json:"id"`
	}
	if err != nil || json.Unmarshal(body, &msg) != nil {
		return "initialize", nil // the SDK says what is wrong with it
	}
	return msg.Method, msg.ID
}

// sessions counts the MCP sessions of servers, and those of them that
// have no cellbox session yet.
func (m *mcpHTTP) sessions(servers []*mcp.Server) (open, unbound int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, srv := range servers {
		for ss := range srv.Sessions() {
			open++
			if _, ok := m.ids[ss]; !ok {
				unbound++
			}
		}
	}
	return open, unbound
}

// bind picks the cellbox session of an MCP request, to run profile's tools.
func (m *mcpHTTP) bind(ctx context.Context, req mcp.Request, profile string) (mcpserver.ToolCaller, error) {
	ss, ok := req.GetSession().(*mcp.ServerSession)
	if extra := req.GetExtra(); extra != nil && extra.TokenInfo != nil {
		id := extra.TokenInfo.UserID
		if ok {
			m.mu.Lock()
			if _, known := m.ids[ss]; !known {
				m.ids[ss] = id
				m.open[id]++
				go m.close(ss, id)
			}
			m.mu.Unlock()
		}
		return mcpserver.SessionCaller(m.s, id, profile), nil
	}
	if !ok {
		return nil, errors.New("MCP request without a server session")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	id, ok := m.ids[ss]
	if !ok {
		var err error
		if id, _, err = m.s.NewSession(ctx); err != nil {
			return nil, err
		}
		if err := m.s.Pin(id); err != nil { // lives as long as the MCP session, which has its own idle timeout
			return nil, err
		}
		m.ids[ss] = id
		m.s.Logger().Info("MCP session started", "mcp_session", ss.ID(), "session", id)
		go m.end(ss, id)
	}
	return mcpserver.SessionCaller(m.s, id, profile), nil
}

// close closes cellbox session id (sandbox.Service.CloseSession: its
// destroy_on_close boxes go) once MCP session ss, served on it, has ended
// and no other MCP session is open on it.
func (m *mcpHTTP) close(ss *mcp.ServerSession, id string) {
	ss.Wait()
	m.mu.Lock()
	delete(m.ids, ss)
	m.open[id]--
	last := m.open[id] == 0
	if last {
		delete(m.open, id)
	}
	m.mu.Unlock()
	if !last {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := m.s.CloseSession(ctx, id); err != nil && !errors.Is(err, sandbox.ErrNoSession) {
		m.s.Logger().Warn("close the session of an ended MCP session", "mcp_session", ss.ID(), "session", id, "err", err)
	}
}

// end deletes the cellbox session of MCP session ss once ss ends.
func (m *mcpHTTP) end(ss *mcp.ServerSession, id string) {
	ss.Wait()
	m.mu.Lock()
	delete(m.ids, ss)
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := m.s.DeleteSession(ctx, id); err != nil {
		m.s.Logger().Warn("delete the session of an ended MCP session", "mcp_session", ss.ID(), "session", id, "err", err)
		return
	}
	m.s.Logger().Info("MCP session ended: session deleted", "mcp_session", ss.ID(), "session", id)
}
