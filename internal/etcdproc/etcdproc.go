// Package etcdproc runs a real etcd cluster as child processes: each member
// is an etcd process (Debian's etcd-server, 3.4, which `bash
// scripts/setup.sh` installs) on 127.0.0.1 with free ports, its data dir and
// log under a directory the caller gives. cellbox-bench starts its cluster
// with it; internal/etcdtest wraps it for tests.
//
// A member is started with Pdeathsig (SIGKILL): should this process die
// without closing the cluster, the members die with it. Pdeathsig fires when
// the OS thread that started the member ends, not the process, and a
// process may end threads (a goroutine that returns locked to its thread,
// as sandbox/local's staging does, takes its thread with it): so every
// member is started on one thread that a goroutine of the cluster holds
// until Close (internal/heldthread).
package etcdproc

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellbox/cellbox/internal/etcdconn"
	"github.com/cellbox/cellbox/internal/heldthread"
	"go.uber.org/zap"
)

// ErrNoEtcd is the error (wrapped) of LookPath and Start when there is no
// etcd binary.
var ErrNoEtcd = errors.New("no etcd binary (/usr/bin/etcd or etcd in PATH); `bash scripts/setup.sh` installs it (Debian's etcd-server)")

// LookPath returns the path of the etcd binary Start runs: etcd in PATH,
// else /usr/bin/etcd. Its error wraps ErrNoEtcd.
func LookPath() (string, error) {
	if p, err := exec.LookPath("etcd"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/bin/etcd"); err != nil {
		return "", fmt.Errorf("%w: %v", ErrNoEtcd, err)
	}
	return "/usr/bin/etcd", nil
}

// Option changes how Start runs the members.
type Option func(*config)

type config struct {
	maxTxnOps       int
	maxRequestBytes int
	logLevel        string
	timeout         time.Duration
	args            []string
	logf            func(string, ...any)
}

// WithMaxTxnOps sets --max-txn-ops (4096 by default; etcd's own is 128).
func WithMaxTxnOps(n int) Option { return func(c *config) { c.maxTxnOps = n } }

// WithMaxRequestBytes sets --max-request-bytes (etcdconn.MaxRequestBytes, 8 MiB, by default; etcd's own
// is 1.5 MiB).
func WithMaxRequestBytes(n int) Option { return func(c *config) { c.maxRequestBytes = n } }

// WithLogLevel sets --log-level of the members' logs: debug, info, warn,
// error (the default), panic or fatal.
func WithLogLevel(level string) Option { return func(c *config) { c.logLevel = level } }

// WithTimeout sets how long Start and Member.Restart wait for members to
// answer (30 s by default).
func WithTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// WithArgs adds etcd flags after the ones this package sets, so that they
// override them (etcd keeps the last value of a flag), e.g.
// WithArgs("--snapshot-count=100").
func WithArgs(args ...string) Option {
	return func(c *config) { c.args = append(c.args, args...) }
}

// WithLogf gives Start a function for what it notes besides the members'
// logs (a start tried again on other ports); by default it notes nothing.
func WithLogf(logf func(format string, args ...any)) Option {
	return func(c *config) { c.logf = logf }
}

// Cluster is a running etcd cluster whose members are child processes.
type Cluster struct {
	bin     string
	cfg     config
	token   string
	members []*Member

	starter *heldthread.Starter // starts the members' processes

	mu        sync.Mutex
	client    *clientv3.Client // for Leader; closed by Close
	clientErr error
	closed    bool
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

// Start starts an etcd cluster of the given number of members, their data
// dirs and logs under dir (which the caller removes after Close), and
// returns once every member answers /health (the cluster has a leader and
// serves reads). Close kills the members.
//
// When it fails after starting members, it kills them and returns the
// Cluster with the error, so that the caller can read their logs
// (Member.LogTail); otherwise the Cluster is nil.
func Start(dir string, members int, opts ...Option) (*Cluster, error) {
	bin, err := LookPath()
	if err != nil {
		return nil, fmt.Errorf("etcdproc: %w", err)
	}
	if members < 1 {
		return nil, fmt.Errorf("etcdproc: Start with %d members", members)
	}
	cfg := config{maxTxnOps: 4096, maxRequestBytes: etcdconn.MaxRequestBytes, logLevel: "error", timeout: 30 * time.Second, logf: func(string, ...any) {}}
	for _, o := range opts {
		o(&cfg)
	}
	c := &Cluster{bin: bin, cfg: cfg, starter: heldthread.New()}

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
			c.starter.Stop()
			if len(c.members) == 0 {
				c = nil
			}
			return c, fmt.Errorf("etcdproc: starting %d members: %w", members, err)
		}
		cfg.logf("etcdproc: a port was taken meanwhile (%v); starting again on other ports", err)
	}
}

// Close kills the members and closes the client of Leader. It may be
// called more than once.
func (c *Cluster) Close() {
	c.mu.Lock()
	cli := c.client
	c.client, c.closed = nil, true
	c.mu.Unlock()
	if cli != nil {
		cli.Close()
	}
	c.killAll()
	c.starter.Stop()
}

func (c *Cluster) start(dir string, n int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ports, err := freePorts(2 * n)
	if err != nil {
		return err
	}
	c.token = "etcdproc-" + randomHex(8)
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
	fmt.Fprintf(logf, "=== etcdproc: %s %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(append([]string{m.c.bin}, args...), " "))
	cmd := exec.Command(m.c.bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Should this process die without Close, the members die with it (with
	// the thread that starts them: see the package doc).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = m.c.starter.Start(cmd)
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

// Len returns the number of members.
func (c *Cluster) Len() int { return len(c.members) }

// Member returns member i (0-based).
func (c *Cluster) Member(i int) *Member { return c.members[i] }

// NewClient returns a new client of all the members, which the caller
// closes. It sends requests up to the members' --max-request-bytes (a
// client of clientv3.New's defaults stops at 2 MiB).
func (c *Cluster) NewClient() (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   c.Endpoints(),
		DialTimeout: 5 * time.Second,
		// The client sends at most 2 MiB by default: let the members' own
		// --max-request-bytes be the limit (their gRPC takes 512 KiB more).
		MaxCallSendMsgSize: c.cfg.maxRequestBytes + 512<<10,
		Logger:             zap.NewNop(), // its warnings while a member is down would fill a test's output
	})
}

// leaderClient returns the client of Leader, made at its first call.
func (c *Cluster) leaderClient() (*clientv3.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("etcdproc: the cluster is closed")
	}
	if c.client == nil && c.clientErr == nil {
		c.client, c.clientErr = c.NewClient()
	}
	return c.client, c.clientErr
}

// Leader waits until a running member says it is the leader and returns its
// index (of those that say so, the one of the highest term), or an error
// when ctx ends first.
func (c *Cluster) Leader(ctx context.Context) (int, error) {
	cli, err := c.leaderClient()
	if err != nil {
		return -1, err
	}
	var last error
	for {
		leader, term := -1, uint64(0)
		for _, m := range c.members {
			if !m.Running() {
				continue
			}
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := cli.Status(sctx, m.clientURL)
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
			return -1, fmt.Errorf("etcdproc: leader: %w (%v)", ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Index returns the member's index in its Cluster (0-based).
func (m *Member) Index() int { return m.index }

// Endpoint returns the member's client URL.
func (m *Member) Endpoint() string { return m.clientURL }

// LogPath returns the path of the member's log (etcd's stderr and stdout,
// after a line of this package at each start of the process).
func (m *Member) LogPath() string { return m.logPath }

// LogTail returns the end of the member's log: at most maxLines lines of
// its last 16 KiB.
func (m *Member) LogTail(maxLines int) (string, error) {
	const maxBytes = 16 << 10
	f, err := os.Open(m.logPath)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > maxBytes {
		if _, err := f.Seek(-maxBytes, io.SeekEnd); err != nil {
			return "", err
		}
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return "", err
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > maxLines {
		lines = lines[len(lines)-maxLines:]
	}
	return strings.Join(lines, "\n"), nil
}

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
// returns once it answers /health, or an error (the member may then be
// left running: Close or Kill kills it).
func (m *Member) Restart() error {
	m.Stop()
	c := m.c
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return fmt.Errorf("etcdproc: restarting member %d: the cluster is closed", m.index)
	}
	var initial []string
	for _, o := range c.members {
		initial = append(initial, o.name+"="+o.peerURL)
	}
	if err := m.spawn(strings.Join(initial, ","), "existing"); err != nil {
		return fmt.Errorf("etcdproc: restarting member %d: %w", m.index, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.timeout)
	defer cancel()
	if err := c.waitHealthy(ctx, []*Member{m}); err != nil {
		return fmt.Errorf("etcdproc: restarting member %d: %w", m.index, err)
	}
	return nil
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
