// Command cellbox is the one cellbox binary: the server, the pattern runner,
// the CLI clients, the image builder, the benchmarks and the in-box agent.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// command is one subcommand. Each lives in a file of its own and registers
// itself from init, so adding one touches no other file.
type command struct {
	name  string
	usage string // one line: arguments and what it does
	run   func(ctx context.Context, args []string) error
}

var commands = map[string]command{}

func register(c command) {
	if _, dup := commands[c.name]; dup {
		panic("cellbox: command registered twice: " + c.name)
	}
	commands[c.name] = c
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: cellbox COMMAND [ARGS]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-8s %s\n", n, commands[n].usage)
	}
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		os.Exit(2)
	}
	c, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "cellbox: unknown command %q\n\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := c.run(ctx, os.Args[2:])
	if err != nil && (errors.Is(err, flag.ErrHelp) || wantsHelp(os.Args[2:])) {
		// The flag package printed the details already, if it had any.
		fmt.Fprintf(os.Stderr, "usage: cellbox %s %s\n", c.name, c.usage)
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "cellbox %s: %v\n", c.name, err)
		os.Exit(1)
	}
}

// wantsHelp reports whether a command was asked for help where it takes a
// subcommand (cellbox cell --help).
func wantsHelp(args []string) bool {
	return len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help")
}
