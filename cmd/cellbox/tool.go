package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/cellbox/cellbox/sandboxclient"
)

func init() {
	register(command{
		name:  "tool",
		usage: "[--server URL --session ID --token T] NAME ['{json}'|-]  call a sandbox tool and print its result (no NAME: list the tools)",
		run:   runTool,
	})
}

func runTool(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("tool", flag.ContinueOnError)
	cf := addClientFlags(fs, true)
	if err := fs.Parse(args); err != nil {
		return err
	}
	c := sandboxclient.New(*cf.server, *cf.session, *cf.token)
	if fs.NArg() == 0 {
		tools, err := c.Tools(ctx)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
		for _, t := range tools {
			fmt.Fprintf(tw, "%s\t%s\n", t.Name, t.Description)
		}
		return tw.Flush()
	}
	if fs.NArg() > 2 {
		return fmt.Errorf("want NAME and at most one JSON input, got %d arguments (quote the JSON)", fs.NArg())
	}
	if *cf.session == "" || *cf.token == "" {
		return errors.New("no session: run `eval \"$(cellbox session new)\"` or pass --session and --token")
	}
	input := json.RawMessage("{}")
	if fs.NArg() == 2 {
		input = json.RawMessage(fs.Arg(1))
		if fs.Arg(1) == "-" {
			data, err := io.ReadAll(os.Stdin)
			if err != nil {
				return fmt.Errorf("read input from stdin: %w", err)
			}
			input = data
		}
	}
	res, err := c.Tool(ctx, fs.Arg(0), input)
	var te *sandboxclient.ToolError
	if res == nil || (err != nil && !errors.As(err, &te)) {
		return err
	}
	var out bytes.Buffer
	if json.Indent(&out, res, "", "  ") != nil {
		out.Reset()
		out.Write(res)
	}
	out.WriteByte('\n')
	os.Stdout.Write(out.Bytes())
	if te != nil {
		return errors.New("the tool reported an error (is_error: true)")
	}
	return nil
}
