// Package etcdtest starts a real etcd cluster for Go tests: each member is an
// etcd child process (Debian's etcd-server, 3.4, which `bash scripts/setup.sh`
// installs) on 127.0.0.1 with free ports and a data dir under t.TempDir().
//
// Without an etcd binary a test is skipped, or fails when the environment
// variable CI is set. Members are killed when the test ends; when it failed,
// the tail of each member's log is printed.
package etcdtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Option changes how Start runs the members.
type Option func(*config)

type config struct {
	maxTxnOps       int
	maxRequestBytes int
	logLevel        string
	timeout         time.Duration
	args            []string
}

// WithMaxTxnOps sets --max-txn-ops (4096 by default; etcd's own is 128).
func WithMaxTxnOps(n int) Option { return func(c *config) { c.maxTxnOps = n } }

// WithMaxRequestBytes sets --max-request-bytes (4 MiB by default; etcd's own
// is 1.5 MiB).
func WithMaxRequestBytes(n int) Option { return func(c *config) { c.maxRequestBytes = n } }

// WithLogLevel sets --log-level of the members' logs: debug, info, warn,
// error (the default), panic or fatal.
func WithLogLevel(level string) Option { return func(c *config) { c.logLevel = level } }

// WithTimeout sets how long Start and Restart wait for members to answer
// (30 s by default).
func WithTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// WithArgs adds etcd flags after the ones this package sets, so that they
// override them (etcd keeps the last value of a flag), e.g.
// WithArgs("--snapshot-count=100").
func WithArgs(args ...string) Option {
	return func(c *config) { c.args = append(c.args, args...) }
}

// Cluster is a running etcd cluster whose members are child processes.
// Member.Restart fails the test given to Start: call it from that test's
// goroutine.
type Cluster struct {
	t       testing.TB // Start's; nil for StartProcs
	bin     string
	cfg     config
	token   string
	members []*Member

	clientOnce sync.Once
	client     *clientv3.Client // for Leader; closed at cleanup
	clientErr  error
}

// Member is one etcd process of a Cluster.
type Member struct {
	c         *Cluster
	index     int
	name      string
	clientURL string
	peerURL   string
	dataDir   string
	logPath   string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
	err  error         // cmd.Wait's, once done is closed
}

// lookPath finds the etcd binary; tests replace it.
var lookPath = func() (string, error) {
	if p, err := exec.LookPath("etcd"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/bin/etcd"); err != nil {
		return "", err
	}
	return "/usr/bin/etcd", nil
}

// Start starts an etcd cluster of the given number of members and returns
// once every member answers /health (the cluster has a leader and serves
// reads). The members are killed when the test ends.
func Start(t testing.TB, members int, opts ...Option) *Cluster {
	t.Helper()
	if _, err := lookPath(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("etcdtest: no etcd binary (/usr/bin/etcd or etcd in PATH): %v; `bash scripts/setup.sh` installs it (Debian's etcd-server)", err)
		}
		t.Skipf("etcdtest: no etcd binary (/usr/bin/etcd or etcd in PATH); `bash scripts/setup.sh` installs it (Debian's etcd-server)")
	}
	if members < 1 {
		t.Fatalf("etcdtest: Start with %d members", members)
	}
	c, err := startProcs(t.TempDir(), members, t.Logf, opts)
	if c != nil {
		c.t = t
		t.Cleanup(c.cleanup) // prints the members' logs if starting failed
	}
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	return c
}

// StartProcs starts a cluster as Start does, outside a test (a benchmark
// binary): the members' data dirs and logs go under dir, which the caller
// removes after Close, which kills the members. Member.Restart is only for
// a cluster of Start. A member dies with the OS thread that started it
// (Pdeathsig): in a process whose goroutines may end their threads (one
// that returns locked to its thread, as sandbox/local's staging does),
// call StartProcs from a goroutine locked to its thread until Close.
func StartProcs(dir string, members int, opts ...Option) (*Cluster, error) {
	if _, err := lookPath(); err != nil {
		return nil, fmt.Errorf("etcdtest: no etcd binary (/usr/bin/etcd or etcd in PATH): %w; `bash scripts/setup.sh` installs it (Debian's etcd-server)", err)
	}
	if members < 1 {
		return nil, fmt.Errorf("etcdtest: StartProcs with %d members", members)
	}
	c, err := startProcs(dir, members, func(string, ...any) {}, opts)
	if err != nil {
		return nil, fmt.Errorf("etcdtest: %w", err)
	}
	return c, nil
}

// startProcs starts the members under dir; on an error the members are
// killed, and the cluster is returned if any were started (their logs
// tell why).
func startProcs(dir string, members int, logf func(string, ...any), opts []Option) (*Cluster, error) {
	bin, err := lookPath()
	if err != nil {
		return nil, err
	}
	cfg := config{maxTxnOps: 4096, maxRequestBytes: 4 << 20, logLevel: "error", timeout: 30 * time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	c := &Cluster{bin: bin, cfg: cfg}

	// A free port can be taken by someone else between our probe and etcd's
	// bind: then a member exits at once, and the cluster is started anew on
	// other ports.
	for attempt := 1; ; attempt++ {
		err := c.start(filepath.Join(dir, "try"+strconv.Itoa(attempt)), members)
		if err == nil {
			return c, nil
		}
		inUse := c.anyLogContains("address already in use")
		c.killAll()
		if !inUse || attempt == 3 {
			return c, fmt.Errorf("starting %d members: %w", members, err)
		}
		logf("etcdtest: a port was taken meanwhile (%v); starting again on other ports", err)
	}
}

// Close kills the members of a cluster of StartProcs (a cluster of Start
// is killed when its test ends).
func (c *Cluster) Close() {
	if c.client != nil {
		c.client.Close()
	}
	c.killAll()
}

func (c *Cluster) start(dir string, n int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ports, err := freePorts(2 * n)
	if err != nil {
		return err
	}
	c.token = "etcdtest-" + randomHex(8)
	c.members = make([]*Member, n)
	var initial []string
	for i := range c.members {
		m := &Member{
			c:         c,
			index:     i,
			name:      "m" + strconv.Itoa(i),
			clientURL: "http://127.0.0.1:" + strconv.Itoa(ports[2*i]),
			peerURL:   "http://127.0.0.1:" + strconv.Itoa(ports[2*i+1]),
			dataDir:   filepath.Join(dir, "m"+strconv.Itoa(i)+".etcd"),
			logPath:   filepath.Join(dir, "m"+strconv.Itoa(i)+".log"),
		}
		c.members[i] = m
		initial = append(initial, m.name+"="+m.peerURL)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.timeout)
	defer cancel()
	// One after the other: a new member first asks each peer whether it is
	// in the cluster already, waiting 1 s for one whose port is open but
	// that does not serve yet (as while it starts), which members started
	// all at once often meet. A peer that serves, or whose port is closed,
	// answers at once.
	for _, m := range c.members {
		if err := m.spawn(strings.Join(initial, ","), "new"); err != nil {
			return err
		}
		if err := m.waitPeerServing(ctx); err != nil {
			return err
		}
	}
	return c.waitHealthy(ctx, c.members)
}

// waitPeerServing waits until m answers HTTP on its peer URL.
func (m *Member) waitPeerServing(ctx context.Context) error {
	hc := &http.Client{Timeout: 5 * time.Second}
	for {
		if exited, err := m.exited(); exited {
			return fmt.Errorf("member %d exited while starting: %v (log %s)", m.index, err, m.logPath)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.peerURL+"/version", nil)
		if err != nil {
			return err
		}
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("member %d does not serve its peers after %v", m.index, m.c.cfg.timeout)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// spawn starts m's process.
func (m *Member) spawn(initialCluster, state string) error {
	cfg := m.c.cfg
	args := []string{
		"--name", m.name,
		"--data-dir", m.dataDir,
		"--listen-client-urls", m.clientURL,
		"--advertise-client-urls", m.clientURL,
		"--listen-peer-urls", m.peerURL,
		"--initial-advertise-peer-urls", m.peerURL,
		"--initial-cluster", initialCluster,
		"--initial-cluster-state", state,
		"--initial-cluster-token", m.c.token,
		"--heartbeat-interval", "50",
		"--election-timeout", "500",
		"--max-txn-ops", strconv.Itoa(cfg.maxTxnOps),
		"--max-request-bytes", strconv.Itoa(cfg.maxRequestBytes),
		"--logger", "zap",
		"--log-outputs", "stderr",
		"--log-level", cfg.logLevel,
	}
	args = append(args, cfg.args...)
	logf, err := os.OpenFile(m.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "=== etcdtest: %s %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(append([]string{m.c.bin}, args...), " "))
	cmd := exec.Command(m.c.bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Should the test binary die without its cleanups, the members die with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	logf.Close() // the child has its own copy
	if err != nil {
		return fmt.Errorf("member %d: %w", m.index, err)
	}
	done := make(chan struct{})
	m.mu.Lock()
	m.cmd, m.done, m.err = cmd, done, nil
	m.mu.Unlock()
	go func() {
		err := cmd.Wait()
		m.mu.Lock()
		m.err = err
		m.mu.Unlock()
		close(done)
	}()
	return nil
}

// waitHealthy polls each member's /health, all at once (a member that
// listens but does not serve yet holds a request), until all answer true, one
// of them exits, or ctx ends.
func (c *Cluster) waitHealthy(ctx context.Context, ms []*Member) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hc := &http.Client{Timeout: 5 * time.Second}
	errs := make(chan error, len(ms))
	for _, m := range ms {
		go func() {
			for {
				if exited, err := m.exited(); exited {
					errs <- fmt.Errorf("member %d exited while starting: %v (log %s)", m.index, err, m.logPath)
					return
				}
				if healthy(ctx, hc, m.clientURL) {
					errs <- nil
					return
				}
				select {
				case <-ctx.Done():
					errs <- fmt.Errorf("member %d not healthy after %v", m.index, c.cfg.timeout)
					return
				case <-time.After(50 * time.Millisecond):
				}
			}
		}()
	}
	var first error
	for range ms {
		if err := <-errs; err != nil && first == nil {
			first = err
			cancel()
		}
	}
	return first
}

func healthy(ctx context.Context, hc *http.Client, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/health", nil)
	if err != nil {
		return false
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var h struct {
		Health string `json:"health"`
	}
	return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&h) == nil && h.Health == "true"
}

// Endpoints returns the members' client URLs, stopped ones included.
func (c *Cluster) Endpoints() []string {
	eps := make([]string, len(c.members))
	for i, m := range c.members {
		eps[i] = m.clientURL
	}
	return eps
}

// Member returns member i (0-based).
func (c *Cluster) Member(i int) *Member { return c.members[i] }

// Client returns a client of all the members, closed when the test ends. It
// sends requests up to the members' --max-request-bytes (a client of
// clientv3.New's defaults stops at 2 MiB).
func (c *Cluster) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := c.newClient()
	if err != nil {
		t.Fatalf("etcdtest: client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func (c *Cluster) newClient() (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   c.Endpoints(),
		DialTimeout: 5 * time.Second,
		// The client sends at most 2 MiB by default: let the members' own
		// --max-request-bytes be the limit (their gRPC takes 512 KiB more).
		MaxCallSendMsgSize: c.cfg.maxRequestBytes + 512<<10,
		Logger:             zap.NewNop(), // its warnings while a member is down would fill the test output
	})
}

// Leader waits until a running member says it is the leader and returns its
// index (of those that say so, the one of the highest term), or an error
// when ctx ends first.
func (c *Cluster) Leader(ctx context.Context) (int, error) {
	c.clientOnce.Do(func() { c.client, c.clientErr = c.newClient() })
	if c.clientErr != nil {
		return -1, c.clientErr
	}
	var last error
	for {
		leader, term := -1, uint64(0)
		for _, m := range c.members {
			if !m.Running() {
				continue
			}
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := c.client.Status(sctx, m.clientURL)
			cancel()
			if err != nil {
				last = fmt.Errorf("member %d: %w", m.index, err)
				continue
			}
			if st.Leader != 0 && st.Leader == st.Header.GetMemberId() && st.RaftTerm >= term {
				leader, term = m.index, st.RaftTerm
			}
		}
		if leader >= 0 {
			return leader, nil
		}
		select {
		case <-ctx.Done():
			if last == nil {
				last = errors.New("no member says it is the leader")
			}
			return -1, fmt.Errorf("etcdtest: leader: %w (%v)", ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Endpoint returns the member's client URL.
func (m *Member) Endpoint() string { return m.clientURL }

// Running tells whether the member's process is running.
func (m *Member) Running() bool {
	exited, _ := m.exited()
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cmd != nil && !exited
}

func (m *Member) exited() (bool, error) {
	m.mu.Lock()
	done := m.done
	m.mu.Unlock()
	if done == nil {
		return false, nil
	}
	select {
	case <-done:
		m.mu.Lock()
		defer m.mu.Unlock()
		return true, m.err
	default:
		return false, nil
	}
}

// Kill kills the member's process with SIGKILL and waits for it to exit.
func (m *Member) Kill() { m.signal(syscall.SIGKILL) }

// Stop ends the member's process with SIGTERM (etcd shuts down cleanly,
// handing its leadership on) and waits for it to exit; after 10 s it is
// killed.
func (m *Member) Stop() { m.signal(syscall.SIGTERM) }

func (m *Member) signal(sig syscall.Signal) {
	m.mu.Lock()
	cmd, done := m.cmd, m.done
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Restart starts the member again on its data dir and ports
// (--initial-cluster-state existing), stopping it first if it runs, and
// returns once it answers /health. It fails the test otherwise.
func (m *Member) Restart() {
	t := m.c.t
	t.Helper()
	m.Stop()
	var initial []string
	for _, o := range m.c.members {
		initial = append(initial, o.name+"="+o.peerURL)
	}
	if err := m.spawn(strings.Join(initial, ","), "existing"); err != nil {
		t.Fatalf("etcdtest: restarting member %d: %v", m.index, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.c.cfg.timeout)
	defer cancel()
	if err := m.c.waitHealthy(ctx, []*Member{m}); err != nil {
		t.Fatalf("etcdtest: restarting member %d: %v", m.index, err)
	}
}

func (c *Cluster) cleanup() {
	c.Close()
	if c.t.Failed() {
		c.printLogs()
	}
}

func (c *Cluster) killAll() {
	var wg sync.WaitGroup
	for _, m := range c.members {
		wg.Add(1)
		go func() { defer wg.Done(); m.Kill() }()
	}
	wg.Wait()
}

func (c *Cluster) anyLogContains(s string) bool {
	for _, m := range c.members {
		if b, err := os.ReadFile(m.logPath); err == nil && bytes.Contains(b, []byte(s)) {
			return true
		}
	}
	return false
}

// printLogs logs the last lines of each member's log.
func (c *Cluster) printLogs() {
	const maxLines, maxBytes = 40, 16 << 10
	for _, m := range c.members {
		b, err := os.ReadFile(m.logPath)
		if err != nil {
			c.t.Logf("etcdtest: member %d log: %v", m.index, err)
			continue
		}
		if len(b) > maxBytes {
			b = b[len(b)-maxBytes:]
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(lines) > maxLines {
			lines = lines[len(lines)-maxLines:]
		}
		c.t.Logf("etcdtest: member %d (%s), last lines of %s:\n%s", m.index, m.clientURL, m.logPath, strings.Join(lines, "\n"))
	}
}

// freePorts returns n distinct ports free on 127.0.0.1 now.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
