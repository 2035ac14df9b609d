package tools

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/cellbox/cellbox/internal/suggest"
	"github.com/cellbox/cellbox/sandbox/api"
)

// ErrUnknownTool is returned (wrapped) for a tool name a profile does not
// have.
var ErrUnknownTool = errors.New("unknown tool")

// ErrUnknownProfile is returned (wrapped) for a profile name that does not
// exist.
var ErrUnknownProfile = errors.New("unknown tool profile")

// Profile is a named tool set: the default profile is the registry itself;
// any other serves the tools an agent is already written against (a seed
// API's names, fields and result shapes), each mapped onto a default tool.
type Profile struct {
	Name string
	// Seed says where the names, fields and result shapes come from.
	Seed   string
	tools  []*Tool
	byName map[string]*Tool
}

// NewProfile makes a profile of tools, listed in that order, and sets their
// Profile. Two tools of one name panic: a mistake in the code that lists them.
func NewProfile(name, seed string, tools []*Tool) *Profile {
	p := &Profile{Name: name, Seed: seed, tools: tools, byName: map[string]*Tool{}}
	for _, t := range tools {
		if p.byName[t.Name] != nil {
			panic("tools: tool defined twice in profile " + name + ": " + t.Name)
		}
		p.byName[t.Name] = t
		t.Profile = name
	}
	return p
}

// Tools returns the profile's tools, in the order its seed lists them.
func (p *Profile) Tools() []*Tool { return p.tools }

// Tool returns the profile's tool called name.
func (p *Profile) Tool(name string) (*Tool, bool) {
	t, ok := p.byName[name]
	return t, ok
}

// Infos describes the profile's tools (GET /v1/tools, MCP's tools/list).
func (p *Profile) Infos() []api.ToolInfo {
	out := make([]api.ToolInfo, 0, len(p.tools))
	for _, t := range p.tools {
		out = append(out, api.ToolInfo{Name: t.Name, Description: t.Description, InputSchema: t.InputSchema})
	}
	return out
}

// names returns the profile's tool names, sorted.
func (p *Profile) names() []string {
	names := make([]string, 0, len(p.tools))
	for _, t := range p.tools {
		names = append(names, t.Name)
	}
	sort.Strings(names)
	return names
}

// Set is the default profile and the others. Every other profile's tool maps onto one of the
// default's (a tool whose Base is not there panics).
type Set struct {
	profiles []*Profile
}

// NewSet makes the set of def and others.
func NewSet(def *Profile, others ...*Profile) *Set {
	s := &Set{profiles: append([]*Profile{def}, others...)}
	for _, p := range s.profiles {
		if p == def {
			continue
		}
		for _, t := range p.tools {
			if _, ok := def.byName[t.Base]; !ok {
				panic("tools: profile tool " + p.Name + "/" + t.Name + " maps onto no tool of " + def.Name)
			}
		}
	}
	return s
}

// Default returns the default profile.
func (s *Set) Default() *Profile { return s.profiles[0] }

// Profiles returns every profile, the default first.
func (s *Set) Profiles() []*Profile { return s.profiles }

// Profile returns the profile called name ("" is the default); an unknown
// name is an ErrUnknownProfile that lists the profiles.
func (s *Set) Profile(name string) (*Profile, error) {
	if name == "" {
		return s.Default(), nil
	}
	names := make([]string, 0, len(s.profiles))
	for _, p := range s.profiles {
		if p.Name == name {
			return p, nil
		}
		names = append(names, p.Name)
	}
	return nil, fmt.Errorf("%w %q; profiles: %s", ErrUnknownProfile, name, strings.Join(names, ", "))
}

// Lookup returns the tool called name in profile ("" is the default); an
// unknown tool is an ErrUnknownTool with the nearest name and the list.
func (s *Set) Lookup(profile, name string) (*Tool, error) {
	p, err := s.Profile(profile)
	if err != nil {
		return nil, err
	}
	t, ok := p.byName[name]
	if !ok {
		names := p.names()
		return nil, fmt.Errorf("%w %q in profile %s%s; tools: %s", ErrUnknownTool, name, p.Name, suggest.DidYouMean(name, names), strings.Join(names, ", "))
	}
	return t, nil
}
