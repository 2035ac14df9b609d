// Package etcdtest starts a real etcd cluster for Go tests: each member is an
// etcd child process (Debian's etcd-server, 3.4, which `bash scripts/setup.sh`
// installs) on 127.0.0.1 with free ports and a data dir under t.TempDir().
// It is the test face of internal/etcdproc, which starts and stops the
// processes (and which a program, not a test, uses instead: cellbox-bench).
//
// Without an etcd binary a test is skipped, or fails when the environment
// variable CI is set. Members are killed when the test ends; when it failed,
// the tail of each member's log is printed.
package etcdtest

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellbox/cellbox/internal/etcdconn"
	"github.com/cellbox/cellbox/internal/etcdproc"
)

// Option changes how Start runs the members (etcdproc's options).
type Option = etcdproc.Option

// WithMaxTxnOps sets --max-txn-ops (4096 by default; etcd's own is 128).
func WithMaxTxnOps(n int) Option { return etcdproc.WithMaxTxnOps(n) }

// WithMaxRequestBytes sets --max-request-bytes (etcdconn.MaxRequestBytes, 8 MiB, by default; etcd's own
// is 1.5 MiB).
func WithMaxRequestBytes(n int) Option { return etcdproc.WithMaxRequestBytes(n) }

// WithLogLevel sets --log-level of the members' logs: debug, info, warn,
// error (the default), panic or fatal.
func WithLogLevel(level string) Option { return etcdproc.WithLogLevel(level) }

// WithTimeout sets how long Start and Restart wait for members to answer
// (30 s by default).
func WithTimeout(d time.Duration) Option { return etcdproc.WithTimeout(d) }

// WithArgs adds etcd flags after the ones etcdproc sets, so that they
// override them (etcd keeps the last value of a flag), e.g.
// WithArgs("--snapshot-count=100").
func WithArgs(args ...string) Option { return etcdproc.WithArgs(args...) }

// Cluster is an etcd cluster of a test: an etcdproc.Cluster (Endpoints,
// Leader...) whose members are killed when the test ends, with Client and
// with Members whose Restart fails the test.
type Cluster struct {
	*etcdproc.Cluster
	t       testing.TB
	members []*Member
}

// Member is one etcd process of a Cluster: an etcdproc.Member (Kill, Stop,
// Running, Endpoint...) whose Restart fails the test given to Start.
type Member struct {
	*etcdproc.Member
	t testing.TB
}

// lookPath finds the etcd binary; tests replace it.
var lookPath = etcdproc.LookPath

// Start starts an etcd cluster of the given number of members and returns
// once every member answers /health (the cluster has a leader and serves
// reads). The members are killed when the test ends.
func Start(t testing.TB, members int, opts ...Option) *Cluster {
	t.Helper()
	if _, err := lookPath(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("etcdtest: %v", err)
		}
		t.Skipf("etcdtest: %v", err)
	}
	if members < 1 {
		t.Fatalf("etcdtest: Start with %d members", members)
	}
	opts = append([]Option{etcdproc.WithLogf(t.Logf)}, opts...)
	pc, err := etcdproc.Start(t.TempDir(), members, opts...)
	if pc == nil {
		t.Fatalf("etcdtest: %v", err)
	}
	c := &Cluster{Cluster: pc, t: t}
	for i := range pc.Len() {
		c.members = append(c.members, &Member{Member: pc.Member(i), t: t})
	}
	t.Cleanup(c.cleanup) // prints the members' logs if starting failed
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	return c
}

// Member returns member i (0-based).
func (c *Cluster) Member(i int) *Member { return c.members[i] }

// Client returns a client of all the members, closed when the test ends. It
// sends requests up to the members' --max-request-bytes (a client of
// clientv3.New's defaults stops at 2 MiB).
func (c *Cluster) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := c.NewClient()
	if err != nil {
		t.Fatalf("etcdtest: client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// prefixes counts the prefixes Prefix handed out.
var prefixes atomic.Int64

// Prefix returns a key prefix no other caller in this process got ("/tN/"),
// so that the stores of several tests share one cluster apart.
func Prefix() string { return fmt.Sprintf("/t%d/", prefixes.Add(1)) }

// Dial returns a client of the members as a cellbox server makes it
// (etcdconn.Dial), closed when the test ends.
func (c *Cluster) Dial(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := etcdconn.Dial(context.Background(), c.Endpoints())
	if err != nil {
		t.Fatalf("etcdtest: dial: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// Restart starts the member again on its data dir and ports
// (--initial-cluster-state existing), stopping it first if it runs, and
// returns once it answers /health. It fails the test given to Start
// otherwise: call it from that test's goroutine.
func (m *Member) Restart() {
	m.t.Helper()
	if err := m.Member.Restart(); err != nil {
		m.t.Fatalf("etcdtest: %v", err)
	}
}

func (c *Cluster) cleanup() {
	c.Close()
	if c.t.Failed() {
		c.printLogs()
	}
}

// printLogs logs the last lines of each member's log.
func (c *Cluster) printLogs() {
	for _, m := range c.members {
		tail, err := m.LogTail(40)
		if err != nil {
			c.t.Logf("etcdtest: member %d log: %v", m.Index(), err)
			continue
		}
		c.t.Logf("etcdtest: member %d (%s), last lines of %s:\n%s", m.Index(), m.Endpoint(), m.LogPath(), tail)
	}
}
