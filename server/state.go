package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/internal/jsonschema"
	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/state"
)

// State is a data directory's one bbolt file (DATA/cellbox.db), open:
// the cell store lives in it, and the sandbox service keeps its sessions,
// boxes and snapshot records in it too (sandbox.Config.State).
type State struct {
	Cells   cells.Store
	Sandbox state.Store
	db      *bolt.DB // one machine's file (nil when the state is shared)
	shared  Shared   // the shared state's (nil on one machine)
}

// OpenState opens (creating) DATA/cellbox.db; a file another process holds
// is a clear error: it is the lock that says which process owns the data
// directory. It makes the data directory's schema cache the process's
// (RememberSchemas).
func OpenState(dataDir string) (*State, error) {
	if err := prepareDataDir(dataDir); err != nil {
		return nil, err
	}
	path := filepath.Join(dataDir, sandbox.StateFile)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("data dir %s is in use: another cellbox run or serve holds %s (stop it, or use another --data)", dataDir, path)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	store, err := cells.OpenBoltDB(db, cells.Options{})
	if err != nil {
		db.Close()
		return nil, err
	}
	sandboxState, err := state.OpenBolt(context.Background(), db)
	if err != nil {
		store.Close()
		db.Close()
		return nil, err
	}
	return &State{Cells: store, Sandbox: sandboxState, db: db}, nil
}

// prepareDataDir makes dataDir if need be and its schema cache the
// process's: what opening a data dir's state does first, on one machine
// or shared.
func prepareDataDir(dataDir string) error {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	RememberSchemas(dataDir)
	return nil
}

// SchemaCacheFile, in the data dir, names the cell schemas that passed the
// JSON Schema metaschema, so that the next process over the directory
// compiles them without that check (jsonschema.RememberValid).
const SchemaCacheFile = "schemas.valid"

// RememberSchemas makes the schema cache of dataDir the process's: call it
// before a pattern's cell schemas compile.
func RememberSchemas(dataDir string) {
	jsonschema.RememberValid(filepath.Join(dataDir, SchemaCacheFile))
}

// Close closes the stores, then the file (or the etcd client).
func (d *State) Close() error {
	errs := []error{d.Sandbox.Close(), d.Cells.Close()}
	if d.db != nil {
		errs = append(errs, d.db.Close())
	}
	if d.shared != nil {
		errs = append(errs, d.shared.Close())
	}
	return errors.Join(errs...)
}
