package kube_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/kube/kubetest"
	"github.com/cellbox/cellbox/sandbox/previews"
	"github.com/cellbox/cellbox/sandbox/sandboxtest"
)

// TestWorkflowAndNodeDeath runs the README's multi-box workflow (build in
// one box, fork three, try three fixes, keep the one whose tests pass,
// transfer between boxes; then branch and restore a snapshot, and preview
// a server in a box) with every box a pod of the two-node cluster, then
// kills the node that holds most of them (its kubelet, container
// runtime and pods, kill -9): the next call on each box brings it back on
// the other node with every file it had, and says what happened.
func TestWorkflowAndNodeDeath(t *testing.T) {
	kc, ns := kubetest.SetupAlone(t)
	be := kubetest.Open(t, kubetest.Options(t, kc, ns))
	svc, _ := sandboxtest.Service(t, sandboxtest.Options{Backend: be, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	call, sid := sandboxtest.Caller(t, svc)
	call("write_file", map[string]any{"sandbox": "build", "path": "app/calc.py", "content": "def add(a, b):\n    return a - b\n"})
	call("write_file", map[string]any{"sandbox": "build", "path": "app/test_calc.py", "content": "from calc import add\nassert add(2, 3) == 5, add(2, 3)\nprint(\"tests pass\")\n"})
	snap := call("snapshot", map[string]any{"sandbox": "build", "label": "before the fix"})
	fork := call("fork", map[string]any{"sandbox": "build", "count": 3, "names": []string{"fix1", "fix2", "fix3"}})
	assert.Equal(t, "tar", fork["method"], "fork copies files through the agents on Kubernetes")
	fixes := map[string]string{"fix1": "a * b", "fix2": "a + b", "fix3": "b - a"}
	var codes []any
	for _, b := range []string{"fix1", "fix2", "fix3"} {
		call("str_replace", map[string]any{"sandbox": b, "path": "app/calc.py", "old_str": "a - b", "new_str": fixes[b]})
		res := call("shell", map[string]any{"sandbox": b, "command": "cd app && python3 -B test_calc.py"})
		codes = append(codes, res["exit_code"])
	}
	assert.Equal(t, []any{1.0, 0.0, 1.0}, codes, "fix2 passes")
	call("transfer", map[string]any{"from_sandbox": "fix2", "from_path": "app", "to_sandbox": "web", "to_path": "site", "recursive": true})
	got := call("read_file", map[string]any{"sandbox": "web", "path": "site/calc.py"})
	assert.Contains(t, fmt.Sprint(got["content"]), "a + b")

	// A snapshot (through the agent) comes back as a new box, on
	// whichever node the scheduler picks, and over a box that changed.
	call("branch", map[string]any{"snapshot": snap["id"], "name": "retry"})
	assert.Contains(t, fmt.Sprint(call("read_file", map[string]any{"sandbox": "retry", "path": "app/calc.py"})["content"]), "a - b")
	call("write_file", map[string]any{"sandbox": "retry", "path": "app/calc.py", "content": "broken"})
	call("restore", map[string]any{"sandbox": "retry", "snapshot": snap["id"]})
	assert.Contains(t, fmt.Sprint(call("read_file", map[string]any{"sandbox": "retry", "path": "app/calc.py"})["content"]), "a - b")

	// A preview of a server in a pod: through the agent, over the API
	// server's port-forward.
	svc.SetBaseURL("http://127.0.0.1:7070")
	call("shell", map[string]any{"sandbox": "web", "command": "cd site && python3 -m http.server 8000 --bind 127.0.0.1", "background": true})
	require.Equal(t, true, call("wait_port", map[string]any{"sandbox": "web", "port": 8000})["listening"])
	browse := call("browse", map[string]any{"sandbox": "web", "port": 8000})
	u, err := url.Parse(fmt.Sprint(browse["url"]))
	require.NoError(t, err)
	pid, ok := previews.IDFromHost(u.Host)
	require.True(t, ok, "a preview URL: %v", browse)
	assert.Contains(t, getPreview(t, svc, pid, "/calc.py"), "a + b", "the preview serves the box's file")

	want := map[string]string{"build": "a - b", "fix1": "a * b", "fix2": "a + b", "fix3": "b - a", "web": "a + b", "retry": "a - b"}
	paths := map[string]string{"build": "app/calc.py", "fix1": "app/calc.py", "fix2": "app/calc.py", "fix3": "app/calc.py", "web": "site/calc.py", "retry": "app/calc.py"}
	// Every box was used: within a reaper round or two its workspace is
	// kept (checkpointed) through its agent.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, err := kubetest.Kubectl(kc, "-n", ns, "get", "secrets", "-l", "app.kubernetes.io/managed-by=cellbox",
			"-o", `jsonpath={range .items[*]}{.metadata.annotations.cellbox\.dev/kept}{"\n"}{end}`)
		require.NoError(t, err, out)
		lines := strings.Split(out, "\n")
		if len(lines) == len(want) && !strings.Contains("\n"+out+"\n", "\n\n") {
			break
		}
		require.True(t, time.Now().Before(deadline), "every box checkpointed: %q", out)
		time.Sleep(time.Second)
	}
	nodes := podNodes(t, kc, ns)
	count := map[string]int{}
	for _, n := range nodes {
		count[n]++
	}
	victim := "cbk-n1"
	if count["cbk-n2"] > count["cbk-n1"] {
		victim = "cbk-n2"
	}
	require.Positive(t, count[victim])
	n := strings.TrimPrefix(victim, "cbk-n")
	// A call under way on a box of the node when it dies.
	var inFlight string
	for name, node := range nodes {
		if node == victim {
			inFlight = name
		}
	}
	midCall := make(chan map[string]any, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		res, err := svc.CallTool(ctx, sid, "shell", []byte(`{"sandbox": "`+inFlight+`", "command": "echo started; sleep 60; echo finished"}`))
		var out map[string]any
		if err == nil {
			err = json.Unmarshal(res, &out)
		}
		if err != nil {
			out = map[string]any{"go error": err.Error()}
		}
		midCall <- out
	}()
	time.Sleep(3 * time.Second) // the command runs
	t.Logf("boxes on nodes %v; killing %s while %s runs a command", nodes, victim, inFlight)
	kubetest.Script(t, "kill-node", n)
	t.Cleanup(func() { kubetest.Script(t, "start-node", n) })
	select {
	case out := <-midCall:
		t.Logf("the call under way: %v", out)
		assert.Equal(t, true, out["is_error"], "the call under way on the dead node fails: %v", out)
		assert.NotContains(t, fmt.Sprint(out), "finished")
	case <-time.After(2 * time.Minute):
		t.Fatal("a call under way on a node that died did not end within 2 minutes")
	}

	for name, w := range want {
		res := call("shell", map[string]any{"sandbox": name, "command": "cat " + paths[name]})
		assert.Contains(t, fmt.Sprint(res["stdout"]), w, "box %s keeps its files", name)
		if nodes[name] == victim {
			assert.Contains(t, fmt.Sprint(res["notice"]), "died", "box %s: the call says its box died and came back", name)
		}
	}
	for name, node := range podNodes(t, kc, ns) {
		assert.NotEqual(t, victim, node, "box %s runs on the node that lives", name)
	}
}

// TestAllowListOnKubernetes: a box with a network allow list reaches
// what its list allows and nothing else, through the server's egress
// proxy; the pod itself has no egress at all (its agent carries the box's
// connections back over connections the server lends it through the API
// server).
func TestAllowListOnKubernetes(t *testing.T) {
	kc, ns := kubetest.Setup(t)
	be := kubetest.Open(t, kubetest.Options(t, kc, ns))
	svc, _ := sandboxtest.Service(t, sandboxtest.Options{Backend: be})
	sandboxtest.AllowList(t, svc)
}

// getPreview is the body of GET path from preview id, through
// Service.OpenPreview as the HTTP API's proxy does it.
func getPreview(t *testing.T, svc *sandbox.Service, id, path string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := svc.OpenPreview(ctx, id)
	require.NoError(t, err)
	defer p.Release()
	conn, err := p.Dial(ctx)
	require.NoError(t, err)
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Minute))
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: box\r\nConnection: close\r\n\r\n", path)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	return string(body)
}

// podNodes maps each box's name (the cellbox.box label) to its pod's node.
func podNodes(t *testing.T, kc, ns string) map[string]string {
	out, err := kubetest.Kubectl(kc, "-n", ns, "get", "pods", "-l", "app.kubernetes.io/managed-by=cellbox",
		"-o", `jsonpath={range .items[*]}{.metadata.labels.cellbox\.box}{" "}{.spec.nodeName}{"\n"}{end}`)
	require.NoError(t, err, out)
	m := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 2 {
			m[f[0]] = f[1]
		}
	}
	return m
}
