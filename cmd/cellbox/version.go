package main

import (
	"context"
	"fmt"
	"runtime/debug"
)

func init() {
	register(command{
		name:  "version",
		usage: "print the version of this cellbox binary (module version, commit if the build recorded one, Go version)",
		run: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("version takes no arguments, got %q", args)
			}
			info, _ := debug.ReadBuildInfo()
			fmt.Println(versionLine(info))
			return nil
		},
	})
}

// versionLine describes the binary from its build info (nil: none): the
// module version ("(devel)" for a build from a work tree), the commit it
// was built from (with "+dirty" for uncommitted changes) and the Go
// version. A build that recorded no commit (go build -buildvcs=false, a
// GOFLAGS that says so, a git worktree the go command does not recognise,
// or no git checkout) says so rather than leave the commit out silently.
func versionLine(info *debug.BuildInfo) string {
	if info == nil {
		return "cellbox (no build info)"
	}
	line := "cellbox " + info.Main.Version
	var rev, when, dirty string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			when = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if rev != "" {
		line += fmt.Sprintf(" commit %.12s%s %s", rev, dirty, when)
	} else {
		line += " (no commit recorded: build from a git checkout with -buildvcs=true to record it)"
	}
	return line + " " + info.GoVersion
}
