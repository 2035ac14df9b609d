package main

import (
	"context"
	"fmt"
	"runtime/debug"

	"github.com/cellbox/cellbox/internal/buildinfo"
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
			fmt.Println(buildinfo.Line("cellbox", info))
			return nil
		},
	})
}
