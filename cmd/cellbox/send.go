package main

import (
	"context"
	"flag"
	"fmt"
)

func init() {
	register(command{
		name:  "send",
		usage: "NODE.STREAM JSON [--data DIR | --server URL]  send an event to a node's stream (e.g. repl.run '{\"command\": \"ls\"}')",
		run:   runSend,
	})
}

func runSend(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("send", flag.ContinueOnError)
	af := addAPIFlags(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return fmt.Errorf("want NODE.STREAM and one JSON event, got %d arguments (quote the JSON: '{\"command\": \"ls\"}')", len(pos))
	}
	payload, err := jsonArg(pos[1])
	if err != nil {
		return err
	}
	c, err := af.client()
	if err != nil {
		return err
	}
	sent, err := c.Send(ctx, pos[0], payload)
	if err != nil {
		return err
	}
	fmt.Printf("sent event %d to %s\n", sent.Event.ID, sent.Address)
	return nil
}
