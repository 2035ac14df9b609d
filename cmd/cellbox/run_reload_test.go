package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/internal/testenv"
	"github.com/cellbox/cellbox/sandbox/sandboxtest"
)

// TestRunReloadsEditedPattern: editing pattern.yaml while `cellbox run`
// is live reloads it, as a dev server reloads on a save: a changed
// expression recomputes, a cell whose stored value the new schema refuses
// starts anew (said in the view), and an edit that does not load leaves
// the pattern running as it was, saying so. It used to have no effect and
// say nothing.
func TestRunReloadsEditedPattern(t *testing.T) {
	dir := writePattern(t, sumPattern)
	file := filepath.Join(dir, "pattern.yaml")
	data := filepath.Join(t.TempDir(), "data")
	p := startRun(t, dir, "--data", data)
	get := func(name string) string {
		out, _, err := cellbox(t, "cell", "get", name, "--data", data)
		if err != nil {
			return ""
		}
		return strings.TrimSpace(out)
	}
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute) // a safety net: the test waits for the event
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("waited in vain for %s; the run said:\n%s", what, p.out.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitUntil("total = 3", func() bool { return get("total") == "3" })

	// An editor's save: a new file renamed over the old one.
	save := func(yaml string) {
		tmp := file + ".swp"
		require.NoError(t, os.WriteFile(tmp, []byte(yaml), 0o644))
		require.NoError(t, os.Rename(tmp, file))
	}
	save(strings.Replace(sumPattern, "${a + b}", "${a + b + 100}", 1))
	waitUntil("the edited expression", func() bool { return get("total") == "103" && get("double") == "206" })
	assert.Contains(t, p.out.String(), "reloaded "+file)

	// A schema the stored value breaks: the cell starts from the pattern.
	_, errOut, err := cellbox(t, "cell", "set", "b", "50", "--data", data)
	require.NoError(t, err, errOut)
	waitUntil("b = 50", func() bool { return get("total") == "151" })
	save(strings.Replace(strings.Replace(sumPattern, "${a + b}", "${a + b + 100}", 1), "minimum: 0", "minimum: 0, maximum: 9", 1))
	waitUntil("the reset said", func() bool { return strings.Contains(p.out.String(), "cell b reset") })
	waitUntil("b from the pattern again", func() bool { return get("b") == "2" && get("total") == "103" })

	// An edit that does not load: said, and the pattern runs on.
	require.NoError(t, os.WriteFile(file, []byte("name: calc\nnodes:\n  total: {computed: '${a +'}\n"), 0o644))
	waitUntil("the refusal said", func() bool { return strings.Contains(p.out.String(), "does not load; the pattern runs on as it was") })
	_, errOut, err = cellbox(t, "cell", "set", "a", "5", "--data", data)
	require.NoError(t, err, errOut)
	waitUntil("the old version to compute", func() bool { return get("total") == "107" })
}

// TestRunOnceWaitsForServers: `run --once` of a pattern whose sandbox
// node keeps a start: server fails, saying why with the server's output,
// when the server crash-loops (it exited 0 at once), and succeeds once a
// good server is up.
func TestRunOnceWaitsForServers(t *testing.T) {
	testenv.RequireBwrap(t)
	for _, tc := range []struct {
		name, start string
		ok          bool
	}{
		{"crash-looping", "{command: 'echo boom >&2; exit 3', port: 8000}", false},
		{"crash-looping without a port", "{command: 'echo boom >&2; exit 3'}", false},
		{"up", "{command: 'python3 -m http.server 8000', port: 8000}", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pattern := writePattern(t, "name: srv\nnodes:\n  web:\n    sandbox:\n      start: "+tc.start+"\n")
			data, err := os.MkdirTemp("", "cbr-") // short: box sockets go under it
			require.NoError(t, err)
			t.Cleanup(func() { sandboxtest.RemoveBoxes(t, data); os.RemoveAll(data) })
			out, errOut, err := cellbox(t, "run", pattern, "--once", "--data", data, "--backend", "local")
			if tc.ok {
				require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", out, errOut)
				return
			}
			assert.Equal(t, 1, exitCode(t, err), "stdout:\n%s\nstderr:\n%s", out, errOut)
			assert.Contains(t, errOut, "node web: its server (echo boom >&2; exit 3) did not come up: exited with 3")
			assert.Contains(t, errOut, "boom")
		})
	}
}
