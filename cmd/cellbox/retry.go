package main

import (
	"context"
	"flag"
	"fmt"
)

func init() {
	register(command{
		name:  "retry",
		usage: "NODE [--data DIR | --server URL]  run a failed exec node again once its cause is fixed (an image built, a file in place); the memo cache is bypassed",
		run:   runRetry,
	})
}

func runRetry(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("retry", flag.ContinueOnError)
	af := addAPIFlags(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("want one NODE (name, pattern/name or space/pattern/name), got %d arguments", len(pos))
	}
	c, err := af.client()
	if err != nil {
		return err
	}
	cell, err := c.Retry(ctx, pos[0])
	if err != nil {
		return err
	}
	fmt.Printf("retrying %s (watch it: cellbox cell watch %s)\n", cell.Address, cell.Address)
	return nil
}
