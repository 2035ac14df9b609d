// Package etcdlease is a lease.Leaser on etcd's leases, for several
// cellbox servers that share one etcd cluster.
//
// A lease on NAME is the key PREFIX NAME (default prefix
// "/cellbox/leases/"), holding the holder's name, attached to an etcd
// lease of the time to live: etcd deletes the key when its lease expires
// unrenewed, by the cluster's clock, whichever server asks. The key is
// created only where none is (a transaction compares its create revision
// with 0), so one holder wins; the Token is the key's create revision,
// which grows each time the name changes hands and stays while its holder
// renews.
//
// etcd rounds a time to live up to whole seconds and to its own least
// (1.5 election timeouts: 2 s on a default cluster); the Lease returned
// says what was granted.
//
// Each name has an etcd lease of its own (so that a name its holder stops
// renewing expires alone), granted ahead: Acquire takes a spare lease
// granted for the same time to live when one is fresh (granted less than
// a fifth of it ago), and grants the next spare off the caller's path, so
// that taking a free name is one round trip when names are taken one
// after another (sessions made in a row), two when the spare had gone
// stale. A spare left unused expires by itself (it holds no key).
package etcdlease

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellbox/cellbox/sandbox/lease"
)

// DefaultPrefix is where New keeps the leases when given no prefix.
const DefaultPrefix = "/cellbox/leases/"

// Leaser grants leases on an etcd client it does not own.
type Leaser struct {
	c      *clientv3.Client
	prefix string

	mu        sync.Mutex
	spares    map[int64]grant // by time to live asked, in seconds
	refilling map[int64]bool
}

// grant is an etcd lease granted, with when it was asked for (its
// expiry counts from then, at the latest).
type grant struct {
	id    clientv3.LeaseID
	ttl   int64 // as granted, seconds
	start time.Time
}

// fresh says whether g has at least four fifths of its time to live left.
func (g grant) fresh() bool {
	return time.Since(g.start) < time.Duration(g.ttl)*time.Second/5
}

// New returns the Leaser of the names under prefix ("" for
// DefaultPrefix) of c's cluster.
func New(c *clientv3.Client, prefix string) *Leaser {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return &Leaser{c: c, prefix: prefix, spares: map[int64]grant{}, refilling: map[int64]bool{}}
}

// spareGrantTimeout bounds granting a spare in the background.
const spareGrantTimeout = 10 * time.Second

// grant returns an etcd lease of secs seconds: the spare when it is fresh,
// else a new grant.
func (l *Leaser) grant(ctx context.Context, secs int64) (grant, error) {
	l.mu.Lock()
	sp, ok := l.spares[secs]
	delete(l.spares, secs)
	l.mu.Unlock()
	if ok && sp.fresh() {
		return sp, nil
	}
	if ok { // stale: given back
		go l.c.Revoke(context.WithoutCancel(ctx), sp.id)
	}
	return l.grantNow(ctx, secs)
}

func (l *Leaser) grantNow(ctx context.Context, secs int64) (grant, error) {
	start := time.Now()
	g, err := l.c.Grant(ctx, secs)
	if err != nil {
		return grant{}, err
	}
	return grant{id: g.ID, ttl: g.TTL, start: start}, nil
}

// refill grants a spare of secs seconds in the background, unless one is
// there or on its way.
func (l *Leaser) refill(secs int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.spares[secs]; ok || l.refilling[secs] {
		return
	}
	l.refilling[secs] = true
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), spareGrantTimeout)
		defer cancel()
		g, err := l.grantNow(ctx, secs)
		l.mu.Lock()
		delete(l.refilling, secs)
		l.mu.Unlock()
		if err == nil {
			l.giveBack(ctx, secs, g)
		}
	}()
}

// giveBack keeps g, unused, as the spare of secs seconds if it is fresh
// and none is there; otherwise it is revoked (it would expire by itself).
func (l *Leaser) giveBack(ctx context.Context, secs int64, g grant) {
	l.mu.Lock()
	_, have := l.spares[secs]
	keep := !have && g.fresh()
	if keep {
		l.spares[secs] = g
	}
	l.mu.Unlock()
	if !keep {
		go l.c.Revoke(context.WithoutCancel(ctx), g.id)
	}
}

// Key is the etcd key of name's lease.
func (l *Leaser) Key(name string) string { return l.prefix + name }

// FenceKey implements lease.Fencer: a commit fenced by name's lease
// compares this key's create revision with the lease's Token.
func (l *Leaser) FenceKey(name string) string { return l.Key(name) }

// Acquire implements lease.Leaser.
func (l *Leaser) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (lease.Lease, error) {
	if name == "" || holder == "" {
		return lease.Lease{}, errors.New("lease: a name and a holder are needed")
	}
	if ttl <= 0 {
		return lease.Lease{}, fmt.Errorf("lease %s: ttl %s: want a positive time to live", name, ttl)
	}
	key := l.Key(name)
	secs := int64(math.Ceil(ttl.Seconds()))
	// A grant (a spare, most often: see the package comment), then a
	// transaction that creates the key where none is and reads it
	// otherwise. The next spare is granted once this is done, so that its
	// grant does not compete with the transaction.
	defer l.refill(secs)
	for {
		g, err := l.grant(ctx, secs)
		if err != nil {
			return lease.Lease{}, fmt.Errorf("lease %s: etcd grant: %w", name, err)
		}
		tr, err := l.c.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, holder, clientv3.WithLease(g.id))).
			Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			// Perhaps attached: given back off the caller's path (it
			// would expire by itself).
			go l.c.Revoke(context.WithoutCancel(ctx), g.id)
			return lease.Lease{}, fmt.Errorf("lease %s: etcd: %w", name, err)
		}
		if tr.Succeeded {
			granted := time.Duration(g.ttl) * time.Second
			return lease.Lease{Name: name, Holder: holder, Token: uint64(tr.Header.Revision), ID: int64(g.id),
				TTL: granted, Expires: g.start.Add(granted)}, nil
		}
		l.giveBack(ctx, secs, g) // not attached: the next Acquire's
		kvs := tr.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			continue // gone since the compare: try again
		}
		kv := kvs[0]
		if string(kv.Value) != holder {
			return lease.Lease{}, fmt.Errorf("lease %s: %w: %s", name, lease.ErrHeld, kv.Value)
		}
		// Acquiring what one holds renews it.
		cur := lease.Lease{Name: name, Holder: holder, Token: uint64(kv.CreateRevision), ID: kv.Lease, TTL: ttl}
		nl, err := l.Renew(ctx, cur)
		if errors.Is(err, lease.ErrLost) {
			continue // it expired between the read and the renewal: take it anew
		}
		return nl, err
	}
}

// Renew implements lease.Leaser: it keeps the etcd lease alive, then
// checks the key is still this holder's (the same create revision).
func (l *Leaser) Renew(ctx context.Context, le lease.Lease) (lease.Lease, error) {
	start := time.Now()
	ka, err := l.c.KeepAliveOnce(ctx, clientv3.LeaseID(le.ID))
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return lease.Lease{}, fmt.Errorf("lease %s of %s: %w", le.Name, le.Holder, lease.ErrLost)
	}
	if err != nil {
		return lease.Lease{}, fmt.Errorf("lease %s: etcd keepalive: %w", le.Name, err)
	}
	resp, err := l.c.Get(ctx, l.Key(le.Name))
	if err != nil {
		return lease.Lease{}, fmt.Errorf("lease %s: etcd: %w", le.Name, err)
	}
	if len(resp.Kvs) == 0 || uint64(resp.Kvs[0].CreateRevision) != le.Token || resp.Kvs[0].Lease != le.ID {
		return lease.Lease{}, fmt.Errorf("lease %s of %s: %w", le.Name, le.Holder, lease.ErrLost)
	}
	le.TTL = time.Duration(ka.TTL) * time.Second
	le.Expires = start.Add(le.TTL)
	return le, nil
}

// Release implements lease.Leaser: revoking the etcd lease deletes the
// key with it (and only a key of this lease).
func (l *Leaser) Release(ctx context.Context, le lease.Lease) error {
	if le.ID == 0 {
		return nil
	}
	_, err := l.c.Revoke(ctx, clientv3.LeaseID(le.ID))
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("lease %s: etcd revoke: %w", le.Name, err)
	}
	return nil
}

// Holder implements lease.Leaser.
func (l *Leaser) Holder(ctx context.Context, name string) (string, error) {
	resp, err := l.c.Get(ctx, l.Key(name))
	if err != nil {
		return "", fmt.Errorf("lease %s: etcd: %w", name, err)
	}
	if len(resp.Kvs) == 0 {
		return "", nil
	}
	return string(resp.Kvs[0].Value), nil
}
