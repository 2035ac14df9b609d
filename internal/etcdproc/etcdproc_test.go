package etcdproc

import (
	"context"
	"errors"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

func requireEtcd(t *testing.T) {
	t.Helper()
	if _, err := LookPath(); err != nil {
		if !errors.Is(err, ErrNoEtcd) {
			t.Errorf("LookPath: %v, which does not wrap ErrNoEtcd", err)
		}
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

// TestStartOutsideATest: a member, stopped, is not running; restarted, it
// has what was written before; Close kills it, may be called again, and a
// Restart after it fails rather than starting a process nobody kills.
func TestStartOutsideATest(t *testing.T) {
	requireEtcd(t)
	c, err := Start(t.TempDir(), 1, WithLogLevel("warn"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cli, err := c.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("put: %v", err)
	}
	if l, err := c.Leader(ctx); err != nil || l != 0 {
		t.Fatalf("leader: %d, %v", l, err)
	}
	m := c.Member(0)
	if c.Len() != 1 || m.Index() != 0 || m.Endpoint() != c.Endpoints()[0] || !m.Running() {
		t.Fatalf("Len %d, member %d at %s (endpoints %v), running %v", c.Len(), m.Index(), m.Endpoint(), c.Endpoints(), m.Running())
	}
	m.Stop()
	if m.Running() {
		t.Fatal("running after Stop")
	}
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	if r, err := cli.Get(ctx, "k"); err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v" {
		t.Fatalf("get after the restart: %v %v", err, r)
	}
	tail, err := m.LogTail(1000)
	if err != nil || strings.Count(tail, "=== etcdproc: ") != 2 {
		t.Fatalf("the log (%s) does not show two starts: %v\n%s", m.LogPath(), err, tail)
	}
	if last, err := m.LogTail(1); err != nil || last == "" || strings.Contains(last, "\n") || !strings.HasSuffix(tail, last) {
		t.Fatalf("LogTail(1): %v\n%s", err, last)
	}
	c.Close()
	c.Close()
	if m.Running() {
		t.Fatal("running after Close")
	}
	if err := m.Restart(); err == nil || m.Running() {
		t.Fatalf("Restart after Close: %v, running %v", err, m.Running())
	}
	if _, err := c.Leader(ctx); err == nil {
		t.Fatal("Leader after Close: no error")
	}
}

// TestStartFails: when a member exits at once, Start returns the cluster
// with the error, so that its log tells why.
func TestStartFails(t *testing.T) {
	requireEtcd(t)
	c, err := Start(t.TempDir(), 1, WithArgs("--no-such-flag"), WithTimeout(10*time.Second))
	if err == nil {
		c.Close()
		t.Fatal("Start with an unknown flag: no error")
	}
	if c == nil {
		t.Fatalf("Start: %v, and no cluster", err)
	}
	if c.Member(0).Running() {
		t.Error("a member runs after Start failed")
	}
	tail, terr := c.Member(0).LogTail(100)
	if terr != nil || !strings.Contains(tail, "no-such-flag") {
		t.Fatalf("Start: %v; the log does not name the flag: %v\n%s", err, terr, tail)
	}
	t.Logf("Start: %v", err)
	if _, err := Start(t.TempDir(), 0); err == nil {
		t.Error("Start with 0 members: no error")
	}
}

// TestMembersOutliveTheStartingThread: a cluster started from a goroutine
// that ends its thread (it returns locked to it, as sandbox/local's
// staging may) keeps its members, and a member restarted from another such
// goroutine too: they are started on the cluster's own thread, not the
// caller's, whose end would kill them (Pdeathsig).
func TestMembersOutliveTheStartingThread(t *testing.T) {
	requireEtcd(t)
	onEndedThread := func(fn func() error) error {
		errc := make(chan error, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			errc <- fn()
		}()
		return <-errc
	}
	var c *Cluster
	if err := onEndedThread(func() (err error) { c, err = Start(t.TempDir(), 1, WithLogLevel("warn")); return err }); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	alive := func(what string) {
		t.Helper()
		time.Sleep(300 * time.Millisecond) // Pdeathsig comes at once; give the exit time to show
		if !c.Member(0).Running() {
			tail, _ := c.Member(0).LogTail(5)
			t.Fatalf("the member died %s:\n%s", what, tail)
		}
	}
	alive("when the thread that started the cluster ended")
	if err := onEndedThread(c.Member(0).Restart); err != nil {
		t.Fatal(err)
	}
	alive("when the thread that restarted it ended")
}
