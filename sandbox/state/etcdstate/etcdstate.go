// Package etcdstate is the sandbox service's state (state.Store) on etcd:
// the sessions, boxes, snapshots and caps that several cellbox servers
// share.
//
// Layout, under a prefix (default "/cellbox/state/"):
//
//	PREFIX instance             the data's id (put once, if absent)
//	PREFIX r/KIND/KEY           a record; its revision is etcd's mod
//	                            revision, which no later write reuses
//	PREFIX c/LEN/COUNTER/HOLDER a reservation (LEN: the counter's bytes)
//
// A commit is one etcd transaction: its guards are compares of mod
// revisions (0: the key is missing), so it is atomic and checked at the
// server, as the contract asks. A commit's bytes are bounded by the etcd
// server's --max-request-bytes (1.5 MiB by default) and its ops by
// --max-txn-ops; past either the commit fails with an error saying so and
// writes nothing. The service's records are small (a snapshot manifest is
// the largest: a line per file).
package etcdstate

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellbox/cellbox/internal/etcdconn"
	"github.com/cellbox/cellbox/sandbox/state"
)

// DefaultPrefix is where Open keeps the state when given no prefix.
const DefaultPrefix = "/cellbox/state/"

// Store is a state.Store over an etcd client it does not own.
type Store struct {
	c      *clientv3.Client
	prefix string
	closed atomic.Bool
}

// Open returns the state under prefix ("" for DefaultPrefix) of c's
// cluster.
func Open(c *clientv3.Client, prefix string) *Store {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return &Store{c: c, prefix: prefix}
}

func (s *Store) begin(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return state.ErrClosed
	}
	return nil
}

func (s *Store) recordKey(kind state.Kind, key string) string {
	return s.prefix + "r/" + string(kind) + "/" + key
}

// counterKey is the prefix of counter's holders: its length first, so
// that no counter's keys are a prefix of another's.
func (s *Store) counterKey(counter string) string {
	return s.prefix + "c/" + strconv.Itoa(len(counter)) + "/" + counter + "/"
}

func fail(what string, err error) error { return etcdconn.Explain(what, err) }

// Instance implements state.Store: the first server to ask puts a random
// id if there is none; every server reads the one that won.
func (s *Store) Instance(ctx context.Context) (string, error) {
	if err := s.begin(ctx); err != nil {
		return "", err
	}
	b := make([]byte, 6)
	rand.Read(b)
	key := s.prefix + "instance"
	resp, err := s.c.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, hex.EncodeToString(b))).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return "", fail("read the instance id", err)
	}
	if resp.Succeeded {
		return hex.EncodeToString(b), nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 || len(kvs[0].Value) == 0 {
		return "", fmt.Errorf("etcd: %s is empty: the state under %s is damaged", key, s.prefix)
	}
	return string(kvs[0].Value), nil
}

// Get implements state.Store.
func (s *Store) Get(ctx context.Context, kind state.Kind, key string) (state.Record, error) {
	if err := s.begin(ctx); err != nil {
		return state.Record{}, err
	}
	if err := kind.Check(); err != nil {
		return state.Record{}, err
	}
	if err := state.CheckKey("key", key); err != nil {
		return state.Record{}, err
	}
	resp, err := s.c.Get(ctx, s.recordKey(kind, key))
	if err != nil {
		return state.Record{}, fail("get", err)
	}
	if len(resp.Kvs) == 0 {
		return state.Record{}, fmt.Errorf("%s %q: %w", kind, key, state.ErrNotFound)
	}
	kv := resp.Kvs[0]
	return state.Record{Key: key, Value: value(kv.Value), Revision: uint64(kv.ModRevision)}, nil
}

func value(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// List implements state.Store: one range read is one revision of the
// cluster, so the list is as of one moment.
func (s *Store) List(ctx context.Context, kind state.Kind, prefix string) ([]state.Record, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	if err := kind.Check(); err != nil {
		return nil, err
	}
	base := s.recordKey(kind, "")
	resp, err := s.c.Get(ctx, base+prefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, fail("list", err)
	}
	out := make([]state.Record, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out = append(out, state.Record{Key: string(kv.Key[len(base):]), Value: value(kv.Value), Revision: uint64(kv.ModRevision)})
	}
	return out, nil
}

// Commit implements state.Store.
func (s *Store) Commit(ctx context.Context, ops ...state.Op) (uint64, error) {
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	if err := state.CheckOps(ops); err != nil {
		return 0, err
	}
	if len(ops) == 0 {
		return 0, nil
	}
	var cmps []clientv3.Cmp
	var then []clientv3.Op
	for _, op := range ops {
		k := s.recordKey(op.Kind, op.Key)
		if op.Guard {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", int64(op.Revision)))
		}
		if op.Delete {
			then = append(then, clientv3.OpDelete(k))
		} else {
			then = append(then, clientv3.OpPut(k, string(op.Value)))
		}
	}
	fences := state.FencesOf(ctx)
	var orElse []clientv3.Op
	for _, f := range fences {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(f.Key), "=", f.Rev))
		orElse = append(orElse, clientv3.OpGet(f.Key, clientv3.WithKeysOnly()))
	}
	resp, err := s.c.Txn(ctx).If(cmps...).Then(then...).Else(orElse...).Commit()
	if err != nil {
		return 0, fail(fmt.Sprintf("commit of %d ops", len(ops)), err)
	}
	if !resp.Succeeded {
		for i, f := range fences {
			if kvs := resp.Responses[i].GetResponseRange().Kvs; len(kvs) == 0 || kvs[0].CreateRevision != f.Rev {
				return 0, fmt.Errorf("commit of %d ops: %s: %w", len(ops), f.Key, state.ErrFenced)
			}
		}
		return 0, fmt.Errorf("commit of %d ops: a guarded record has another revision: %w", len(ops), state.ErrConflict)
	}
	return uint64(resp.Header.Revision), nil
}

// Reserve implements state.Store: it reads the holders and puts its own
// guarded by them (no holder added since the read, its own key still
// missing), reading again when another reservation came between. A
// release since the read only makes the count it checked high, never low.
func (s *Store) Reserve(ctx context.Context, counter, holder string, limit int) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	if err := state.CheckKey("counter", counter); err != nil {
		return err
	}
	if err := state.CheckKey("holder", holder); err != nil {
		return err
	}
	base := s.counterKey(counter)
	mine := base + holder
	for {
		resp, err := s.c.Get(ctx, base, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return fail("reserve", err)
		}
		for _, kv := range resp.Kvs {
			if string(kv.Key) == mine {
				return nil
			}
		}
		if len(resp.Kvs) >= limit {
			return fmt.Errorf("%s holds %d of %d: %w", counter, len(resp.Kvs), limit, state.ErrLimit)
		}
		rev := resp.Header.Revision
		cmp := clientv3.Compare(clientv3.ModRevision(base), "<", rev+1).WithRange(clientv3.GetPrefixRangeEnd(base))
		tr, err := s.c.Txn(ctx).If(cmp).Then(clientv3.OpPut(mine, "")).Commit()
		if err != nil {
			return fail("reserve", err)
		}
		if tr.Succeeded {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// Release implements state.Store.
func (s *Store) Release(ctx context.Context, counter, holder string) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	if err := state.CheckKey("counter", counter); err != nil {
		return err
	}
	if err := state.CheckKey("holder", holder); err != nil {
		return err
	}
	if _, err := s.c.Delete(ctx, s.counterKey(counter)+holder); err != nil {
		return fail("release", err)
	}
	return nil
}

// Holders implements state.Store.
func (s *Store) Holders(ctx context.Context, counter string) ([]string, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	if err := state.CheckKey("counter", counter); err != nil {
		return nil, err
	}
	base := s.counterKey(counter)
	resp, err := s.c.Get(ctx, base, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, fail("holders", err)
	}
	out := make([]string, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out = append(out, strings.TrimPrefix(string(kv.Key), base))
	}
	return out, nil
}

// Close implements state.Store: later calls fail; the client stays open.
func (s *Store) Close() error {
	s.closed.Store(true)
	return nil
}
