// Command cellbox-agent is the in-box agent alone: `cellbox-agent agent`
// is `cellbox agent` (package agentcmd), in a binary of the agent's
// packages only, which starts in a fraction of cellbox's time (about
// 19 ms against 72 ms on the build machine, where every box starts one):
// the server runs it in boxes when it lies beside the cellbox binary and
// was built from the same commit (server.AgentBinary), and cellbox
// itself otherwise.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/cellbox/cellbox/internal/buildinfo"
	"github.com/cellbox/cellbox/sandbox/agent/agentcmd"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cellbox-agent agent "+agentcmd.Usage+"\n       cellbox-agent version")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "version":
		info, _ := debug.ReadBuildInfo()
		fmt.Println(buildinfo.Line("cellbox-agent", info))
	case "agent":
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := agentcmd.Run(ctx, os.Args[2:])
		stop()
		if err != nil {
			fmt.Fprintf(os.Stderr, "cellbox-agent agent: %v\n", err)
			os.Exit(1)
		}
	default:
		fmt.Fprintf(os.Stderr, "cellbox-agent: unknown command %q: it runs the agent of a box (cellbox-agent agent) and says its version (cellbox-agent version); everything else is cellbox's\n", os.Args[1])
		os.Exit(2)
	}
}
