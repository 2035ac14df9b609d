package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandboxclient"
)

// code measures run_code in box w: a cell in a warm Python context and a
// stateless run (an interpreter started and ended per call), beside the
// shell tool starting python3 for the same line.
func (b *boxesBench) code(ctx context.Context, c *sandboxclient.HTTP) error {
	runCode := func(in api.RunCodeInput) error {
		out, err := callTool[api.RunCodeOutput](ctx, c, "run_code", in)
		if err == nil && (out.Exception != nil || out.Value == nil || *out.Value != "2") {
			err = fmt.Errorf("run_code 1+1: got value %v, exception %v", out.Value, out.Exception)
		}
		return err
	}
	cc, err := callTool[api.CodeContextCreateOutput](ctx, c, "code_context_create", api.CodeContextCreateInput{Sandbox: "w", Language: "python"})
	if err != nil {
		return fmt.Errorf("code context: %w", err)
	}
	cell := api.RunCodeInput{Sandbox: "w", Context: cc.ID, Code: "1 + 1"}
	if err := runCode(cell); err != nil {
		return err
	}
	inContext, err := benchLoop(ctx, b.o.n, b.o.budget, func(int) (time.Duration, error) {
		return timed(func() error { return runCode(cell) })
	})
	if err != nil {
		return fmt.Errorf("run_code in a context: %w", err)
	}
	stateless := api.RunCodeInput{Sandbox: "w", Language: "python", Code: "1 + 1"}
	fresh, err := benchLoop(ctx, min(b.o.n, 50), b.o.budget, func(int) (time.Duration, error) {
		return timed(func() error { return runCode(stateless) })
	})
	if err != nil {
		return fmt.Errorf("stateless run_code: %w", err)
	}
	baseline, err := b.baselineP50(ctx, func() error {
		out, err := shell(ctx, c, "w", "python3 -c 'print(1 + 1)'", 0)
		if err == nil && out.Stdout != "2\n" {
			err = errors.New("python3 -c printed " + out.Stdout)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("shell python3 -c: %w", err)
	}
	const base = "`shell` `python3 -c …`"
	b.rep.add(b.name, "`run_code` python `1 + 1` in a context", inContext, base, baseline, 0)
	b.rep.add(b.name, "`run_code` python `1 + 1` stateless", fresh, base, baseline, 0)
	return nil
}
