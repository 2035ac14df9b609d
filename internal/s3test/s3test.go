// Package s3test starts a real S3-compatible server for Go tests: versitygw
// (github.com/versity/versitygw, a gateway serving the S3 API from a POSIX
// directory), which `bash scripts/s3-server.sh build` builds from its Go
// module into /var/lib/cellbox-s3/bin. Each server is a child process on a
// free loopback port with a data directory under t.TempDir() and random
// root credentials, killed when the test ends; when the test failed, the
// tail of its log is printed.
//
// Without the binary a test is skipped, or fails when the environment
// variable CI is set.
//
// Hand-written rather than a fake S3 in the test process: the blob store
// must be checked against a server's real behaviour (conditional PUTs,
// checksums, listing, multipart uploads), and no Go module offers a
// server's process to start and stop.
package s3test

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cellbox/cellbox/internal/heldthread"
)

// DefaultBin is where `bash scripts/s3-server.sh build` puts the server;
// the environment variable CELLBOX_S3_SERVER names another binary.
const DefaultBin = "/var/lib/cellbox-s3/bin/versitygw"

// Region is the region the server answers for.
const Region = "us-east-1"

// startTimeout bounds the wait for a server to answer (the machines that
// run the tests are busy).
const startTimeout = 30 * time.Second

// Server is a running versitygw, a child process of the test.
type Server struct {
	t              testing.TB
	bin            string
	dir            string // the data (the buckets are its directories)
	logPath        string
	port           int
	access, secret string

	// starter starts the process on a thread held until cleanup: it dies
	// with that thread (Pdeathsig), and a test's goroutines may end theirs.
	starter *heldthread.Starter

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Bin returns the server binary's path: CELLBOX_S3_SERVER, else DefaultBin.
func Bin() string {
	if p := os.Getenv("CELLBOX_S3_SERVER"); p != "" {
		return p
	}
	return DefaultBin
}

// Start starts a server and returns the blob store URL of bucket
// "cellbox-test" on it, credentials included:
// s3://cellbox-test?endpoint=http://127.0.0.1:PORT&region=us-east-1&access_key=…&secret_key=….
// The server is killed when the test ends.
func Start(t testing.TB) string {
	t.Helper()
	return StartServer(t).URL("cellbox-test")
}

// StartServer starts a server and returns it once it answers HTTP.
func StartServer(t testing.TB) *Server {
	t.Helper()
	bin := Bin()
	if _, err := os.Stat(bin); err != nil {
		msg := fmt.Sprintf("s3test: no S3 server binary (%v); `bash scripts/s3-server.sh build` builds it", err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	s := &Server{
		t:      t,
		bin:    bin,
		dir:    t.TempDir(),
		access: "cellbox" + randomHex(6),
		secret: randomHex(20),

		starter: heldthread.New(),
	}
	s.logPath = filepath.Join(s.dir, "server.log")
	if err := os.Mkdir(filepath.Join(s.dir, "data"), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.cleanup)
	// A free port can be taken by someone else between our probe and the
	// server's bind: then it exits at once, and is started on another.
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			t.Fatalf("s3test: %v", err)
		}
		s.port = port
		err = s.start()
		if err == nil {
			return s
		}
		if !bytes.Contains(s.log(), []byte("address already in use")) || attempt == 3 {
			t.Fatalf("s3test: starting %s: %v\n%s", s.bin, err, s.log())
		}
	}
}

// URL returns the blob store URL of bucket/prefix (a bucket, optionally
// followed by /PREFIX) on the server, its credentials in the query.
func (s *Server) URL(bucketAndPrefix string) string {
	q := url.Values{
		"endpoint":   {s.Endpoint()},
		"region":     {Region},
		"access_key": {s.access},
		"secret_key": {s.secret},
	}
	return "s3://" + bucketAndPrefix + "?" + q.Encode()
}

// Endpoint is the server's http://127.0.0.1:PORT.
func (s *Server) Endpoint() string { return "http://127.0.0.1:" + strconv.Itoa(s.port) }

// Credentials are the server's root access key and secret.
func (s *Server) Credentials() (access, secret string) { return s.access, s.secret }

// Dir is the server's data directory: a directory a bucket, an object a
// file.
func (s *Server) Dir() string { return filepath.Join(s.dir, "data") }

// Stop kills the server and waits for it to exit.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kill()
}

// Restart stops the server if it runs and starts it again on the same port
// and data, so that URLs stay good; it fails the test if the server does
// not answer.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	if err := s.start(); err != nil {
		s.t.Fatalf("s3test: restarting %s: %v\n%s", s.bin, err, s.log())
	}
}

// start starts the process on s.port and waits until it answers.
func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "--- s3test: starting on port %d\n", s.port)
	cmd := exec.Command(s.bin,
		"--port", "127.0.0.1:"+strconv.Itoa(s.port),
		"--access", s.access, "--secret", s.secret,
		"--region", Region,
		"--quiet",
		"posix", s.Dir())
	cmd.Dir = s.dir
	// Only what the server needs: no VGW_* or ROOT_* variable of the
	// caller's changes its flags.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + s.dir}
	cmd.Stdout, cmd.Stderr = logf, logf
	// Dies with the test process, should it be killed before its cleanup.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.starter.Start(cmd); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	s.cmd, s.done = cmd, done
	if err := s.waitAnswer(done); err != nil {
		s.kill()
		return err
	}
	return nil
}

// waitAnswer waits until the server answers an HTTP request (any answer:
// an anonymous one is refused), or it exits, or startTimeout passes.
func (s *Server) waitAnswer(done <-chan struct{}) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(startTimeout)
	for {
		resp, err := client.Get(s.Endpoint() + "/")
		if err == nil {
			resp.Body.Close()
			return nil
		}
		select {
		case <-done:
			return errors.New("the server exited before it answered")
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the server did not answer within %v: %v", startTimeout, err)
		}
	}
}

// kill kills the process, if it runs, and waits for it; s.mu is held.
func (s *Server) kill() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.done
	s.cmd, s.done = nil, nil
}

func (s *Server) cleanup() {
	s.Stop()
	s.starter.Stop()
	if s.t.Failed() {
		s.t.Logf("s3test: the tail of the server's log (%s):\n%s", s.logPath, s.log())
	}
}

// log returns the last 4 KiB of the server's log.
func (s *Server) log() []byte {
	b, _ := os.ReadFile(s.logPath)
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return b
}

// freePort returns a TCP port of 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// randomHex is n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
