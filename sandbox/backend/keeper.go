package backend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cellbox/cellbox/internal/safe"
)

// Keeper holds the workspaces of stopped boxes for a backend whose boxes
// keep no disk while they do not run (kubernetes: Stop deletes the pod and
// frees its node, Start makes a pod on any node). Stop writes the
// workspace's tar stream (from the agent) to the Keeper; Start reads it
// back into the new box. A workspace is kept under its box id, replaced
// by the next Put, and deleted with the box.
type Keeper interface {
	// Put stores r, a tar stream, as box id's workspace, replacing what
	// was kept; on error what was kept before stays.
	Put(ctx context.Context, id string, r io.Reader) error
	// Get opens box id's kept workspace; none is an error wrapping
	// ErrNotFound.
	Get(ctx context.Context, id string) (io.ReadCloser, error)
	// Delete forgets box id's workspace; none is not an error.
	Delete(ctx context.Context, id string) error
}

// DirKeeper is a Keeper in a directory of this machine: one file a box,
// written to a temporary name and renamed into place, so that a process
// killed half way leaves the last whole copy. It suits one server; servers
// that share boxes need a Keeper they all reach.
type DirKeeper string

var _ Keeper = DirKeeper("")

func (d DirKeeper) path(id string) (string, error) {
	if err := ValidID(id); err != nil {
		return "", err
	}
	return filepath.Join(string(d), id+".tar"), nil
}

// Put writes id's workspace.
func (d DirKeeper) Put(ctx context.Context, id string, r io.Reader) error {
	p, err := d.path(id)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(string(d), 0o700); err != nil {
		return fmt.Errorf("keep workspace of %s: %w", id, err)
	}
	f, err := os.CreateTemp(string(d), ".part-*")
	if err != nil {
		return fmt.Errorf("keep workspace of %s: %w", id, err)
	}
	_, err = io.Copy(f, safe.ContextReader(ctx, r))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), p)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("keep workspace of %s: %w", id, err)
	}
	return nil
}

// Get opens id's workspace.
func (d DirKeeper) Get(_ context.Context, id string) (io.ReadCloser, error) {
	p, err := d.path(id)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no kept workspace of %s: %w", id, ErrNotFound)
	}
	return f, err
}

// Delete removes id's workspace.
func (d DirKeeper) Delete(_ context.Context, id string) error {
	p, err := d.path(id)
	if err != nil {
		return nil
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
