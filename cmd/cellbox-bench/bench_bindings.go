package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cellbox/cellbox/builtins"
	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/runtime"
	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/server"
)

// targetBinding is the p50 a file binding should stay under, either way
// (issue 3).
const targetBinding = 20 * time.Millisecond

// Paths bound by the bench's sandbox node.
const (
	bindIn    = "/workspace/in.txt"  // input: the cell "content"
	bindOut   = "/workspace/out.txt" // output: files[bindOut] of the node
	bindProbe = "/workspace/probe.txt"
)

// bindingRows measures the file bindings of a sandbox node (builtins.Sandbox)
// on box backend name: a cell written → the bound file in the box, and a
// file written in the box → the node's output cell. Runtime over bbolt,
// the sandbox service in-process, as `cellbox run` has them.
func bindingRows(ctx context.Context, rep *benchReport, name string, o runtimeOptions) (err error) {
	dir, err := os.MkdirTemp("", "cbr-") // short: box socket paths are limited
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	be, err := server.OpenBackend(ctx, name, dir, o.agentBinary)
	if err != nil {
		return err
	}
	if name == "docker" {
		_ = rep.noteDocker(ctx) // for the header only
	}
	if c, ok := be.(io.Closer); ok {
		defer c.Close()
	}
	svc, err := newBenchService(ctx, be, dir, o.agentBinary, 0)
	if err != nil {
		return err
	}
	defer svc.Close()
	session, _, err := svc.NewSession(ctx)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), benchCleanupLimit)
		defer cancel()
		err = errors.Join(err, svc.DeleteSession(cctx, session))
	}()
	client := svc.Client(session)

	node := cells.Address{Space: "bench", Pattern: "files", Name: "box"}
	kind, err := builtins.NewSandbox(builtins.Env{Client: client, Logger: benchLogger()}, builtins.SandboxSpec{
		Node: node,
		Files: map[string]builtins.File{
			bindIn:  {Input: func(in runtime.Inputs) (any, error) { return in["content"], nil }},
			bindOut: {Output: builtins.OutputText},
		},
	})
	if err != nil {
		return err
	}
	p := runtime.Pattern{Space: node.Space, Name: node.Pattern,
		Cells: []runtime.Cell{{Name: "content", Initial: json.RawMessage(`"start"`)}},
		Nodes: []runtime.Node{{Name: node.Name, Inputs: []string{"content"}, Kind: kind, Builtin: "sandbox", Streams: []string{"run", "destroy"}}}}
	rt, store, closeAll, err := benchRuntimeInstance(ctx, dir, "bbolt", p)
	if err != nil {
		return err
	}
	defer closeAll()
	// Stopping the pattern destroys the box (closing the runtime keeps it).
	defer rt.Stop(context.WithoutCancel(ctx), node.Space, node.Pattern)
	box := kind.BoxName()
	if err := waitFile(ctx, client, box, bindIn, "start"); err != nil {
		return fmt.Errorf("the sandbox node did not come up: %w", err)
	}
	iters := min(o.n, 20)

	// Cell → file: Runtime.Set of the cell until the box's file has the
	// value (read back through the service every 0.2 ms).
	content := cells.Address{Space: node.Space, Pattern: node.Pattern, Name: "content"}
	toFile, err := benchLoop(ctx, iters, o.budget, func(i int) (time.Duration, error) {
		v := "cell-" + strconv.Itoa(i)
		return timed(func() error {
			if err := rt.Set(ctx, content, json.RawMessage(strconv.Quote(v))); err != nil {
				return err
			}
			return waitFile(ctx, client, box, bindIn, v)
		})
	})
	if err != nil {
		return fmt.Errorf("cell → file: %w", err)
	}
	upload, err := benchLoop(ctx, iters, o.budget, func(i int) (time.Duration, error) {
		return timed(func() error {
			_, err := client.Upload(ctx, box, bindProbe, strings.NewReader("probe-"+strconv.Itoa(i)))
			return err
		})
	})
	if err != nil {
		return fmt.Errorf("upload baseline: %w", err)
	}

	// File → cell: a write of the output file through the files endpoint
	// until a store watcher sees the node's files[bindOut] with it.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	batches, err := store.Watch(wctx, node.Prefix(), store.Version())
	if err != nil {
		return err
	}
	seen := make(chan string, 64)
	go func() {
		for b := range batches {
			for _, ch := range b.Changes {
				var out struct {
					Files map[string]json.RawMessage `json:"files"`
				}
				if ch.Cell.Addr == node && json.Unmarshal(ch.Cell.Value, &out) == nil {
					select {
					case seen <- string(out.Files[bindOut]):
					case <-wctx.Done():
						return
					}
				}
			}
		}
	}()
	toCell, err := benchLoop(ctx, iters, o.budget, func(i int) (time.Duration, error) {
		v := "file-" + strconv.Itoa(i)
		want := strconv.Quote(v)
		return timed(func() error {
			if _, err := client.Upload(ctx, box, bindOut, strings.NewReader(v)); err != nil {
				return err
			}
			return waitValue(ctx, seen, want, "files["+bindOut+"] of the node's cell")
		})
	})
	if err != nil {
		return fmt.Errorf("file → cell: %w", err)
	}
	// Baseline: the same write until the box's own watch reports it (the
	// agent debounces events by 10 ms).
	events, err := client.Watch(wctx, box, "/workspace")
	if err != nil {
		return err
	}
	watched := make(chan string, 64)
	go func() {
		for evs := range events {
			if !slices.ContainsFunc(evs, func(ev api.WatchEvent) bool { return ev.Path == bindProbe }) {
				continue
			}
			select { // once per batch
			case watched <- bindProbe:
			case <-wctx.Done():
				return
			}
		}
	}()
	watch, err := benchLoop(ctx, iters, o.budget, func(i int) (time.Duration, error) {
		for len(watched) > 0 { // a late batch of the last write must not count for this one
			<-watched
		}
		return timed(func() error {
			if _, err := client.Upload(ctx, box, bindProbe, strings.NewReader("watch-"+strconv.Itoa(i))); err != nil {
				return err
			}
			return waitValue(ctx, watched, bindProbe, "a watch event of "+bindProbe)
		})
	})
	if err != nil {
		return fmt.Errorf("watch baseline: %w", err)
	}
	uploadP50, _, _ := percentiles(upload)
	watchP50, _, _ := percentiles(watch)
	rep.add(name, "cell written → file in the box (sandbox node)", toFile, "upload of the file alone", uploadP50, targetBinding)
	rep.add(name, "file written in the box → output cell (sandbox node)", toCell, "the box's file watch reports it", watchP50, targetBinding)
	return nil
}

// waitFile polls a box file until it holds want.
func waitFile(ctx context.Context, c *sandbox.LocalClient, box, path, want string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var buf bytes.Buffer
	for {
		buf.Reset()
		if _, err := c.Download(ctx, box, path, &buf); err == nil && buf.String() == want {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("file %s in box %s did not become %q (last %q): %w", path, box, want, buf.String(), ctx.Err())
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// waitValue waits until ch delivers want.
func waitValue(ctx context.Context, ch <-chan string, want, what string) error {
	timeout := time.After(10 * time.Second)
	for {
		select {
		case v := <-ch:
			if v == want {
				return nil
			}
		case <-timeout:
			return fmt.Errorf("%s did not become %s within 10s", what, want)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
