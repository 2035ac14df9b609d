package heldthread

import (
	"errors"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// onEndedThread runs fn on a goroutine that ends its thread (it returns
// locked to it).
func onEndedThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked
		errc <- fn()
	}()
	return <-errc
}

// sleeper is a child that Pdeathsig kills with the thread that started it.
func sleeper(t *testing.T) *exec.Cmd {
	cmd := exec.Command("sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	t.Cleanup(func() {
		if cmd.Process != nil {
			cmd.Process.Kill()
		}
	})
	return cmd
}

func exitedWithin(cmd *exec.Cmd, d time.Duration) bool {
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// TestChildOutlivesTheCallersThread: a child started through a Starter
// from a goroutine whose thread then ends runs on; a Start after Stop is
// refused. (A child started from such a goroutine directly is often
// killed — what the Starter is for — but not always: the Go runtime does
// not end every such thread at once, so the test does not count on it.)
func TestChildOutlivesTheCallersThread(t *testing.T) {
	s := New()
	held := sleeper(t)
	if err := onEndedThread(func() error { return s.Start(held) }); err != nil {
		t.Fatal(err)
	}
	if exitedWithin(held, 500*time.Millisecond) {
		t.Fatal("the child started through the Starter died with its caller's thread")
	}
	held.Process.Kill()
	s.Stop()
	s.Stop()
	if err := s.Start(exec.Command("true")); !errors.Is(err, ErrStopped) {
		t.Fatalf("Start after Stop: %v, want ErrStopped", err)
	}
}
