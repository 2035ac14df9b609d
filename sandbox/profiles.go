package sandbox

import (
	"context"
	"fmt"

	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/tools"
)

// Tool profiles: the tool sets agents are already written against (the
// seed documents beside DESIGN.md), served under their own names, fields
// and result shapes. A profile's tool does no work itself: it converts its
// input into the input of one registry handler (sandbox/tools, or
// tools_sandboxes.go), calls it, and converts the result. So every rule of the
// registry — paths confined to the box, caps, allowed_commands, notices —
// holds in every profile.

// DefaultProfile is cellbox's own tool set, the registry itself.
const DefaultProfile = "cellbox"

// mapped defines a profile's tool: name and input type In are the seed's,
// base is the registry tool whose handler h calls (its title and hints
// apply).
func mapped[In any, Out any](base, name, description string, h func(ctx context.Context, c *call, in In) (Out, error)) *tools.Tool {
	b, ok := LookupTool(base)
	if !ok {
		panic("sandbox: profile tool " + name + " maps onto no registry tool " + base)
	}
	return tools.Map(b, name, description, h)
}

// textOutput is the result of a tool whose seed returns a plain string.
type textOutput = tools.TextOutput

// readNotices tells, in a notice, what a read result's content field does
// not: that it is base64, or that the file goes on.
func readNotices(c *call, res agent.ReadResult, more string) {
	if res.Encoding == "base64" {
		c.Notice("the file is not UTF-8 text; content is its bytes base64-encoded")
	}
	if more != "" {
		c.Notice(more)
	}
}

// profileShell runs a command for a profile's command tool. shell's hint
// names fields these tools lack (background, timeout_ms), so a timeout or a
// cut is told in a notice of its own. Lacking background, these tools keep
// what a command leaves running (`nohup CMD &`), as their seeds do.
func profileShell(ctx context.Context, c *call, in api.ShellInput, maxOutput int) (api.ShellOutput, error) {
	out, err := tools.RunShell(ctx, c, in, maxOutput, true)
	switch {
	case err != nil:
	case out.TimedOut:
		c.Notice(fmt.Sprintf("the command was still running after %d ms and was killed with its process group; the output so far is above. Run long jobs in the background (nohup CMD > log 2>&1 &) and read their log.", in.TimeoutMs))
	case out.Truncated:
		c.Notice(fmt.Sprintf("output was cut at %d KiB per stream; redirect it to a file and read that", maxOutput>>10))
	}
	return out, err
}
