package kube_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/kube"
	"github.com/cellbox/cellbox/sandbox/kube/kubetest"
)

// up makes and starts a box of spec and waits for its agent.
func up(t *testing.T, b *kube.Backend, spec backend.Spec) *agent.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	spec.AgentBinary = testenv.CellboxBinary(t)
	_, err := b.Create(ctx, spec)
	require.NoError(t, err)
	t.Cleanup(func() { b.Remove(context.Background(), spec.ID) })
	_, err = b.Start(ctx, spec.ID)
	require.NoError(t, err)
	c := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.Dial(ctx, spec.ID) })
	t.Cleanup(func() { c.Close() })
	for {
		rctx, rcancel := context.WithTimeout(ctx, time.Second)
		err := c.WaitReady(rctx)
		rcancel()
		if err == nil {
			return c
		}
		require.NoError(t, ctx.Err(), "agent of %s: %v", spec.ID, err)
	}
}

func run(t *testing.T, c *agent.Client, cmd string) agent.ExecResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := c.Exec(ctx, agent.ExecRequest{Command: cmd, TimeoutMs: 30000}, nil)
	require.NoError(t, err, cmd)
	return r
}

// connect is a shell command that exits 0 if a TCP connection to
// host:port succeeds within 3 seconds.
func connect(host string, port int) string {
	return fmt.Sprintf(`python3 -c 'import socket; socket.create_connection(("%s", %d), timeout=3)'`, host, port)
}

// TestWhatABoxCannotReach: what "What we tried" says of boxes on
// Kubernetes. A box, even one with network, cannot reach another box's
// agent (it listens on the pod's loopback only; the policy denies all
// ingress) nor a server the other box runs on all its addresses; a box
// without network cannot reach the API server; one with network reaches
// it but has no credentials (no service-account token is mounted) and is
// refused.
func TestWhatABoxCannotReach(t *testing.T) {
	kc, ns := kubetest.Setup(t)
	b := kubetest.Open(t, kubetest.Options(t, kc, ns))
	api := apiServer(t, kc)
	host, port, _ := net.SplitHostPort(api)
	netBox := up(t, b, backend.Spec{ID: "sec-net", Network: true})
	quiet := up(t, b, backend.Spec{ID: "sec-quiet"})

	ip := strings.TrimSpace(run(t, quiet, "hostname -I").Stdout)
	require.NotEmpty(t, ip)
	ip = strings.Fields(ip)[0]
	srv := run(t, quiet, "nohup python3 -m http.server 8000 --bind 0.0.0.0 >/dev/null 2>&1 & sleep 1; "+connect("127.0.0.1", 8000)+" && echo up")
	require.Contains(t, srv.Stdout, "up", "the server listens inside its box")

	r := run(t, netBox, connect(ip, 7070))
	assert.NotEqual(t, 0, r.ExitCode, "another box's agent port is not reachable: %s", r.Stderr)
	r = run(t, netBox, connect(ip, 8000))
	assert.NotEqual(t, 0, r.ExitCode, "a server of another box is not reachable (ingress denied): %s", r.Stderr)

	r = run(t, quiet, connect(host, atoi(port)))
	assert.NotEqual(t, 0, r.ExitCode, "a box without network does not reach the API server")
	r = run(t, netBox, "ls /var/run/secrets/kubernetes.io/serviceaccount 2>&1; echo; "+
		fmt.Sprintf(`python3 -c 'import ssl,urllib.request,urllib.error
try:
    urllib.request.urlopen("https://%s/api/v1/namespaces/%s/secrets", context=ssl._create_unverified_context(), timeout=5); print("200")
except urllib.error.HTTPError as e: print(e.code)'`, api, ns))
	assert.Contains(t, r.Stdout, "No such file or directory", "no service-account token in the box")
	assert.Regexp(t, `(?m)^40[13]$`, r.Stdout, "the API server refuses a box with network: %s %s", r.Stdout, r.Stderr)
}

// TestNoNetworkFromTheFirstCommand: a NetworkPolicy holds only once the
// network plugin programs it, some time after the pod starts; the agent
// of a box without network answers no one until it does, so not even a
// new box's first command reaches out.
func TestNoNetworkFromTheFirstCommand(t *testing.T) {
	kc, ns := kubetest.Setup(t)
	b := kubetest.Open(t, kubetest.Options(t, kc, ns))
	host, port, _ := net.SplitHostPort(apiServer(t, kc))
	for _, id := range []string{"first-a", "first-b"} {
		t.Run(id, func(t *testing.T) {
			t.Parallel()
			c := up(t, b, backend.Spec{ID: id})
			r := run(t, c, connect(host, atoi(port))+" && echo REACHED")
			assert.NotContains(t, r.Stdout, "REACHED", "the first command of a box without network reached the API server")
			logs, err := kubetest.Kubectl(kc, "-n", ns, "logs", id, "-c", "box")
			require.NoError(t, err, logs)
			assert.Contains(t, logs, "network policy holds", "the agent waited for its policy before it served")
			t.Log(logs)
		})
	}
}

func atoi(s string) int {
	var n int
	fmt.Sscan(s, &n)
	return n
}

// TestDiskFullIsEviction: a box that writes past its disk size is evicted
// by the kubelet (not refused with ENOSPC), and the backend says so.
func TestDiskFullIsEviction(t *testing.T) {
	kc, ns := kubetest.Setup(t)
	b := kubetest.Open(t, kubetest.Options(t, kc, ns))
	c := up(t, b, backend.Spec{ID: "disk-full", Limits: backend.Limits{DiskBytes: 64 << 20}})
	run(t, c, "dd if=/dev/zero of=/workspace/big bs=1M count=200 2>&1; sync")
	ctx := context.Background()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		in, err := b.Inspect(ctx, "disk-full")
		require.NoError(t, err)
		// The kubelet kills the pod, then writes why: wait for both.
		if in.State != backend.StateRunning && (strings.Contains(in.Exit, "evicted") || time.Now().After(deadline)) {
			assert.Contains(t, in.Exit, "evicted", "why it stopped: %s", in.Exit)
			assert.Contains(t, in.Exit, "not refused with ENOSPC")
			assert.Contains(t, in.Lost, "never slept", "what it lost")
			return
		}
		require.True(t, time.Now().Before(deadline), "the box past its disk size was not evicted")
		time.Sleep(time.Second)
	}
}
