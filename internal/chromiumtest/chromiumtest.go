// Package chromiumtest drives a headless Chromium for the tests of the
// pages cellbox serves (the runtime's web page, a box's preview), over
// the DevTools protocol on a pipe. Hand-written on purpose: the few
// commands the tests send (create a target, evaluate, screenshot) are a
// page of code, where chromedp brings a protocol generator's worth of
// packages.
package chromiumtest

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
)

// Browser is a headless Chromium driven over the DevTools protocol on a
// pipe (--remote-debugging-pipe: NUL-terminated JSON messages on fds 3
// and 4). --dump-dom cannot wait for a page that keeps an EventSource
// open (virtual time stops while a fetch is pending), so tests that read
// the live page ask the page itself, with Runtime.evaluate.
type Browser struct {
	t       *testing.T
	in      *os.File // chromium reads commands here (its fd 3)
	mu      sync.Mutex
	next    int
	waiting map[int]chan cdpReply
	Session string // of the page target
}

type cdpReply struct {
	Result json.RawMessage
	Error  *struct{ Message string }
}

// Open starts Chromium on url and returns once the page target is
// attached.
func Open(t *testing.T, url string) *Browser {
	t.Helper()
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		if testenv.InCI() {
			t.Fatal("chromium is not installed (apt-get install chromium; scripts/test.sh does)")
		}
		t.Skip("chromium is not installed")
	}
	cmdR, cmdW, err := os.Pipe() // our commands -> chromium's fd 3
	require.NoError(t, err)
	outR, outW, err := os.Pipe() // chromium's fd 4 -> us
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--user-data-dir="+t.TempDir(),
		"--window-size=1200,900", "--remote-debugging-pipe", "about:blank")
	cmd.ExtraFiles = []*os.File{cmdR, outW}
	require.NoError(t, cmd.Start())
	cmdR.Close()
	outW.Close()
	b := &Browser{t: t, in: cmdW, waiting: map[int]chan cdpReply{}}
	t.Cleanup(func() {
		// Closing the DevTools pipe makes Chromium quit with its child
		// processes, which a kill leaves writing into the profile
		// directory while t.TempDir removes it ("directory not empty").
		cmdW.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cancel()
			<-done
		}
		cancel()
		outR.Close()
	})
	go func() {
		r := bufio.NewReader(outR)
		for {
			msg, err := r.ReadBytes(0)
			if err != nil {
				return
			}
			var m struct {
				ID int
				cdpReply
			}
			if json.Unmarshal(msg[:len(msg)-1], &m) != nil || m.ID == 0 {
				continue // an event
			}
			b.mu.Lock()
			ch := b.waiting[m.ID]
			delete(b.waiting, m.ID)
			b.mu.Unlock()
			if ch != nil {
				ch <- m.cdpReply
			}
		}
	}()
	var target struct{ TargetID string }
	b.Call("", "Target.createTarget", map[string]any{"url": url}, &target)
	var att struct{ SessionID string }
	b.Call("", "Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &att)
	b.Session = att.SessionID
	return b
}

// Call sends one command (to the page's session unless session is "")
// and decodes its result into out.
func (b *Browser) Call(session, method string, params any, out any) {
	b.t.Helper()
	b.mu.Lock()
	b.next++
	id := b.next
	ch := make(chan cdpReply, 1)
	b.waiting[id] = ch
	b.mu.Unlock()
	msg := map[string]any{"id": id, "method": method, "params": params}
	if session != "" {
		msg["sessionId"] = session
	}
	raw, err := json.Marshal(msg)
	require.NoError(b.t, err)
	_, err = b.in.Write(append(raw, 0))
	require.NoError(b.t, err)
	select {
	case r := <-ch:
		if r.Error != nil {
			b.t.Fatalf("chromium %s: %s", method, r.Error.Message)
		}
		if out != nil {
			require.NoError(b.t, json.Unmarshal(r.Result, out), "%s", r.Result)
		}
	case <-time.After(time.Minute):
		b.t.Fatalf("chromium did not answer %s within a minute", method)
	}
}

// Eval evaluates a JavaScript expression in the page and decodes its
// (JSON-able) value into out.
func (b *Browser) Eval(expr string, out any) {
	b.t.Helper()
	var r struct {
		Result           struct{ Value json.RawMessage }
		ExceptionDetails *struct{ Text string }
	}
	b.Call(b.Session, "Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true}, &r)
	if r.ExceptionDetails != nil {
		b.t.Fatalf("evaluate %s: %s", expr, r.ExceptionDetails.Text)
	}
	if out != nil {
		require.NoError(b.t, json.Unmarshal(r.Result.Value, out), "%s", r.Result.Value)
	}
}

// Screenshot saves the page as a PNG (for a person to look at).
func (b *Browser) Screenshot(path string) {
	b.t.Helper()
	var r struct{ Data []byte }
	b.Call(b.Session, "Page.captureScreenshot", map[string]any{"format": "png", "captureBeyondViewport": true}, &r)
	require.NoError(b.t, os.WriteFile(path, r.Data, 0o644))
	b.t.Logf("screenshot: %s", path)
}
