package main

import (
	"context"
	"fmt"
	"runtime/debug"

	"github.com/cellbox/cellbox/internal/buildinfo"
	"github.com/cellbox/cellbox/server"
)

func init() {
	register(command{
		name:  "version",
		usage: "print the version of this cellbox binary (cellbox, or cellbox-cluster with the cluster's clients; module version, commit if the build recorded one, Go version)",
		run: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("version takes no arguments, got %q", args)
			}
			info, _ := debug.ReadBuildInfo()
			name := "cellbox"
			if server.ClusterLinked() {
				name = clusterBinary // the cluster's clients linked
			}
			fmt.Println(buildinfo.Line(name, info))
			return nil
		},
	})
}
