// Package lease says which server may act on a named thing now: a pattern
// instance, the reaper, a warm pool. One holder at a time holds a lease on
// a name, for a time to live it renews; a holder that stops renewing (its
// process died, its network is cut off) loses it when it expires, and
// another may take it. In the style of litestream's Leaser.
//
// One machine has one process and needs no coordination: Local grants
// every lease at once, in memory. Several servers sharing state need a
// Leaser on the store they share (etcd's leases); every Leaser passes the
// suite of package leasetest.
//
// Acting on what one does not hold is the caller's to avoid: Keep renews a
// lease and says, through Held.Lost, when it is gone, before its time to
// live runs out, so that the holder stops acting before another may start
// (fencing). Token increases whenever a lease on a name changes hands, so
// a store that records it with a write can refuse the writes of an earlier
// holder.
package lease

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// ErrHeld is returned (wrapped, naming the holder) by Acquire of a name
// another holder's unexpired lease covers.
var ErrHeld = errors.New("held by another")

// ErrLost is returned (wrapped) by Renew of a lease that expired and was
// taken by another, or was released.
var ErrLost = errors.New("lease lost")

// Lease is a holder's right to act on a name until Expires.
type Lease struct {
	Name   string
	Holder string
	// Token increases each time the name's lease changes hands (never
	// when the same holder renews it).
	Token   uint64
	TTL     time.Duration
	Expires time.Time
	// ID is the Leaser's own handle of the lease (etcd's lease id); 0 for
	// Local.
	ID int64
}

// Leaser grants leases. Its methods are safe for concurrent use.
type Leaser interface {
	// Acquire gives holder the lease on name for ttl when no other holder
	// has an unexpired lease on it, and returns it; acquiring a name one
	// holds already renews it. Otherwise it returns an error wrapping
	// ErrHeld that names the holder.
	Acquire(ctx context.Context, name, holder string, ttl time.Duration) (Lease, error)
	// Renew extends l by its TTL from now. It fails with ErrLost when l
	// is no longer its holder's (expired and taken, or released).
	Renew(ctx context.Context, l Lease) (Lease, error)
	// Release gives l up at once; releasing a lease already lost is not
	// an error.
	Release(ctx context.Context, l Lease) error
	// Holder is the holder of name's unexpired lease, "" for none.
	Holder(ctx context.Context, name string) (string, error)
}

// Fencer is a Leaser whose leases a store it shares can check: FenceKey
// is the key of name's lease there, whose create revision is a lease's
// Token (cells.Fence).
type Fencer interface {
	FenceKey(name string) string
}

// Local is the Leaser of one process: leases in memory, expiring by this
// process's clock. It lets several holders contend (the suite's test of
// it does); a server on one machine is its only holder.
type Local struct {
	mu     sync.Mutex
	leases map[string]Lease
	tokens map[string]uint64
}

// NewLocal returns an empty Local.
func NewLocal() *Local {
	return &Local{leases: map[string]Lease{}, tokens: map[string]uint64{}}
}

func (l *Local) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (Lease, error) {
	if err := check(name, holder, ttl); err != nil {
		return Lease{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	cur, ok := l.leases[name]
	switch {
	case ok && cur.Holder == holder && now.Before(cur.Expires):
		cur.TTL, cur.Expires = ttl, now.Add(ttl)
		l.leases[name] = cur
		return cur, nil
	case ok && now.Before(cur.Expires):
		return Lease{}, fmt.Errorf("lease %s: %w: %s (until %s)", name, ErrHeld, cur.Holder, cur.Expires.Format(time.RFC3339Nano))
	}
	l.tokens[name]++
	nl := Lease{Name: name, Holder: holder, Token: l.tokens[name], TTL: ttl, Expires: now.Add(ttl)}
	l.leases[name] = nl
	return nl, nil
}

func (l *Local) Renew(ctx context.Context, le Lease) (Lease, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	cur, ok := l.leases[le.Name]
	now := time.Now()
	if !ok || cur.Token != le.Token || cur.Holder != le.Holder || !now.Before(cur.Expires) {
		return Lease{}, fmt.Errorf("lease %s of %s: %w", le.Name, le.Holder, ErrLost)
	}
	cur.Expires = now.Add(cur.TTL)
	l.leases[le.Name] = cur
	return cur, nil
}

func (l *Local) Release(ctx context.Context, le Lease) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if cur, ok := l.leases[le.Name]; ok && cur.Token == le.Token && cur.Holder == le.Holder {
		delete(l.leases, le.Name)
	}
	return nil
}

func (l *Local) Holder(ctx context.Context, name string) (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if cur, ok := l.leases[name]; ok && time.Now().Before(cur.Expires) {
		return cur.Holder, nil
	}
	return "", nil
}

// DefaultHolder names this process among the servers that share leases:
// host, pid and a random part (a restarted process is another holder).
func DefaultHolder() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	rand.Read(b)
	return fmt.Sprintf("%s/%d/%x", host, os.Getpid(), b)
}

// check refuses what no Leaser can grant.
func check(name, holder string, ttl time.Duration) error {
	switch {
	case name == "" || holder == "":
		return errors.New("lease: a name and a holder are needed")
	case ttl <= 0:
		return fmt.Errorf("lease %s: ttl %s: want a positive time to live", name, ttl)
	}
	return nil
}

// Held is a lease Keep keeps renewed.
type Held struct {
	l      Leaser
	lost   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	lease  Lease
}

// Keep acquires the lease on name for holder and renews it every third of
// ttl until Release or ctx's end. When a renewal fails and the lease runs
// out (or is lost to another), Lost is closed — before the lease's own
// expiry, so the holder stops acting before another may start. It returns
// Acquire's error (ErrHeld) when another holds the name.
func Keep(ctx context.Context, l Leaser, name, holder string, ttl time.Duration) (*Held, error) {
	le, err := l.Acquire(ctx, name, holder, ttl)
	if err != nil {
		return nil, err
	}
	kctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	h := &Held{l: l, lease: le, lost: make(chan struct{}), cancel: cancel, done: make(chan struct{})}
	go h.renew(kctx, ctx.Done())
	return h, nil
}

// renewMargin is how long before a lease's expiry a holder that could not
// renew it gives it up.
func renewMargin(ttl time.Duration) time.Duration { return ttl / 3 }

func (h *Held) renew(ctx context.Context, parent <-chan struct{}) {
	defer close(h.done)
	t := time.NewTicker(h.lease.TTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-parent:
			h.Release(context.Background())
			return
		case <-t.C:
		}
		h.mu.Lock()
		cur := h.lease
		h.mu.Unlock()
		rctx, cancel := context.WithDeadline(ctx, cur.Expires.Add(-renewMargin(cur.TTL)))
		nl, err := h.l.Renew(rctx, cur)
		cancel()
		switch {
		case err == nil:
			h.mu.Lock()
			h.lease = nl
			h.mu.Unlock()
		case errors.Is(err, ErrLost) || !time.Now().Before(cur.Expires.Add(-renewMargin(cur.TTL))):
			close(h.lost)
			return
		}
	}
}

// Lease is the lease as last renewed.
func (h *Held) Lease() Lease {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lease
}

// Lost is closed when the lease is gone: stop acting on its name.
func (h *Held) Lost() <-chan struct{} { return h.lost }

// Done is closed when the lease is no longer kept: lost, released, or its
// context ended.
func (h *Held) Done() <-chan struct{} { return h.done }

// Release stops renewing and gives the lease up.
func (h *Held) Release(ctx context.Context) error {
	h.cancel()
	select {
	case <-h.lost:
		return nil
	default:
	}
	return h.l.Release(ctx, h.Lease())
}
