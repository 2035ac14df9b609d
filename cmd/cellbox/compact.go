package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/server"
)

func init() {
	register(command{
		name:  "compact",
		usage: "[--data DIR]  shrink the data dir's state file (DATA/cellbox.db) to what it holds; refused while a run or serve uses the data dir",
		run:   runCompact,
	})
}

// compactTxSize is how much one transaction of the copy writes: bounds the
// memory a compaction uses.
const compactTxSize = 64 << 20

// runCompact copies DATA/cellbox.db into a fresh file and swaps it in.
// bbolt reuses the pages of deleted data but never gives them back to the
// file system: a file that once held a big memo cache or history stays
// that big. The copy holds only what is live.
func runCompact(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("compact", flag.ContinueOnError)
	data := fs.String("data", server.DefaultDataDir(), "data directory whose state file to compact")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return fmt.Errorf("want no arguments, got %d (the data dir is --data DIR)", len(pos))
	}
	before, after, err := compactState(*data)
	if err != nil {
		return err
	}
	fmt.Printf("compacted %s: %s -> %s\n", filepath.Join(*data, sandbox.StateFile), humanBytes(before), humanBytes(after))
	return nil
}

// compactState compacts DATA/cellbox.db and returns its sizes before and
// after. It holds the file's lock from start to swap, so no run or serve
// can open it meanwhile, and it refuses when one holds it.
func compactState(dataDir string) (before, after int64, err error) {
	path := filepath.Join(dataDir, sandbox.StateFile)
	st, err := os.Stat(path)
	if err != nil {
		return 0, 0, fmt.Errorf("compact %s: %w", path, err)
	}
	src, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if errors.Is(err, bolt.ErrTimeout) {
		return 0, 0, fmt.Errorf("data dir %s is in use: a cellbox run or serve holds %s (stop it, then compact)", dataDir, path)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("open %s: %w", path, err)
	}
	defer src.Close() // after the swap: the lock is held until then
	tmp := path + ".compact"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, 0, fmt.Errorf("remove a leftover %s: %w", tmp, err)
	}
	dst, err := bolt.Open(tmp, st.Mode().Perm(), nil)
	if err != nil {
		return 0, 0, fmt.Errorf("create %s: %w", tmp, err)
	}
	if err := bolt.Compact(dst, src, compactTxSize); err != nil {
		dst.Close()
		os.Remove(tmp)
		return 0, 0, fmt.Errorf("compact %s into %s: %w", path, tmp, err)
	}
	if err := dst.Close(); err != nil {
		os.Remove(tmp)
		return 0, 0, fmt.Errorf("close %s: %w", tmp, err)
	}
	// The rename is atomic: a crash leaves either the old file or the new
	// one at path, never a half-written one.
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return 0, 0, fmt.Errorf("swap in the compacted file: %w", err)
	}
	if d, err := os.Open(dataDir); err == nil {
		d.Sync() // make the rename durable
		d.Close()
	}
	nst, err := os.Stat(path)
	if err != nil {
		return 0, 0, err
	}
	return st.Size(), nst.Size(), nil
}
