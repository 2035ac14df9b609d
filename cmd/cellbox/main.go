// Command cellbox is the cellbox binary: the server, the pattern runner,
// the CLI clients, the image builder and the in-box agent (every box
// mounts it). The benchmarks are cmd/cellbox-bench, which `cellbox bench`
// runs; the server itself is package server, which serve and run wire up.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"github.com/cellbox/cellbox/internal/suggest"
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

// usage prints the commands to w.
func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: cellbox COMMAND [ARGS]   (cellbox COMMAND --help: its flags)\n\ncommands:")
	for _, n := range commandNames() {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].usage)
	}
}

func commandNames() []string {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func main() {
	// Asked for help: the commands, on stdout. Given no command: the same
	// on stderr, and a failure (as go does), so a script that forgot its
	// command does not pass.
	if wantsHelp(os.Args[1:]) {
		usage(os.Stdout)
		return
	}
	if len(os.Args) < 2 {
		usage(os.Stderr)
		os.Exit(2)
	}
	if os.Args[1] == "--version" {
		os.Args[1] = "version"
	}
	c, ok := commands[os.Args[1]]
	if !ok {
		msg := fmt.Sprintf("cellbox: unknown command %q%s", os.Args[1], suggest.DidYouMean(os.Args[1], commandNames()))
		fmt.Fprintf(os.Stderr, "%s\nthe commands: %s; `cellbox --help` says what each does\n", msg, strings.Join(commandNames(), ", "))
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
