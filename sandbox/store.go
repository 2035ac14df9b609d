package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/state"
)

// sessionRecord is a session as stored.
type sessionRecord struct {
	ID        string            `json:"id"`
	TokenHash string            `json:"token_hash"` // hex SHA-256 of the bearer token
	Created   time.Time         `json:"created"`
	Boxes     map[string]string `json:"boxes"` // box name -> box id

	AllowedCommands []string        `json:"allowed_commands,omitempty"`
	Defaults        api.BoxDefaults `json:"defaults,omitzero"`
}

// boxRecord is a box as stored. The store, not the backend labels, says who
// owns a box.
type boxRecord struct {
	ID      string            `json:"id"`
	Session string            `json:"session,omitempty"` // owner; "" for a shared box
	Shared  bool              `json:"shared,omitempty"`
	Image   string            `json:"image"`
	Env     map[string]string `json:"env,omitempty"`
	Limits  api.Limits        `json:"limits"`
	Network bool              `json:"network,omitempty"` // full network
	// Egress is the allow list of a box without a full network (nil:
	// none), with header values: the state file is the host's (0600).
	Egress       *api.NetworkRules `json:"egress,omitempty"`
	SleepAfterMs int64             `json:"sleep_after_ms"`
	// WorkspaceDir is the box's working directory ("": /workspace).
	WorkspaceDir   string    `json:"workspace_dir,omitempty"`
	DestroyOnClose bool      `json:"destroy_on_close,omitempty"`
	Created        time.Time `json:"created"`
	LastUsed       time.Time `json:"last_used"`
	// Gone is set when the backend lost the box; it is recreated (empty) on
	// next use.
	Gone     bool           `json:"gone,omitempty"`
	Previews map[int]string `json:"previews,omitempty"` // port -> preview id
	// OneShot marks a box that lives for one run (Config.OneShot): its
	// record is never stored.
	OneShot bool `json:"-"`
}

// store keeps sessions and boxes in a state.Store: the one the caller
// gives (Config.State), or one over the data dir's own bbolt file. Records
// are JSON, under their ids. The service keeps its maps as the working
// copy and writes every change through, unguarded: it is the store's only
// writer — of a session's records, the server that holds its lease, and
// fences says so (servers sharing the state: a server that lost the lease
// writes nothing more of the session).
type store struct {
	st       state.Store
	db       *bolt.DB // the file opened here (no Config.State), closed by close
	instance string   // random id of the data; labels its backend boxes
	// fences returns the fences of a commit of the records of sessions
	// (nil: none).
	fences func(sessions []string) []state.Fence
}

// openStore returns the store over shared, or (shared nil) over a bbolt
// file at path, opened here and closed by close.
func openStore(ctx context.Context, path string, shared state.Store) (*store, error) {
	if shared != nil {
		return newStore(ctx, shared, nil)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open state file %s: %w (is another cellbox serve or run using this data dir?)", path, err)
	}
	st, err := state.OpenBolt(ctx, db)
	if err != nil {
		db.Close()
		return nil, err
	}
	return newStore(ctx, st, db)
}

func newStore(ctx context.Context, st state.Store, db *bolt.DB) (*store, error) {
	s := &store{st: st, db: db}
	var err error
	if s.instance, err = st.Instance(ctx); err != nil {
		s.close()
		return nil, fmt.Errorf("state: %w", err)
	}
	return s, nil
}

// close closes the state store and file opened here; a Config.State is
// its giver's to close.
func (s *store) close() error {
	if s.db == nil {
		return nil
	}
	return errors.Join(s.st.Close(), s.db.Close())
}

// load returns every stored session and box.
func (s *store) load() ([]sessionRecord, []boxRecord, error) {
	ctx := context.Background()
	sessions, err := loadJSON[sessionRecord](ctx, s.st, state.Sessions)
	if err != nil {
		return nil, nil, fmt.Errorf("load state: %w", err)
	}
	boxes, err := loadJSON[boxRecord](ctx, s.st, state.Boxes)
	if err != nil {
		return nil, nil, fmt.Errorf("load state: %w", err)
	}
	return sessions, boxes, nil
}

// loadJSON returns every record of kind, decoded.
func loadJSON[T any](ctx context.Context, st state.Store, kind state.Kind) ([]T, error) {
	rs, err := st.List(ctx, kind, "")
	if err != nil {
		return nil, err
	}
	out := make([]T, 0, len(rs))
	for _, r := range rs {
		var v T
		if err := json.Unmarshal(r.Value, &v); err != nil {
			return nil, fmt.Errorf("%s %s: %w", kind, r.Key, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// change is one write of a batch: a record to put, or a key to delete.
type change struct {
	session    *sessionRecord
	box        *boxRecord
	delSession string
	delBox     string
	owner      string // delBox's session, "" for a box of none
}

// sessionOf is the session whose record c writes or whose box it is ("":
// a shared box, an orphan).
func (c change) sessionOf() string {
	switch {
	case c.session != nil:
		return c.session.ID
	case c.box != nil:
		return c.box.Session
	case c.delSession != "":
		return c.delSession
	}
	return c.owner
}

// apply writes changes in one commit. It is not cancelled: the caller's
// maps have changed already, and the store must not fall behind them.
func (s *store) apply(changes ...change) error {
	changes = slices.DeleteFunc(changes, func(c change) bool { return c.box != nil && c.box.OneShot })
	if len(changes) == 0 {
		return nil // no commit (and its sync) for nothing
	}
	ops := make([]state.Op, 0, len(changes))
	for _, c := range changes {
		var op state.Op
		var err error
		switch {
		case c.session != nil:
			op, err = putJSON(state.Sessions, c.session.ID, c.session)
		case c.box != nil:
			op, err = putJSON(state.Boxes, c.box.ID, c.box)
		case c.delSession != "":
			op = state.Delete(state.Sessions, c.delSession)
		case c.delBox != "":
			op = state.Delete(state.Boxes, c.delBox)
		default:
			continue
		}
		if err != nil {
			return fmt.Errorf("write state: %w", err)
		}
		ops = append(ops, op)
	}
	ctx := context.Background()
	if s.fences != nil {
		sessions := make([]string, 0, len(changes))
		for _, c := range changes {
			if id := c.sessionOf(); id != "" {
				sessions = append(sessions, id)
			}
		}
		ctx = state.WithFences(ctx, s.fences(sessions)...)
	}
	_, err := s.st.Commit(ctx, lastWins(ops)...)
	return err
}

// lastWins keeps the last op of each record: a batch may write one record
// twice (a box's record after its session's change), where a commit names
// each once.
func lastWins(ops []state.Op) []state.Op {
	type name struct {
		kind state.Kind
		key  string
	}
	last := make(map[name]int, len(ops))
	for i, op := range ops {
		last[name{op.Kind, op.Key}] = i
	}
	if len(last) == len(ops) {
		return ops
	}
	out := ops[:0:0]
	for i, op := range ops {
		if last[name{op.Kind, op.Key}] == i {
			out = append(out, op)
		}
	}
	return out
}

// putJSON is the put of v, as JSON, at key of kind.
func putJSON(kind state.Kind, key string, v any) (state.Op, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return state.Op{}, err
	}
	return state.Put(kind, key, data), nil
}

// randomID returns n random bytes as hex.
func randomID(n int) string {
	b := make([]byte, n)
	rand.Read(b) // never fails (crypto/rand panics on failure)
	return hex.EncodeToString(b)
}
