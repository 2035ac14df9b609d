package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/server"
	"github.com/cellbox/cellbox/server/runapi"
)

func init() {
	register(command{
		name: "cell",
		usage: "get ADDR | set ADDR JSON | watch [PREFIX] [--from V] | ls [PREFIX]  [--data DIR | --server URL]  read, write and watch the cells of a running `cellbox run`\n" +
			"           ADDR: name (first pattern), pattern/name or space/pattern/name; JSON strings need quotes: '\"hello\"'",
		run: runCell,
	})
}

// apiFlags are the flags of the commands that talk to the runtime API: the
// data directory of a `cellbox run` (its socket DATA/run.sock) or the URL of
// a server.
type apiFlags struct {
	data, server *string
}

func addAPIFlags(fs *flag.FlagSet) apiFlags {
	return apiFlags{
		data:   fs.String("data", server.DefaultDataDir(), "data directory of the cellbox run (or serve) to talk to, over DATA/run.sock (with --server: where its server.key is)"),
		server: fs.String("server", "", "URL of the runtime API instead (cellbox serve, or cellbox run --addr); sends the server key (env "+server.KeyEnv+", or DATA/server.key)"),
	}
}

// errNoRun says that nothing serves the data directory.
type errNoRun struct{ data string }

func (e errNoRun) Error() string {
	return fmt.Sprintf("no cellbox run is serving data dir %s; start one with `cellbox run PATTERN%s` (or give --server URL)", e.data, dataFlag(e.data))
}

// client returns the API client, or an errNoRun when no process serves
// DATA/run.sock.
func (f apiFlags) client() (*runapi.Client, error) {
	if *f.server != "" { // the server key: CELLBOX_KEY, or DATA/server.key
		return runapi.NewClient(*f.server).WithKey(server.ClientKey(*f.data)), nil
	}
	sock := filepath.Join(*f.data, server.RunSocketFile)
	conn, err := net.DialTimeout("unix", sock, 2*time.Second)
	if err != nil {
		return nil, errNoRun{*f.data}
	}
	conn.Close()
	return runapi.NewUnixClient(sock), nil
}

// offlineStore opens the cell store of DATA when no process serves it, to
// read it.
func (f apiFlags) offlineStore() (*server.State, error) {
	path := filepath.Join(*f.data, sandbox.StateFile)
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("%w, and it holds no cells yet (%s: %v)", errNoRun{*f.data}, path, errors.Unwrap(err))
	}
	return server.OpenState(*f.data)
}

func runCell(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("want a subcommand: get ADDR, set ADDR JSON, watch [PREFIX] or ls [PREFIX]")
	}
	sub := args[0]
	fs := flag.NewFlagSet("cell "+sub, flag.ContinueOnError)
	af := addAPIFlags(fs)
	asJSON := fs.Bool("json", false, "print the full cell records as JSON")
	var from *string
	if sub == "watch" {
		from = fs.String("from", "", "replay every change after this version first (the number a watch line starts with)")
	}
	pos, err := parseArgs(fs, args[1:])
	if err != nil {
		return err
	}
	want := map[string][2]int{"get": {1, 1}, "set": {2, 2}, "watch": {0, 1}, "ls": {0, 1}}
	n, ok := want[sub]
	if !ok {
		return fmt.Errorf("unknown subcommand %q: want get, set, watch or ls", sub)
	}
	if len(pos) < n[0] || len(pos) > n[1] {
		return fmt.Errorf("cell %s: want %s, got %d arguments (quote JSON values: '\"hello\"', '{\"a\": 1}')",
			sub, map[string]string{"get": "ADDR", "set": "ADDR JSON", "watch": "at most a PREFIX", "ls": "at most a PREFIX"}[sub], len(pos))
	}
	arg := func(i int) string {
		if i < len(pos) {
			return pos[i]
		}
		return ""
	}
	var value json.RawMessage
	if sub == "set" {
		if value, err = jsonArg(arg(1)); err != nil {
			return err
		}
	}
	var since *uint64
	if from != nil && *from != "" {
		n, err := strconv.ParseUint(*from, 10, 64)
		if err != nil {
			return fmt.Errorf("--from %q: want a version number (the number a watch line starts with)", *from)
		}
		since = &n
	}
	c, err := af.client()
	var noRun errNoRun
	if errors.As(err, &noRun) && sub != "set" {
		return cellOffline(ctx, af, sub, arg(0), since, *asJSON)
	}
	if err != nil {
		return err
	}
	if sub == "ls" || (sub == "watch" && arg(0) != "") {
		list, err := c.Cells(ctx, arg(0))
		if err != nil {
			return err
		}
		if arg(0) != "" && len(list.Cells) == 0 {
			_, err := c.Get(ctx, arg(0)) // its 404 says what there is
			return matchesNothing(arg(0), err)
		}
		if sub == "ls" {
			return printList(list, *asJSON)
		}
	}
	switch sub {
	case "get":
		cell, err := c.Get(ctx, arg(0))
		if err != nil {
			return err
		}
		return printCell(cell, *asJSON)
	case "set":
		cell, err := c.Set(ctx, arg(0), value)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(cell)
		}
		// Cut, as cell ls shows values: a value set from a file may be
		// megabytes, and the caller has it already (--json gives it all).
		fmt.Printf("%s = %s  (version %d)\n", cell.Address, short(cell.Value, 100), cell.Version)
		return nil
	}
	err = c.Watch(ctx, arg(0), since, func(b runapi.Batch) error { return printBatch(b, *asJSON) })
	switch {
	case errors.Is(err, io.EOF):
		return errors.New("the cellbox run stopped")
	case ctx.Err() != nil:
		return nil
	}
	return err
}

// cellOffline reads the store directly when no process serves it: get and
// ls as usual, watch shows what is stored (or the changes after since) and
// returns, since nothing can change.
func cellOffline(ctx context.Context, af apiFlags, sub, arg string, since *uint64, asJSON bool) error {
	state, err := af.offlineStore()
	if err != nil {
		return err
	}
	defer state.Close()
	store := state.Cells
	prefix, err := runapi.ResolvePrefix(store, nil, arg)
	if err != nil {
		return err
	}
	// What ls prints, a watch from now shows, and a PREFIX must match.
	var snap cells.Batch
	if sub != "get" && (arg != "" || since == nil) {
		if snap, err = runapi.Snapshot(store, prefix); err != nil {
			return err
		}
		if arg != "" && len(snap.Changes) == 0 {
			_, err := runapi.Lookup(store, nil, arg)
			return matchesNothing(arg, err)
		}
	}
	switch sub {
	case "get":
		c, err := runapi.Lookup(store, nil, arg)
		if err != nil {
			return err
		}
		return printCell(runapi.CellOf(c), asJSON)
	case "ls":
		b := runapi.BatchOf(snap)
		list := runapi.CellList{Version: b.Version, Cells: []runapi.Cell{}}
		for _, c := range b.Changes {
			list.Cells = append(list.Cells, c.Cell)
		}
		return printList(list, asJSON)
	}
	fmt.Fprintf(os.Stderr, "cellbox cell watch: %v; showing what is stored\n", errNoRun{*af.data})
	if since == nil {
		return printBatch(runapi.BatchOf(snap), asJSON)
	}
	end := store.Version()
	if *since >= end {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := store.Watch(ctx, "", *since) // all commits, so the last one is end
	if err != nil {
		return err
	}
	for b := range ch {
		if b.Err != nil {
			return b.Err
		}
		b.Changes = slices.DeleteFunc(b.Changes, func(c cells.Change) bool { return !cells.HasPrefix(c.Cell.Addr.String(), prefix) })
		if len(b.Changes) > 0 || b.Snapshot {
			if err := printBatch(runapi.BatchOf(b), asJSON); err != nil {
				return err
			}
		}
		if b.Version >= end {
			return nil
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("the watch ended before version %d", end)
}

// matchesNothing is the error of a watch or ls whose PREFIX matches no
// cell; lookupErr, the error of looking it up as a cell address, says
// which patterns and cells there are.
func matchesNothing(prefix string, lookupErr error) error {
	msg := fmt.Sprintf("no cell or pattern matches %q (write a pattern name, a cell name, pattern/name, or whole leading segments of full addresses space/pattern/name; `cellbox cell ls` lists them all)", prefix)
	if lookupErr != nil {
		return fmt.Errorf("%s: %w", msg, lookupErr)
	}
	return errors.New(msg)
}

// jsonArg reads a JSON value argument ("-": from stdin).
func jsonArg(s string) (json.RawMessage, error) {
	b := []byte(s)
	if s == "-" {
		var err error
		if b, err = io.ReadAll(os.Stdin); err != nil {
			return nil, fmt.Errorf("read the value from stdin: %w", err)
		}
	}
	if err := runapi.CheckJSON(b); err != nil {
		return nil, fmt.Errorf("the value is not JSON: %w", err)
	}
	return b, nil
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printCell prints a cell's value (indented JSON), or with asJSON its
// record; a cell in error says so on stderr.
func printCell(c runapi.Cell, asJSON bool) error {
	if asJSON {
		return printJSON(c)
	}
	if c.Error != "" {
		fmt.Fprintf(os.Stderr, "%s has an error (its value is the last good one): %s\n", c.Address, oneLine(c.Error))
	}
	return printJSON(c.Value)
}

func printList(l runapi.CellList, asJSON bool) error {
	if asJSON {
		return printJSON(l)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	for _, c := range l.Cells {
		v := short(c.Value, 100)
		switch {
		case c.Stream:
			v = "(stream)"
		case c.Error != "":
			v = "error: " + oneLine(c.Error)
		}
		fmt.Fprintf(tw, "%s\t%s\n", c.Address, v)
	}
	return tw.Flush()
}

// printBatch prints a batch, one line per change: the version, the address
// and the value (or event, error, deletion); with asJSON the batch as one
// JSON line.
func printBatch(b runapi.Batch, asJSON bool) error {
	if asJSON {
		raw, err := json.Marshal(b)
		if err != nil {
			return err
		}
		_, err = fmt.Printf("%s\n", raw)
		return err
	}
	var sb strings.Builder
	for _, c := range b.Changes {
		fmt.Fprintf(&sb, "%d %s ", b.Version, c.Cell.Address)
		switch {
		case c.Deleted:
			sb.WriteString("deleted")
		case c.Event != nil:
			fmt.Fprintf(&sb, "<- event %d %s", c.Event.ID, printable(string(c.Event.Payload)))
		case c.Cell.Stream:
			sb.WriteString("(stream)")
		case c.Cell.Error != "":
			fmt.Fprintf(&sb, "error: %s", oneLine(c.Cell.Error))
		default:
			fmt.Fprintf(&sb, "= %s", printable(string(c.Cell.Value)))
		}
		sb.WriteString("\n")
	}
	_, err := os.Stdout.WriteString(sb.String())
	return err
}
