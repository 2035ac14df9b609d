package main

import (
	"context"
	"fmt"
	"runtime/debug"
)

func init() {
	register(command{
		name:  "version",
		usage: "print the version of this cellbox binary (module version, commit, Go version)",
		run: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("version takes no arguments, got %q", args)
			}
			fmt.Println(versionLine())
			return nil
		},
	})
}

// versionLine describes the binary from its build info: the module
// version ("(devel)" for a build from a work tree), the commit it was built
// from (with "+dirty" for uncommitted changes) and the Go version.
func versionLine() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
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
	}
	return line + " " + info.GoVersion
}
