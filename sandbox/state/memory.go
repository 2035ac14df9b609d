package state

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// NewMemory returns a store that keeps its records and reservations in
// memory until Close, for tests. It behaves as a remote store would: every
// value is copied in and out (no caller shares a byte with it, nor two
// callers with each other), revisions come from a counter, and its
// instance id is made at random by NewMemory. Nothing outlives Close.
func NewMemory() Store {
	return &memory{
		instance: newInstance(),
		records:  map[Kind]map[string]memRecord{},
		holders:  map[string]map[string]bool{},
	}
}

type memory struct {
	mu       sync.Mutex
	closed   bool
	instance string
	rev      uint64 // the last commit's revision
	records  map[Kind]map[string]memRecord
	holders  map[string]map[string]bool // counter -> holders
}

type memRecord struct {
	value []byte
	rev   uint64
}

// newInstance returns a random instance id: 6 random bytes in hex, as the
// sandbox service's data dirs have always had.
func newInstance() string {
	b := make([]byte, 6)
	rand.Read(b) // never fails (crypto/rand panics on failure)
	return hex.EncodeToString(b)
}

// clone copies b into a new slice, never nil.
func clone(b []byte) []byte { return append(make([]byte, 0, len(b)), b...) }

// begin locks the store for a call: it fails (unlocked) if ctx is done or
// the store closed.
func (m *memory) begin(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	return nil
}

func (m *memory) Instance(ctx context.Context) (string, error) {
	if err := m.begin(ctx); err != nil {
		return "", err
	}
	defer m.mu.Unlock()
	return m.instance, nil
}

func (m *memory) Get(ctx context.Context, kind Kind, key string) (Record, error) {
	if err := kind.Check(); err != nil {
		return Record{}, err
	}
	if err := CheckKey("key", key); err != nil {
		return Record{}, err
	}
	if err := m.begin(ctx); err != nil {
		return Record{}, err
	}
	defer m.mu.Unlock()
	r, ok := m.records[kind][key]
	if !ok {
		return Record{}, fmt.Errorf("%s %q: %w", kind, key, ErrNotFound)
	}
	return Record{Key: key, Value: clone(r.value), Revision: r.rev}, nil
}

func (m *memory) List(ctx context.Context, kind Kind, prefix string) ([]Record, error) {
	if err := kind.Check(); err != nil {
		return nil, err
	}
	if err := m.begin(ctx); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	out := []Record{}
	for k, r := range m.records[kind] {
		if strings.HasPrefix(k, prefix) {
			out = append(out, Record{Key: k, Value: clone(r.value), Revision: r.rev})
		}
	}
	slices.SortFunc(out, func(a, b Record) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

func (m *memory) Commit(ctx context.Context, ops ...Op) (uint64, error) {
	if err := CheckOps(ops); err != nil {
		return 0, err
	}
	if err := m.begin(ctx); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	if len(ops) == 0 {
		return 0, nil
	}
	for _, op := range ops {
		if !op.Guard {
			continue
		}
		if have := m.records[op.Kind][op.Key].rev; have != op.Revision {
			return 0, conflict(op, have)
		}
	}
	m.rev++
	for _, op := range ops {
		recs := m.records[op.Kind]
		if op.Delete {
			delete(recs, op.Key)
			continue
		}
		if recs == nil {
			recs = map[string]memRecord{}
			m.records[op.Kind] = recs
		}
		recs[op.Key] = memRecord{value: clone(op.Value), rev: m.rev}
	}
	return m.rev, nil
}

// conflict is the error of op's failed guard, the record having revision
// have (0: none).
func conflict(op Op, have uint64) error {
	return fmt.Errorf("%w: %s %q has revision %d, the commit expected %d", ErrConflict, op.Kind, op.Key, have, op.Revision)
}

func (m *memory) Reserve(ctx context.Context, counter, holder string, limit int) error {
	if err := checkReservation(counter, holder); err != nil {
		return err
	}
	if err := m.begin(ctx); err != nil {
		return err
	}
	defer m.mu.Unlock()
	hs := m.holders[counter]
	if hs[holder] {
		return nil
	}
	if len(hs) >= limit {
		return limitError(counter, len(hs), limit)
	}
	if hs == nil {
		hs = map[string]bool{}
		m.holders[counter] = hs
	}
	hs[holder] = true
	return nil
}

// checkReservation checks Reserve's and Release's names.
func checkReservation(counter, holder string) error {
	if err := CheckKey("counter", counter); err != nil {
		return err
	}
	return CheckKey("holder", holder)
}

// limitError is Reserve's error for a counter with have holders.
func limitError(counter string, have, limit int) error {
	return fmt.Errorf("%w: %q has %d holders, its limit is %d", ErrLimit, counter, have, limit)
}

func (m *memory) Release(ctx context.Context, counter, holder string) error {
	if err := checkReservation(counter, holder); err != nil {
		return err
	}
	if err := m.begin(ctx); err != nil {
		return err
	}
	defer m.mu.Unlock()
	delete(m.holders[counter], holder)
	if len(m.holders[counter]) == 0 {
		delete(m.holders, counter)
	}
	return nil
}

func (m *memory) Holders(ctx context.Context, counter string) ([]string, error) {
	if err := CheckKey("counter", counter); err != nil {
		return nil, err
	}
	if err := m.begin(ctx); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	out := []string{}
	for h := range m.holders[counter] {
		out = append(out, h)
	}
	slices.Sort(out)
	return out, nil
}

func (m *memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	m.records, m.holders = nil, nil
	return nil
}
