// Package buildinfo describes a cellbox binary from its build info: the
// version line both binaries print, and whether two binaries were built
// from the same source (the server runs cellbox-agent as the boxes'
// agent only then).
package buildinfo

import (
	"fmt"
	"runtime/debug"
)

// Line describes the binary from its build info (nil: none): the
// module version ("(devel)" for a build from a work tree), the commit it
// was built from (with "+dirty" for uncommitted changes) and the Go
// version. A build that recorded no commit (go build -buildvcs=false, a
// GOFLAGS that says so, a git worktree the go command does not recognise,
// or no git checkout) says so rather than leave the commit out silently.
func Line(name string, info *debug.BuildInfo) string {
	if info == nil {
		return name + " (no build info)"
	}
	line := name + " " + info.Main.Version
	rev, when, modified := vcs(info)
	dirty := ""
	if modified == "true" {
		dirty = "+dirty"
	}
	if rev != "" {
		line += fmt.Sprintf(" commit %.12s%s %s", rev, dirty, when)
	} else {
		line += " (no commit recorded: build from a git checkout with -buildvcs=true to record it)"
	}
	return line + " " + info.GoVersion
}

// SameSource says whether the binaries of a and b may be taken for builds
// of one source: the same module version, Go version and versions of the dependencies
// they share,
// and, where both recorded a commit (vcs.revision), the same commit with
// no change beside it in either (vcs.modified=false). Where either did
// not record one (-buildvcs=false, which GOFLAGS may hold) or was built
// from a changed tree, it answers Unknown: the caller decides by other
// means (server.AgentBinary: by the files' times).
func SameSource(a, b *debug.BuildInfo) Verdict {
	if a == nil || b == nil || a.Main.Path != b.Main.Path || a.Main.Version != b.Main.Version ||
		a.GoVersion != b.GoVersion || !sameDeps(a.Deps, b.Deps) {
		return Different
	}
	ra, _, ma := vcs(a)
	rb, _, mb := vcs(b)
	switch {
	case ra != "" && rb != "" && ra != rb:
		return Different
	case ra != "" && ra == rb && ma == "false" && mb == "false":
		return Same
	}
	return Unknown
}

// Verdict is SameSource's answer.
type Verdict int

const (
	Different Verdict = iota
	Same
	Unknown
)

// sameDeps says whether the modules a and b both depend on are of the
// same versions (cellbox-agent depends on a few of cellbox's).
func sameDeps(a, b []*debug.Module) bool {
	m := map[string]string{}
	for _, d := range a {
		m[d.Path] = d.Version
	}
	for _, d := range b {
		if v, ok := m[d.Path]; ok && v != d.Version {
			return false
		}
	}
	return true
}

func vcs(info *debug.BuildInfo) (revision, time, modified string) {
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.time":
			time = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	return revision, time, modified
}
