package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/cellbox/cellbox/patterns"
	"github.com/cellbox/cellbox/server/runapi"
)

func init() {
	register(command{
		name:  "graph",
		usage: "PATTERN [--format dot|mermaid]  print a pattern's graph (Graphviz dot or Mermaid); PATTERN is a folder or .yaml file, or the name of a loaded instance",
		run:   runGraph,
	})
}

func runGraph(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("graph", flag.ContinueOnError)
	format := fs.String("format", runapi.FormatDot, "dot (Graphviz: cellbox graph P | dot -Tsvg > g.svg) or mermaid")
	af := addAPIFlags(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("want one PATTERN, got %d arguments", len(pos))
	}
	var text string
	if _, statErr := os.Stat(pos[0]); statErr == nil {
		if err := patternsUnder("graph", pos[0], pos[0]); err != nil { // a folder of patterns: name them
			return err
		}
		p, err := patterns.Load(pos[0])
		if err != nil {
			return err
		}
		if text, err = runapi.Graph(p, *format); err != nil {
			return err
		}
	} else {
		// Not a file: the name of an instance a running cellbox serves.
		c, err := af.client()
		var noRun errNoRun
		if errors.As(err, &noRun) {
			return fmt.Errorf("pattern %s: %w", pos[0], statErr)
		}
		if err != nil {
			return err
		}
		if text, err = c.Graph(ctx, pos[0], *format); err != nil {
			return err
		}
	}
	_, err = fmt.Print(text)
	return err
}
