package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/etcdtest"
	"github.com/cellbox/cellbox/internal/mcptest"
	"github.com/cellbox/cellbox/internal/s3test"
	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/server/runapi"
)

// startCluster starts a three-member etcd as docs/cluster.md asks for it,
// and returns the --etcd flag of the servers over it. cellbox-cluster is
// built beside cellbox: the servers' cellbox execs it for --etcd.
func startCluster(t *testing.T) (*etcdtest.Cluster, string) {
	testenv.ClusterBinary(t)
	cl := etcdtest.Start(t, 3)
	return cl, strings.Join(cl.Endpoints(), ",")
}

// countingPipeline is the csv-pipeline example with each stage saying a
// fresh id first (a run of it, counted by the ids its results show) and
// taking a second, so that a server can die while one runs.
func countingPipeline(t *testing.T) string {
	dir := t.TempDir()
	src := filepath.Join("..", "..", "examples", "csv-pipeline")
	ents, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		require.NoError(t, err)
		if e.Name() == "pattern.yaml" {
			b = []byte(strings.ReplaceAll(string(b), "command: python3 ", "command: cat /proc/sys/kernel/random/uuid && sleep 1 && python3 "))
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644))
	}
	return dir
}

// runIDs collects, from a watch of every commit, the run ids each stage's
// results showed.
type runIDs struct {
	mu  sync.Mutex
	ids map[string]map[string]bool // stage -> ids
}

func (r *runIDs) add(b runapi.Batch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range b.Changes {
		var env struct {
			Result *struct {
				Stdout string `json:"stdout"`
			} `json:"result"`
		}
		if json.Unmarshal(c.Cell.Value, &env) != nil || env.Result == nil {
			continue
		}
		id, _, _ := strings.Cut(env.Result.Stdout, "\n")
		stage := c.Cell.Address[strings.LastIndexByte(c.Cell.Address, '/')+1:]
		if len(id) == 36 {
			if r.ids[stage] == nil {
				r.ids[stage] = map[string]bool{}
			}
			r.ids[stage][id] = true
		}
	}
}

func (r *runIDs) runs(stage string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ids[stage])
}

// TestClusterPatternFailover: two servers over a three-member etcd; the
// csv-pipeline is loaded on one, which is killed (SIGKILL) while a stage
// runs. The other takes the pattern over (its lease ran out), runs what
// was in flight again, and every cell ends right; no stage ran more often
// than the rules say (once per input, plus once for a run cut off by the
// death).
func TestClusterPatternFailover(t *testing.T) {
	testenv.RequireBwrap(t)
	_, eps := startCluster(t)
	a := startServe(t, t.TempDir(), "--pool", "0", "--etcd", eps)
	b := startServe(t, t.TempDir(), "--pool", "0", "--etcd", eps)
	assert.Equal(t, a.key, b.key, "the servers share one key")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ca := runapi.NewClient(a.url).WithKey(a.key)
	cb := runapi.NewClient(b.url).WithKey(b.key)

	// Every commit, as the second server sees it through the shared store.
	ids, first := startPipeline(t, ctx, ca, cb)
	_, err := cb.Get(ctx, "summary")
	require.NoError(t, err, "the other server reads the pattern's cells")

	// A change through the other server (forwarded to the owner, a bare
	// name resolved against every server's patterns); the owner dies while
	// the stages run.
	c, err := cb.Set(ctx, "threshold", json.RawMessage(`100`))
	require.NoError(t, err)
	assert.JSONEq(t, `100`, string(c.Value))
	time.Sleep(300 * time.Millisecond) // keep is running (it takes a second)
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGKILL))
	killed := time.Now()

	took := waitTakeover(t, ctx, cb, killed)
	// How long is a figure (README), not a pass mark: a loaded machine
	// takes longer to notice a dead lease.
	t.Logf("the second server took the pattern over %s after the first was killed", took.Round(time.Millisecond))

	second := waitSummary(t, ctx, cb, first)
	assert.NotEqual(t, first, second, "the summary follows the new threshold")
	mr, err := cb.Get(ctx, "min_revenue")
	require.NoError(t, err)
	assert.JSONEq(t, `100`, string(mr.Value))
	time.Sleep(time.Second) // the watch catches up
	assert.Equal(t, 1, ids.runs("clean"), "clean's input never changed: it ran once")
	assert.LessOrEqual(t, ids.runs("keep"), 3, "keep: once per threshold, plus the run the death cut off")
	assert.GreaterOrEqual(t, ids.runs("keep"), 2)
	assert.LessOrEqual(t, ids.runs("summarize"), 3)
}

// waitSummary waits for the summary cell to hold a value other than not
// (and no stage pending), and returns it.
func waitSummary(t *testing.T, ctx context.Context, c *runapi.Client, not string) string {
	t.Helper()
	for {
		s, err := c.Get(ctx, "summary")
		if err == nil && string(s.Value) != "null" && string(s.Value) != not && s.Error == "" {
			k, err := c.Get(ctx, "summarize")
			if err == nil && !strings.Contains(string(k.Value), `"pending":true`) {
				return string(s.Value)
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("the summary never came (last: %v %s)", err, fmt.Sprint(s))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestClusterSessionAcrossServers: a session made on one server is used
// through another (forwarded to the server that serves it, whatever the
// request claims), and when its server is killed the other takes it over.
func TestClusterSessionAcrossServers(t *testing.T) {
	testenv.RequireBwrap(t)
	_, eps := startCluster(t)
	dataA := t.TempDir()
	a := startServe(t, dataA, "--pool", "0", "--etcd", eps)
	b := startServe(t, t.TempDir(), "--pool", "0", "--etcd", eps)
	run := cli(t)
	envA := newSession(t, a.url, dataA)
	envB := append([]string{"CELLBOX_SERVER=" + b.url}, envA[1:]...)
	stdout := func(env []string, cmd string) (string, error) { return shellStdout(run, env, cmd) }
	got, err := stdout(envA, "echo made on a > /workspace/f.txt && hostname")
	require.NoError(t, err, got)
	got, err = stdout(envB, "cat /workspace/f.txt")
	require.NoError(t, err, got)
	assert.Equal(t, "made on a\n", got, "a call through the other server reaches the session's box")

	// A request that claims to be forwarded, without the servers' proof, is
	// forwarded all the same (the second server does not take the session).
	sess := strings.TrimPrefix(envA[1], "CELLBOX_SESSION=")
	token := strings.TrimPrefix(envA[2], "CELLBOX_TOKEN=")
	req, _ := http.NewRequest("POST", b.url+"/v1/sessions/"+sess+"/tools/shell", strings.NewReader(`{"command":"cat /workspace/f.txt"}`))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Cellbox-Forwarded", "0000")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode, "%s", body)
	assert.Contains(t, string(body), "made on a")

	// A preview of a server in the box, opened through the other server.
	_, err = run(envA, "tool", "shell", `{"command":"echo preview-ok > index.html && python3 -m http.server 8000 --bind 127.0.0.1","background":true}`)
	require.NoError(t, err)
	out, err := run(envA, "tool", "wait_port", `{"port":8000}`)
	require.NoError(t, err, out)
	out, err = run(envA, "tool", "browse", `{"port":8000}`)
	require.NoError(t, err, out)
	var br struct{ URL string }
	require.NoError(t, json.Unmarshal([]byte(out), &br), out)
	pu, err := url.Parse(br.URL)
	require.NoError(t, err)
	bu, _ := url.Parse(b.url)
	viaB := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, bu.Host) // ID.localhost:PORT of the second server
	}}}
	resp, err = viaB.Get("http://" + pu.Hostname() + ":" + bu.Port() + "/")
	require.NoError(t, err)
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode, "%s", body)
	assert.Equal(t, "preview-ok\n", string(body), "the preview answers through the other server")

	// The session's server dies: the other serves the session once its
	// lease runs out (its box, of the dead server's data dir, comes back
	// empty on this single-machine backend).
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGKILL))
	killed := time.Now()
	for {
		got, err = stdout(envB, "echo alive")
		if err == nil && got == "alive\n" {
			break
		}
		require.Less(t, time.Since(killed), time.Minute, "the session was never taken over: %v %s", err, got)
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("the session answered through the second server %s after its server was killed", time.Since(killed).Round(time.Millisecond))
	out, err = run(envB, "session", "rm", sess)
	require.NoError(t, err, out)
	_, err = stdout(envB, "true")
	require.Error(t, err, "the session is gone for every server")
}

// netns is a network namespace the test made, joined to this one by a
// veth pair: the host side at hostIP, the namespace's at nsIP.
type netns struct {
	name, hostIf, hostIP, nsIP string
}

// newNetns makes a namespace for a server (root, iproute2), removed at
// cleanup.
func newNetns(t *testing.T) *netns {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("the partition test makes network namespaces: it needs root")
		}
		t.Skip("needs root")
	}
	id := fmt.Sprintf("%04x", time.Now().UnixNano()&0xffff)
	n := &netns{name: "cbp-" + id, hostIf: "cbph" + id, hostIP: "10.213." + fmt.Sprint(time.Now().UnixNano()%200+10) + ".1"}
	n.nsIP = strings.TrimSuffix(n.hostIP, ".1") + ".2"
	ip := func(args ...string) {
		out, err := exec.Command("ip", args...).CombinedOutput()
		require.NoError(t, err, "ip %s: %s", strings.Join(args, " "), out)
	}
	ip("netns", "add", n.name)
	t.Cleanup(func() {
		exec.Command("ip", "link", "del", n.hostIf).Run()
		exec.Command("ip", "netns", "del", n.name).Run()
	})
	ip("link", "add", n.hostIf, "type", "veth", "peer", "name", "cbpn"+id)
	ip("link", "set", "cbpn"+id, "netns", n.name)
	ip("addr", "add", n.hostIP+"/30", "dev", n.hostIf)
	ip("link", "set", n.hostIf, "up")
	ip("-n", n.name, "addr", "add", n.nsIP+"/30", "dev", "cbpn"+id)
	ip("-n", n.name, "link", "set", "cbpn"+id, "up")
	ip("-n", n.name, "link", "set", "lo", "up")
	return n
}

// cut cuts the namespace off (false: joins it again).
func (n *netns) cut(t *testing.T, off bool) {
	state := "up"
	if off {
		state = "down"
	}
	out, err := exec.Command("ip", "link", "set", n.hostIf, state).CombinedOutput()
	require.NoError(t, err, "%s", out)
}

// relay makes the etcd members reachable from the namespace: a TCP relay
// on hostIP for each endpoint; it returns the --etcd flag for a server
// there.
func (n *netns) relay(t *testing.T, endpoints []string) string {
	var out []string
	for _, ep := range endpoints {
		target := strings.TrimPrefix(ep, "http://")
		ln, err := net.Listen("tcp", n.hostIP+":0")
		require.NoError(t, err)
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					u, err := net.Dial("tcp", target)
					if err != nil {
						return
					}
					defer u.Close()
					go io.Copy(u, c)
					io.Copy(c, u)
				}()
			}
		}()
		out = append(out, "http://"+ln.Addr().String())
	}
	return strings.Join(out, ",")
}

// TestClusterPartition: the server running the pipeline is cut off from
// etcd (its namespace's link goes down). It stops acting on the pattern,
// the other server takes it over and follows a change; when the link
// comes back the first server rejoins without running anything again.
func TestClusterPartition(t *testing.T) {
	testenv.RequireBwrap(t)
	ns := newNetns(t)
	cl, eps := startCluster(t)
	a := startServeIn(t, []string{"ip", "netns", "exec", ns.name}, t.TempDir(), nil,
		"--pool", "0", "--etcd", ns.relay(t, cl.Endpoints()), "--addr", ns.nsIP+":0")
	b := startServe(t, t.TempDir(), "--pool", "0", "--etcd", eps)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ca := runapi.NewClient(a.url).WithKey(a.key)
	cb := runapi.NewClient(b.url).WithKey(b.key)
	ids, first := startPipeline(t, ctx, ca, cb)
	var err error

	ns.cut(t, true)
	t.Logf("taken over %s after the cut", waitTakeover(t, ctx, cb, time.Now()).Round(time.Millisecond))
	_, err = cb.Set(ctx, "threshold", json.RawMessage(`100`))
	require.NoError(t, err)
	second := waitSummary(t, ctx, cb, first)
	keep := ids.runs("keep")

	ns.cut(t, false)
	// Back: the first server sees the pattern is another's and stays off.
	time.Sleep(8 * time.Second) // a few of its take-over rounds (1 s each) and lease periods
	ins, err := ca.Patterns(ctx)
	require.NoError(t, err)
	assert.Empty(t, ins, "the server that was cut off runs nothing it lost")
	ins, err = cb.Patterns(ctx)
	require.NoError(t, err)
	assert.Len(t, ins, 1, "the pattern stays where it went")
	assert.Equal(t, keep, ids.runs("keep"), "no stage ran again after the link came back")
	assert.Equal(t, 1, ids.runs("clean"), "clean ran once in all")
	s, err := cb.Get(ctx, "summary")
	require.NoError(t, err)
	assert.Equal(t, second, string(s.Value))
}

// hostSwitch sends requests to the host it holds, which a test changes
// between calls: one MCP session's requests reach another server.
type hostSwitch struct {
	key  string
	mu   sync.Mutex
	host string
}

func (h *hostSwitch) set(host string) { h.mu.Lock(); h.host = host; h.mu.Unlock() }

func (h *hostSwitch) RoundTrip(r *http.Request) (*http.Response, error) {
	h.mu.Lock()
	host := h.host
	h.mu.Unlock()
	r = r.Clone(r.Context())
	r.URL.Host, r.Host = host, host
	r.Header.Set("Authorization", "Bearer "+h.key)
	return http.DefaultTransport.RoundTrip(r)
}

// TestClusterMCPSession: an MCP session begun on one server (the official
// Go SDK's client, on /v1/mcp) goes on through another, whose requests
// reach the server it lives on; once that server is dead the session is
// unknown everywhere (404), and a new one begins on the live server.
func TestClusterMCPSession(t *testing.T) {
	testenv.RequireBwrap(t)
	_, eps := startCluster(t)
	a := startServe(t, t.TempDir(), "--pool", "0", "--etcd", eps)
	b := startServe(t, t.TempDir(), "--pool", "0", "--etcd", eps)
	ua, _ := url.Parse(a.url)
	ub, _ := url.Parse(b.url)
	sw := &hostSwitch{key: a.key, host: ua.Host}
	c := mcptest.MustConnect(t, &mcp.StreamableClientTransport{Endpoint: a.url + "/v1/mcp", HTTPClient: &http.Client{Transport: sw}, MaxRetries: -1})
	res := c.Shell(t, "echo one > /workspace/f && cat /workspace/f")
	assert.Equal(t, "one\n", res["stdout"])
	sw.set(ub.Host)
	res = c.Shell(t, "cat /workspace/f")
	assert.Equal(t, "one\n", res["stdout"], "the session's requests through the other server reach its box")

	require.NoError(t, a.cmd.Process.Signal(syscall.SIGKILL))
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := c.CallTool(t.Context(), &mcp.CallToolParams{Name: "shell", Arguments: map[string]any{"command": "true"}})
		if err != nil {
			break // unknown now: the client is told so
		}
		require.True(t, time.Now().Before(deadline), "the dead server's MCP session still answered")
		time.Sleep(200 * time.Millisecond)
	}
	c2 := mcptest.MustConnect(t, mcptest.HTTP(b.url+"/v1/mcp", b.key))
	res = c2.Shell(t, "echo fresh")
	assert.Equal(t, "fresh\n", res["stdout"], "a new MCP session begins on the live server")
}

// cli returns a runner of the cellbox CLI with env added to a clean
// environment; it returns what the command printed.
func cli(t *testing.T) func(env []string, args ...string) (string, error) {
	bin := testenv.CellboxBinary(t)
	return func(env []string, args ...string) (string, error) {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(cleanEnv(), env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
}

// newSession makes a session on the server at url (its key in data) and
// returns its environment: CELLBOX_SERVER, CELLBOX_SESSION, CELLBOX_TOKEN.
func newSession(t *testing.T, url, data string) []string {
	out, err := cli(t)(nil, "session", "new", "--server", url, "--data", data)
	require.NoError(t, err, out)
	var env []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		env = append(env, strings.TrimPrefix(line, "export "))
	}
	require.Len(t, env, 3)
	return env
}

// shellStdout runs a shell tool call and returns its stdout.
func shellStdout(run func([]string, ...string) (string, error), env []string, cmd string) (string, error) {
	out, err := run(env, "tool", "shell", fmt.Sprintf(`{"command":%q}`, cmd))
	if err != nil {
		return out, err
	}
	var res map[string]any
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		return out, err
	}
	s, _ := res["stdout"].(string)
	return s, nil
}

// TestClusterSnapshotAcrossServers: servers sharing an S3 bucket for
// snapshot content (--blobs, a real S3 server): a snapshot taken on the
// server of a session is restored through another once that server is
// dead, into the box that came back empty.
func TestClusterSnapshotAcrossServers(t *testing.T) {
	testenv.RequireBwrap(t)
	_, eps := startCluster(t)
	blobs := s3test.Start(t)
	dataA := t.TempDir()
	a := startServe(t, dataA, "--pool", "0", "--etcd", eps, "--blobs", blobs)
	b := startServe(t, t.TempDir(), "--pool", "0", "--etcd", eps, "--blobs", blobs)
	run := cli(t)
	envA := newSession(t, a.url, dataA)
	envB := append([]string{"CELLBOX_SERVER=" + b.url}, envA[1:]...)
	got, err := shellStdout(run, envA, "mkdir -p src && echo kept > src/notes.txt && head -c 300000 /dev/urandom > src/blob.bin && sha256sum src/blob.bin")
	require.NoError(t, err, got)
	sum := got
	out, err := run(envA, "tool", "snapshot", `{"label":"before"}`)
	require.NoError(t, err, out)
	var snap struct{ ID string }
	require.NoError(t, json.Unmarshal([]byte(out), &snap), out)

	require.NoError(t, a.cmd.Process.Signal(syscall.SIGKILL))
	deadline := time.Now().Add(time.Minute)
	for {
		got, err = shellStdout(run, envB, "ls /workspace")
		if err == nil {
			break
		}
		require.True(t, time.Now().Before(deadline), "the session was never taken over: %v %s", err, got)
		time.Sleep(200 * time.Millisecond)
	}
	assert.NotContains(t, got, "src", "the box came back empty (its server's data dir is gone with it)")
	out, err = run(envB, "tool", "restore", fmt.Sprintf(`{"snapshot":%q}`, snap.ID))
	require.NoError(t, err, out)
	got, err = shellStdout(run, envB, "cat src/notes.txt && sha256sum src/blob.bin")
	require.NoError(t, err, got)
	assert.Equal(t, "kept\n"+sum, got, "restored from the shared bucket through the other server")
}

// TestClusterPausedServer: the server running the pipeline is paused
// (SIGSTOP, as a frozen machine) while a stage runs, past its lease; the
// other takes the pattern over and runs the stage again. When the first
// wakes, the result of its own run, which finished in the box meanwhile,
// is not written: it stops the pattern when it sees the lease lost, and a
// write that comes first is refused by the store (its commits carry the
// lease it lost; server TestFencedWrites makes that case sure). Only the
// new owner's runs show.
func TestClusterPausedServer(t *testing.T) {
	testenv.RequireBwrap(t)
	_, eps := startCluster(t)
	a := startServe(t, t.TempDir(), "--pool", "0", "--etcd", eps)
	b := startServe(t, t.TempDir(), "--pool", "0", "--etcd", eps)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ca := runapi.NewClient(a.url).WithKey(a.key)
	cb := runapi.NewClient(b.url).WithKey(b.key)
	ids, first := startPipeline(t, ctx, ca, cb)
	var err error
	_, err = ca.Set(ctx, "threshold", json.RawMessage(`100`))
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond) // keep runs (for a second) in its box
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGSTOP))
	defer a.cmd.Process.Signal(syscall.SIGCONT)
	waitTakeover(t, ctx, cb, time.Now())
	second := waitSummary(t, ctx, cb, first)
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))
	// Awake: its run's result comes back from the box; it must not land.
	time.Sleep(5 * time.Second)
	assert.Equal(t, 2, ids.runs("keep"), "keep's runs in the store: the first threshold's and the new owner's, not the paused server's")
	s, err := cb.Get(ctx, "summary")
	require.NoError(t, err)
	assert.Equal(t, second, string(s.Value))
	ins, err := ca.Patterns(ctx)
	require.NoError(t, err)
	assert.Empty(t, ins, "the paused server stopped the pattern it lost")
}

// waitTakeover waits until the server of c runs the one pattern, and
// returns how long after since that was.
func waitTakeover(t *testing.T, ctx context.Context, c *runapi.Client, since time.Time) time.Duration {
	t.Helper()
	for {
		ins, err := c.Patterns(ctx)
		require.NoError(t, err)
		if len(ins) == 1 {
			return time.Since(since)
		}
		require.NoError(t, ctx.Err(), "the pattern was never taken over")
		time.Sleep(100 * time.Millisecond)
	}
}

// TestClusterSandboxNodeFailover: the repl example (a sandbox node: a box
// that stays, driven by its run stream, its history and notes file in
// cells) on one server; commands sent through the other; the server
// killed. The other takes the pattern over and the next command runs in a
// new box there, with the history and the synced file carried over.
func TestClusterSandboxNodeFailover(t *testing.T) {
	testenv.RequireBwrap(t)
	_, eps := startCluster(t)
	a := startServe(t, t.TempDir(), "--pool", "0", "--etcd", eps)
	b := startServe(t, t.TempDir(), "--pool", "0", "--etcd", eps)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ca := runapi.NewClient(a.url).WithKey(a.key)
	cb := runapi.NewClient(b.url).WithKey(b.key)
	repl, err := filepath.Abs(filepath.Join("..", "..", "examples", "repl"))
	require.NoError(t, err)
	_, err = ca.Load(ctx, repl, "", "")
	require.NoError(t, err)
	waitCell := func(c *runapi.Client, name, want string) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			cell, err := c.Get(ctx, name)
			if err == nil && string(cell.Value) == want {
				return
			}
			if time.Now().After(deadline) {
				r, _ := c.Get(ctx, "repl")
				t.Fatalf("%s never became %s (last: %v %s); repl: %s", name, want, err, cell.Value, r.Value)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	_, err = cb.Send(ctx, "repl.run", json.RawMessage(`{"command":"echo first >> notes.txt"}`))
	require.NoError(t, err, "a command sent through the other server")
	waitCell(cb, "commands", `1`)
	waitCell(cb, "notes", `"first\n"`)

	require.NoError(t, a.cmd.Process.Signal(syscall.SIGKILL))
	t.Logf("taken over %s after the kill", waitTakeover(t, ctx, cb, time.Now()).Round(time.Millisecond))
	_, err = cb.Send(ctx, "repl.run", json.RawMessage(`{"command":"echo second >> notes.txt; cat notes.txt"}`))
	require.NoError(t, err)
	waitCell(cb, "commands", `2`)
	waitCell(cb, "notes", `"first\nsecond\n"`)
	out, err := cb.Get(ctx, "last_output")
	require.NoError(t, err)
	assert.JSONEq(t, `"first\nsecond\n"`, string(out.Value), "the new box had the synced file")
}

// startPipeline loads the counting pipeline through ca and waits for its
// first summary; ids collects, from every commit cb's server sees, the
// runs of each stage.
func startPipeline(t *testing.T, ctx context.Context, ca, cb *runapi.Client) (*runIDs, string) {
	t.Helper()
	ids := &runIDs{ids: map[string]map[string]bool{}}
	from := uint64(0)
	go cb.Watch(ctx, "", &from, func(bt runapi.Batch) error { ids.add(bt); return nil })
	_, err := ca.Load(ctx, countingPipeline(t), "", "")
	require.NoError(t, err)
	return ids, waitSummary(t, ctx, ca, "")
}
