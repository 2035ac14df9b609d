package sandbox

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/cellbox/cellbox/sandbox/api"
)

// schemaVersion is the version of the records in the state file. A file
// written by a newer cellbox is refused rather than misread.
const schemaVersion = 1

var (
	bucketMeta     = []byte("meta")
	bucketSessions = []byte("sessions")
	bucketBoxes    = []byte("boxes")
	keySchema      = []byte("schema")
	keyInstance    = []byte("instance")
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

// store keeps sessions and boxes in one bbolt file: the data dir's own,
// or one the caller shares (Config.DB) with the cell store.
type store struct {
	db       *bolt.DB
	owned    bool   // opened here, so closed here
	instance string // random id of this data dir; labels its backend boxes
}

func openStore(path string, shared *bolt.DB) (*store, error) {
	db, owned := shared, false
	if db == nil {
		var err error
		db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
		if err != nil {
			return nil, fmt.Errorf("open state file %s: %w (is another cellbox serve or run using this data dir?)", path, err)
		}
		owned = true
	}
	st := &store{db: db, owned: owned}
	err := db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketMeta, bucketSessions, bucketBoxes} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		if v := meta.Get(keySchema); v != nil {
			n, err := strconv.Atoi(string(v))
			if err != nil || n > schemaVersion {
				return fmt.Errorf("state file has schema version %q; this cellbox understands up to %d (upgrade cellbox)", v, schemaVersion)
			}
		} else if err := meta.Put(keySchema, []byte(strconv.Itoa(schemaVersion))); err != nil {
			return err
		}
		if v := meta.Get(keyInstance); v != nil {
			st.instance = string(v)
			return nil
		}
		st.instance = randomID(6)
		return meta.Put(keyInstance, []byte(st.instance))
	})
	if err != nil {
		st.close()
		return nil, fmt.Errorf("init state file %s: %w", db.Path(), err)
	}
	return st, nil
}

func (st *store) close() error {
	if !st.owned {
		return nil
	}
	return st.db.Close()
}

// load returns every stored session and box.
func (st *store) load() ([]sessionRecord, []boxRecord, error) {
	var sessions []sessionRecord
	var boxes []boxRecord
	err := st.db.View(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketSessions).ForEach(func(k, v []byte) error {
			var r sessionRecord
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("session %s: %w", k, err)
			}
			sessions = append(sessions, r)
			return nil
		}); err != nil {
			return err
		}
		return tx.Bucket(bucketBoxes).ForEach(func(k, v []byte) error {
			var r boxRecord
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("box %s: %w", k, err)
			}
			boxes = append(boxes, r)
			return nil
		})
	})
	if err != nil {
		return nil, nil, fmt.Errorf("load state: %w", err)
	}
	return sessions, boxes, nil
}

// change is one write of a batch: a record to put, or a key to delete.
type change struct {
	session    *sessionRecord
	box        *boxRecord
	delSession string
	delBox     string
}

// apply writes changes in one transaction.
func (st *store) apply(changes ...change) error {
	changes = slices.DeleteFunc(changes, func(c change) bool { return c.box != nil && c.box.OneShot })
	if len(changes) == 0 {
		return nil // no commit (and its sync) for nothing
	}
	return st.db.Update(func(tx *bolt.Tx) error {
		sb, bb := tx.Bucket(bucketSessions), tx.Bucket(bucketBoxes)
		for _, c := range changes {
			var err error
			switch {
			case c.session != nil:
				err = putJSON(sb, c.session.ID, c.session)
			case c.box != nil:
				err = putJSON(bb, c.box.ID, c.box)
			case c.delSession != "":
				err = sb.Delete([]byte(c.delSession))
			case c.delBox != "":
				err = bb.Delete([]byte(c.delBox))
			}
			if err != nil {
				return fmt.Errorf("write state: %w", err)
			}
		}
		return nil
	})
}

func putJSON(b *bolt.Bucket, key string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put([]byte(key), data)
}

// randomID returns n random bytes as hex.
func randomID(n int) string {
	b := make([]byte, n)
	rand.Read(b) // never fails (crypto/rand panics on failure)
	return hex.EncodeToString(b)
}
