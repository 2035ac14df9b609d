package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/cellbox/cellbox/internal/suggest"
	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/api"
)

// Tool profiles: the tool sets agents are already written against (the
// seed documents beside DESIGN.md), served under their own names, fields
// and result shapes. A profile's tool does no work itself: it converts its
// input into the input of one registry handler (tools_box.go,
// tools_files.go), calls it, and converts the result. So every rule of the
// registry — paths confined to the box, caps, allowed_commands, notices —
// holds in every profile.

// DefaultProfile is cellbox's own tool set, the registry itself.
const DefaultProfile = "cellbox"

// ErrUnknownProfile is returned (wrapped) for a profile name that does not
// exist.
var ErrUnknownProfile = errors.New("unknown tool profile")

// Profile is a named tool set.
type Profile struct {
	Name string
	// Seed says where the names, fields and result shapes come from.
	Seed   string
	tools  []*Tool
	byName map[string]*Tool
}

// Tools returns the profile's tools, in the order its seed lists them.
func (p *Profile) Tools() []*Tool { return p.tools }

var (
	profilesOnce sync.Once
	profileList  []*Profile
)

// Profiles returns every profile, the default first.
func Profiles() []*Profile {
	profilesOnce.Do(func() {
		profileList = []*Profile{
			{Name: DefaultProfile, Seed: "cellbox's own tools (docs/tools.md)", tools: Tools()},
			{Name: "cloudflare", Seed: "seed 000, the Cloudflare agent tool API", tools: cloudflareTools()},
			{Name: "fs-tools", Seed: "seed 003, @cloudflare/fs-tools", tools: fsTools()},
			{Name: "deerflow", Seed: "seed 004, the DeerFlow sandbox tools", tools: deerflowTools()},
		}
		for _, p := range profileList {
			p.byName = map[string]*Tool{}
			for _, t := range p.tools {
				if p.byName[t.Name] != nil {
					panic("sandbox: tool defined twice in profile " + p.Name + ": " + t.Name)
				}
				if p.Name != DefaultProfile {
					if _, ok := LookupTool(t.Base); !ok {
						panic("sandbox: profile tool " + p.Name + "/" + t.Name + " maps onto no registry tool")
					}
					t.Profile = p.Name
				}
				p.byName[t.Name] = t
			}
		}
	})
	return profileList
}

func profileNames() []string {
	var names []string
	for _, p := range Profiles() {
		names = append(names, p.Name)
	}
	return names
}

// LookupProfile returns the profile called name ("" is the default).
func LookupProfile(name string) (*Profile, error) {
	if name == "" {
		name = DefaultProfile
	}
	for _, p := range Profiles() {
		if p.Name == name {
			return p, nil
		}
	}
	return nil, fmt.Errorf("%w %q; profiles: %s", ErrUnknownProfile, name, strings.Join(profileNames(), ", "))
}

// ToolInfosFor describes the tools of profile (GET /v1/tools?profile=).
func ToolInfosFor(profile string) ([]api.ToolInfo, error) {
	p, err := LookupProfile(profile)
	if err != nil {
		return nil, err
	}
	return toolInfos(p.tools), nil
}

// LookupToolIn returns the tool called name in profile ("" is the
// default), for a face that needs the tool itself (its Base, ResultText).
func LookupToolIn(profile, name string) (*Tool, error) {
	p, err := LookupProfile(profile)
	if err != nil {
		return nil, err
	}
	t, ok := p.byName[name]
	if !ok {
		names := toolNames(p.tools)
		return nil, fmt.Errorf("%w %q in profile %s%s; tools: %s", ErrUnknownTool, name, p.Name, suggest.DidYouMean(name, names), strings.Join(names, ", "))
	}
	return t, nil
}

// ResultText is the text a model should see for a result object of t: for
// a tool whose seed returns a plain string (TextResult), that string (or
// the error message, with any notice after it); otherwise the object
// itself.
func (t *Tool) ResultText(result json.RawMessage) string {
	if !t.TextResult {
		return string(result)
	}
	var r struct {
		Error  string `json:"error"`
		Notice string `json:"notice"`
		Output string `json:"output"`
	}
	if err := json.Unmarshal(result, &r); err != nil {
		return string(result)
	}
	text := r.Output
	if r.Error != "" {
		text = "Error: " + r.Error
	}
	if r.Notice != "" {
		text += "\n(" + r.Notice + ")"
	}
	return text
}

// mapped defines a profile's tool: name and input type In are the seed's,
// base is the registry tool whose handler h calls (its title and hints
// apply).
func mapped[In any, Out any](base, name, description string, h func(ctx context.Context, c *call, in In) (Out, error)) *Tool {
	b, ok := LookupTool(base)
	if !ok {
		panic("sandbox: profile tool " + name + " maps onto no registry tool " + base)
	}
	t := defineTool(name, b.Meta, description, h)
	t.Base = base
	_, t.TextResult = any(*new(Out)).(textOutput)
	return t
}

// textOutput is the result of a tool whose seed returns a plain string.
type textOutput struct {
	Output string `json:"output"`
}

// readNotices tells, in a notice, what a read result's content field does
// not: that it is base64, or that the file goes on.
func readNotices(c *call, res agent.ReadResult, more string) {
	if res.Encoding == "base64" {
		c.notice("the file is not UTF-8 text; content is its bytes base64-encoded")
	}
	if more != "" {
		c.notice(more)
	}
}

// profileShell runs a command for a profile's command tool. shell's hint
// names fields these tools lack (background, timeout_ms), so a timeout or a
// cut is told in a notice of its own. Lacking background, these tools keep
// what a command leaves running (`nohup CMD &`), as their seeds do.
func profileShell(ctx context.Context, c *call, in api.ShellInput, maxOutput int) (api.ShellOutput, error) {
	out, err := runShell(ctx, c, in, maxOutput, true)
	switch {
	case err != nil:
	case out.TimedOut:
		c.notice(fmt.Sprintf("the command was still running after %d ms and was killed with its process group; the output so far is above. Run long jobs in the background (nohup CMD > log 2>&1 &) and read their log.", in.TimeoutMs))
	case out.Truncated:
		c.notice(fmt.Sprintf("output was cut at %d KiB per stream; redirect it to a file and read that", maxOutput>>10))
	}
	return out, err
}
