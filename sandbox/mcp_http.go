package sandbox

import (
	"context"
	"encoding/json"
	"net/http"
	"runtime/debug"

	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/mcp"
)

// MCPInstructions tell an MCP client's model how the tools fit together.
const MCPInstructions = `These tools run commands and edit files in sandboxed Linux boxes of your session. ` +
	`A box is named by the "sandbox" field (default "default"), is created on first use and keeps its files between calls; ` +
	`relative paths are relative to /workspace. Boxes have no network unless created with sandbox_create network: true. ` +
	`Use shell for commands (background: true for servers, then process), read_file/write_file/edit/str_replace/grep/glob/ls for files, ` +
	`transfer to copy between boxes, and browse to get a URL for a server listening in a box.`

// MCPInfo describes cellbox to MCP clients.
func MCPInfo() mcp.Info {
	version := "dev"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		version = bi.Main.Version
	}
	return mcp.Info{Name: "cellbox", Version: version, Instructions: MCPInstructions}
}

// MCPServer returns an MCP server of the tool registry that runs every call
// in session id's boxes.
func (s *Service) MCPServer(id string) (*mcp.Server, error) {
	if _, err := s.session(id); err != nil {
		return nil, err
	}
	s.pin(id)
	return mcp.NewServer(sessionTools{s: s, id: id}, MCPInfo()), nil
}

// sessionTools is the registry bound to one session.
type sessionTools struct {
	s  *Service
	id string
}

func (t sessionTools) Tools() []api.ToolInfo { return ToolInfos() }

func (t sessionTools) Call(ctx context.Context, name string, args json.RawMessage) (json.RawMessage, error) {
	return t.s.CallTool(ctx, t.id, name, args)
}

// handleMCP serves POST /v1/sessions/{id}/mcp: MCP's Streamable HTTP
// transport, one JSON-RPC message per request, answered as application/json.
func (s *Service) handleMCP(w http.ResponseWriter, r *http.Request, sess *Session) {
	mcp.NewServer(sessionTools{s: s, id: sess.ID}, MCPInfo()).ServeHTTP(w, r)
}
