// Command cellbox-bench measures cellbox's latencies against baselines
// measured in the same run: boxes (creates, tool calls, files, transfers,
// forks, run_code, storms), pipeline (`cellbox run` beside make with and
// without a sandbox), runtime (propagation, watchers, file bindings) and
// cluster (the same figures over etcd beside bbolt, issue 22).
//
// It is a binary of its own so that cellbox, the binary mounted into
// every box as its agent, does not carry it; it runs cellbox in the boxes
// (the one beside it, or --agent-binary) and builds `cellbox run`'s
// server in-process with package server. `cellbox bench ARGS` runs it
// when it lies beside cellbox.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// usage is the one line of what the command takes.
const usage = "boxes|pipeline|runtime|cluster [--json] [...]  measure box, pipeline, runtime and cluster (etcd) latencies against baselines (cellbox-bench boxes -h, pipeline -h, runtime -h, cluster -h)"

func main() {
	args := os.Args[1:]
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := runBench(ctx, args, os.Stdout)
	if err != nil && (errors.Is(err, flag.ErrHelp) || wantsHelp(args)) {
		// The flag package printed the details already, if it had any.
		fmt.Fprintf(os.Stderr, "usage: cellbox-bench %s\n", usage)
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "cellbox-bench: %v\n", err)
		os.Exit(1)
	}
}

// wantsHelp reports whether the command was asked for help where it takes
// a subcommand (cellbox-bench --help).
func wantsHelp(args []string) bool {
	return len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help")
}
