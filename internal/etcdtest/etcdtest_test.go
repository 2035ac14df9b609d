package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestCluster runs the Go client (v3.6) against the etcd server (3.4): a
// Put/Get, a Txn, a lease and a watch; then the leader is killed, another is
// elected and the data is still there, and the killed member, restarted,
// catches up.
func TestCluster(t *testing.T) {
	t0 := time.Now()
	c := Start(t, 3)
	t.Logf("Start(3 members) took %v", time.Since(t0).Round(time.Millisecond))
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	if _, err := cli.Put(ctx, "k", "v1"); err != nil {
		t.Fatalf("put: %v", err)
	}
	mustGet(ctx, t, cli, "k", "v1")

	// A transaction guarded by what it read.
	txn, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Value("k"), "=", "v1"), clientv3.Compare(clientv3.Version("k2"), "=", 0)).
		Then(clientv3.OpPut("k", "v2"), clientv3.OpPut("k2", "x")).
		Else(clientv3.OpGet("k")).
		Commit()
	if err != nil || !txn.Succeeded {
		t.Fatalf("txn: %v, succeeded %v", err, txn != nil && txn.Succeeded)
	}
	txn, err = cli.Txn(ctx).If(clientv3.Compare(clientv3.Value("k"), "=", "v1")).Then(clientv3.OpPut("k", "no")).Commit()
	if err != nil || txn.Succeeded {
		t.Fatalf("txn on a stale value: %v, succeeded %v", err, txn != nil && txn.Succeeded)
	}
	mustGet(ctx, t, cli, "k", "v2")

	// The flags' limits: 4096 operations in a transaction (etcd's default is
	// 128) and 8 MiB in a request (1.5 MiB), what cellbox asks.
	var ops []clientv3.Op
	for i := range 1000 {
		ops = append(ops, clientv3.OpPut(fmt.Sprintf("many/%04d", i), "v"))
	}
	if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
		t.Fatalf("a txn of 1000 puts: %v", err)
	}
	if _, err := cli.Put(ctx, "big", strings.Repeat("b", 7<<20)); err != nil {
		t.Fatalf("a put of 7 MiB: %v", err)
	}
	if _, err := cli.Put(ctx, "huge", strings.Repeat("h", 8<<20+64<<10)); !errors.Is(err, rpctypes.ErrRequestTooLarge) {
		t.Fatalf("a put of 8 MiB + 64 KiB: %v, want %v", err, rpctypes.ErrRequestTooLarge)
	}

	// A lease, a key under it, and its revocation.
	lease, err := cli.Grant(ctx, 30)
	if err != nil {
		t.Fatalf("lease grant: %v", err)
	}
	if _, err := cli.Put(ctx, "leased", "y", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatalf("put with lease: %v", err)
	}
	ttl, err := cli.TimeToLive(ctx, lease.ID, clientv3.WithAttachedKeys())
	if err != nil || ttl.TTL <= 0 || len(ttl.Keys) != 1 || string(ttl.Keys[0]) != "leased" {
		t.Fatalf("lease time to live: %v %+v", err, ttl)
	}
	if _, err := cli.KeepAliveOnce(ctx, lease.ID); err != nil {
		t.Fatalf("lease keep-alive: %v", err)
	}

	// A watch sees a put and the deletion the revocation makes.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wch := cli.Watch(wctx, "w/", clientv3.WithPrefix(), clientv3.WithRev(txn.Header.Revision+1))
	if _, err := cli.Put(ctx, "w/a", "1", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatalf("put: %v", err)
	}
	if _, err := cli.Revoke(ctx, lease.ID); err != nil {
		t.Fatalf("lease revoke: %v", err)
	}
	var seen []string
	for len(seen) < 2 {
		select {
		case wr := <-wch:
			if err := wr.Err(); err != nil {
				t.Fatalf("watch: %v", err)
			}
			for _, ev := range wr.Events {
				seen = append(seen, fmt.Sprintf("%s %s", ev.Type, ev.Kv.Key))
			}
		case <-ctx.Done():
			t.Fatalf("watch: saw only %v", seen)
		}
	}
	if seen[0] != "PUT w/a" || seen[1] != "DELETE w/a" {
		t.Fatalf("watch saw %v", seen)
	}
	if r, err := cli.Get(ctx, "leased"); err != nil || len(r.Kvs) != 0 {
		t.Fatalf("a key of a revoked lease: %v %v", err, r)
	}

	// Kill the leader: another member is elected, and the data is there.
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.Member(leader).Kill()
	t1 := time.Now()
	next, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if next == leader {
		t.Fatalf("the leader is still member %d after it was killed", leader)
	}
	t.Logf("member %d killed; member %d leads after %v", leader, next, time.Since(t1).Round(time.Millisecond))
	mustGet(ctx, t, cli, "k", "v2")
	if _, err := cli.Put(ctx, "while-down", "z"); err != nil {
		t.Fatalf("put with a member down: %v", err)
	}

	// The killed member, restarted on its data dir, rejoins and catches up:
	// it serves on its own (a serializable read) what was written while it
	// was down.
	t2 := time.Now()
	c.Member(leader).Restart()
	one, err := clientv3.New(clientv3.Config{Endpoints: []string{c.Member(leader).Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	for {
		r, err := one.Get(ctx, "while-down", clientv3.WithSerializable())
		if err == nil && len(r.Kvs) == 1 && string(r.Kvs[0].Value) == "z" {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("restarted member %d does not have the write made while it was down: %v %v", leader, err, r)
		}
		time.Sleep(50 * time.Millisecond)
	}
	st, err := one.Status(ctx, c.Member(leader).Endpoint())
	if err != nil || st.Leader == 0 {
		t.Fatalf("restarted member's status: %v %+v", err, st)
	}
	members, err := cli.MemberList(ctx)
	if err != nil || len(members.Members) != 3 {
		t.Fatalf("member list: %v %+v", err, members)
	}
	t.Logf("member %d rejoined in %v (server %s, raft term %d)", leader, time.Since(t2).Round(time.Millisecond), st.Version, st.RaftTerm)
}

func mustGet(ctx context.Context, t *testing.T, cli *clientv3.Client, key, want string) {
	t.Helper()
	r, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	if len(r.Kvs) != 1 || string(r.Kvs[0].Value) != want {
		t.Fatalf("get %s: %v, want %q", key, r.Kvs, want)
	}
}

// fakeTB records how Start gives up.
type fakeTB struct {
	testing.TB
	fatal, skip string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (f *fakeTB) Skipf(format string, args ...any) {
	f.skip = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestNoEtcd: without an etcd binary, Start skips, and fails under CI.
func TestNoEtcd(t *testing.T) {
	saved := lookPath
	defer func() { lookPath = saved }()
	lookPath = func() (string, error) { return "", errors.New("not found") }
	run := func() *fakeTB {
		f := &fakeTB{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			Start(f, 1)
		}()
		<-done
		return f
	}

	t.Setenv("CI", "")
	if f := run(); f.fatal != "" || f.skip == "" {
		t.Errorf("without CI: fatal %q, skip %q; want a skip", f.fatal, f.skip)
	} else {
		t.Logf("without CI: skip %q", f.skip)
	}
	t.Setenv("CI", "1")
	if f := run(); f.fatal == "" || f.skip != "" {
		t.Errorf("under CI: fatal %q, skip %q; want a failure", f.fatal, f.skip)
	} else {
		t.Logf("under CI: fatal %q", f.fatal)
	}
}
