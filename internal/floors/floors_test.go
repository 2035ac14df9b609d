package floors

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cellbox/cellbox/internal/testenv"
)

const module = "github.com/cellbox/cellbox"

// floor is one floor of the house: its packages (paths in the module; "x/..."
// is x and every package below it) and the floors its packages may import.
// A package may always import its own floor, the standard library and
// third-party modules; test files are not checked (an external test may
// build on anything).
type floor struct {
	name string
	pkgs []string
	may  []string
}

// house is cellbox's floors, top to bottom.
var house = []floor{
	// The binaries (cellbox: serve, run, tool, mcp, image, agent...;
	// cellbox-bench): everything is below them. examples holds only tests
	// of the whole.
	{"cmd", []string{"cmd/...", "examples"},
		[]string{"server", "patterns", "builtins", "runtime", "cells", "sandboxclient", "sandbox", "tools", "warm", "previews", "snapshots", "state", "blobs", "backends", "box", "wire", "internal"}},
	// The server as a library: the composition root (a data dir's state,
	// the backend, the sandbox service, the runtime host, the guard of
	// what it serves), the runtime's HTTP API and its client, the web
	// page. It composes the floors below; only the binaries are above it.
	{"server", []string{"server/..."},
		[]string{"patterns", "builtins", "runtime", "cells", "sandboxclient", "sandbox", "tools", "warm", "previews", "snapshots", "state", "blobs", "backends", "box", "wire", "internal"}},
	// The pattern compiler: YAML and Go → a runtime graph of built-ins. It
	// knows the sandbox side only by its wire types (a box's network).
	{"patterns", []string{"patterns/..."},
		[]string{"builtins", "runtime", "cells", "wire", "internal"}},
	// The node kinds (computed, exec, sandbox, llm, fetch) and the model
	// clients; they reach boxes only through sandboxclient.
	{"builtins", []string{"builtins/..."},
		[]string{"runtime", "cells", "sandboxclient", "wire", "internal"}},
	// The graph and its scheduler.
	{"runtime", []string{"runtime/..."}, []string{"cells", "internal"}},
	// Cell values, versions, stores, and their test support.
	{"cells", []string{"cells/..."}, []string{"internal"}},
	// The Client the built-ins use (the one way from the runtime's side to
	// the boxes) and clienttest, the suite its implementations pass. It
	// never knows about backends.
	{"sandboxclient", []string{"sandboxclient/..."},
		[]string{"sandbox", "wire", "internal"}},
	// The sandbox service (sessions, pool, tool registry), its HTTP and MCP
	// faces, and sandboxtest, which starts the service for the tests of the
	// packages above (as net/http/httptest does for net/http).
	{"sandbox", []string{"sandbox", "sandbox/httpapi", "sandbox/mcpserver", "sandbox/sandboxtest"},
		[]string{"tools", "warm", "previews", "snapshots", "state", "blobs", "backends", "box", "wire", "internal"}},
	// The tool registry's machinery (defining a tool, its schema from its
	// input struct, decoding and checking a call's input, profiles, result
	// objects) and the box tools' handlers (shell, process, files, code,
	// wait_port), which reach a box through its agent, leased by the
	// caller's tools.Call. It knows nothing of sessions, pools or backends.
	{"tools", []string{"sandbox/tools"}, []string{"box", "wire", "internal"}},
	// The warm pools: boxes made ahead, taken ready, refilled, shrunk and
	// drained. A box is whatever the caller's Make returns.
	{"warm", []string{"sandbox/warm"}, []string{"internal"}},
	// Preview addressing (ids, their own origins ID.localhost, URLs) and
	// the table of ids; the server's guard reads a Host with it.
	{"previews", []string{"sandbox/previews"}, []string{"internal"}},
	// The snapshot store: workspaces captured from a box's tar stream into
	// blobs (a namespace per session) with a manifest and a record in the
	// state store, written back as a tar, and the collection of blobs no
	// snapshot names. It knows a box only as the tar stream of its
	// workspace and the settings the sandbox floor stores with a snapshot.
	{"snapshots", []string{"sandbox/snapshots"},
		[]string{"state", "blobs", "backends", "box", "wire", "internal"}},
	// The sandbox service's state contract (records by kind with
	// revisions, guarded commits, reservations for caps), its bbolt and
	// in-memory stores, and statetest, the suite they pass. It knows
	// nothing of what the records mean.
	{"state", []string{"sandbox/state/...", "sandbox/lease/..."}, []string{"internal"}},
	// The contract of the snapshots' content (blobs named by their
	// SHA-256, in namespaces), its directory store, and blobstest, the
	// suite every store passes. It knows nothing of snapshots or sessions.
	{"blobs", []string{"sandbox/blobs/..."}, []string{"internal"}},
	// The Backend contract (with backendtest, its suite, and its disk, uid
	// and seccomp helpers), the Docker and bubblewrap backends, images,
	// and the agent's command line (agentcmd: the agent as the backends
	// start it, in cellbox and cellbox-agent).
	{"backends", []string{"sandbox/backend/...", "sandbox/docker/...", "sandbox/local", "sandbox/image", "sandbox/kube/...", "sandbox/agent/agentcmd"},
		[]string{"box", "wire", "internal"}},
	// What a box runs and is reached through besides its backend: the
	// in-box agent and its client, the egress proxy, text edits.
	{"box", []string{"sandbox/agent", "sandbox/egress", "sandbox/textedit"},
		[]string{"wire", "internal"}},
	// The wire types both sides share: the tools' inputs and results, their
	// errors, a box's network rules and their checks.
	{"wire", []string{"sandbox/api"}, []string{"internal"}},
	// Leaves usable from anywhere: they import only each other, never a
	// package of a floor (a helper that starts a service lives on that
	// service's floor).
	{"internal", []string{"internal/..."}, nil},
}

// floorOf returns the floor of a package path relative to the module.
func floorOf(rel string) (floor, bool) {
	for _, f := range house {
		if slices.ContainsFunc(f.pkgs, func(p string) bool { return matches(p, rel) }) {
			return f, true
		}
	}
	return floor{}, false
}

// matches reports whether a table entry ("x" or "x/...") names rel.
func matches(p, rel string) bool {
	if dir, ok := strings.CutSuffix(p, "/..."); ok {
		return rel == dir || strings.HasPrefix(rel, dir+"/")
	}
	return rel == p
}

// testSupport reports whether a package exists for tests (sandboxtest,
// clienttest, backendtest, testenv...): its name starts or ends with
// "test".
func testSupport(rel string) bool {
	base := path.Base(rel)
	return strings.HasPrefix(base, "test") || strings.HasSuffix(base, "test")
}

// statSources stats every .go file of the module under root. go list
// reads them in a process of its own, which Go's test cache does not
// watch; the files this process stats are part of the cached result's
// key, so a change of any import makes the test run again instead of
// answering "ok (cached)".
func statSources(t *testing.T, root string) {
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() && path != root {
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // a module of its own (scripts/kube)
			}
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") {
			_, err = os.Stat(path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

type pkg struct {
	ImportPath string
	Imports    []string
	Error      *struct{ Err string }
}

// packages lists the module's packages with their imports (go list: test
// files' imports are not among them).
func packages(t *testing.T) []pkg {
	goBin := testenv.RequireCommand(t, "go")
	statSources(t, testenv.RepoRoot())
	cmd := exec.Command(goBin, "list", "-e", "-json=ImportPath,Imports,Error", "./...")
	cmd.Dir = testenv.RepoRoot()
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		if p.Error != nil {
			t.Errorf("%s: %s", p.ImportPath, p.Error.Err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 {
		t.Fatal("go list found no packages")
	}
	return pkgs
}

// TestFloors checks that no package reaches up a floor or across to a
// floor it may not know (DESIGN.md, "The house"), and that no package but
// a test-support one imports a test-support package. A package missing
// from the table fails too: give it a floor.
func TestFloors(t *testing.T) {
	pkgs := packages(t)
	used := map[string]bool{}
	for _, p := range pkgs {
		rel, ok := strings.CutPrefix(p.ImportPath, module+"/")
		if !ok {
			t.Errorf("%s: not in module %s", p.ImportPath, module)
			continue
		}
		f, ok := floorOf(rel)
		if !ok {
			t.Errorf("%s has no floor: add it to the table in this test", rel)
			continue
		}
		for _, q := range f.pkgs {
			used[q] = used[q] || matches(q, rel)
		}
		for _, imp := range p.Imports {
			irel, ok := strings.CutPrefix(imp, module+"/")
			if !ok {
				continue // the standard library or another module
			}
			g, ok := floorOf(irel)
			if !ok {
				continue // reported as that package's own missing floor
			}
			if g.name != f.name && !slices.Contains(f.may, g.name) {
				t.Errorf("%s (floor %s) imports %s (floor %s); %s may import only %s", rel, f.name, irel, g.name, f.name, mayList(f))
			}
			if testSupport(irel) && !testSupport(rel) {
				t.Errorf("%s imports the test-support package %s: only tests and other test-support packages may", rel, irel)
			}
		}
	}
	for _, f := range house {
		for _, q := range f.pkgs {
			if !used[q] {
				t.Errorf("floor %s names %s, which matches no package: remove it from the table", f.name, q)
			}
		}
	}
}

func mayList(f floor) string {
	if len(f.may) == 0 {
		return "its own floor"
	}
	return "its own floor and " + strings.Join(f.may, ", ")
}

// TestFloorOf checks the table's matching on a few paths.
func TestFloorOf(t *testing.T) {
	for rel, want := range map[string]string{
		"cmd/cellbox":                 "cmd",
		"cmd/cellbox-bench":           "cmd",
		"server":                      "server",
		"server/runapi":               "server",
		"builtins/llm":                "builtins",
		"sandbox":                     "sandbox",
		"sandbox/egress":              "box",
		"sandbox/snapshots":           "snapshots",
		"sandbox/tools":               "tools",
		"sandbox/warm":                "warm",
		"sandbox/previews":            "previews",
		"sandbox/state":               "state",
		"sandbox/state/statetest":     "state",
		"sandbox/blobs":               "blobs",
		"sandbox/blobs/blobstest":     "blobs",
		"sandbox/backend":             "backends",
		"sandbox/backend/backendtest": "backends",
		"sandboxclient/clienttest":    "sandboxclient",
		"internal/testenv":            "internal",
		"patternsx":                   "",
	} {
		f, _ := floorOf(rel)
		if f.name != want {
			t.Errorf("floorOf(%q) = %q, want %q", rel, f.name, want)
		}
	}
	for rel, want := range map[string]bool{"internal/boxtest": true, "internal/testenv": true, "sandbox/backend/backendtest": true, "sandbox": false, "internal/textcut": false} {
		if got := testSupport(rel); got != want {
			t.Errorf("testSupport(%q) = %v, want %v", rel, got, want)
		}
	}
}

// TestCellboxLinksNoClusterClients: cellbox itself starts without the
// cluster's clients (etcd's gRPC, client-go, minio: twice the binary and
// ~10 ms of every command's start); they are linked only into
// cellbox-cluster (-tags cluster), which cellbox execs for --etcd and the
// kubernetes backend (server/shared.go). A package of cellbox's that
// imports one of them again fails here.
func TestCellboxLinksNoClusterClients(t *testing.T) {
	goBin := testenv.RequireCommand(t, "go")
	deps := func(tags ...string) []string {
		args := append(append([]string{"list", "-deps"}, tags...), "./cmd/cellbox")
		cmd := exec.Command(goBin, args...)
		cmd.Dir = testenv.RepoRoot()
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go %s: %v", strings.Join(args, " "), err)
		}
		return strings.Fields(string(out))
	}
	clients := []string{"k8s.io/", "go.etcd.io/etcd/", "github.com/minio/", "google.golang.org/grpc", module + "/server/cluster"}
	client := func(p string) bool {
		return slices.ContainsFunc(clients, func(c string) bool { return strings.HasPrefix(p, c) })
	}
	for _, p := range deps() {
		if client(p) {
			t.Errorf("cellbox links %s: the cluster's clients belong to cellbox-cluster alone (import them from server/cluster)", p)
		}
	}
	// The cluster build has them: the test would pass on a list that
	// names nothing.
	if !slices.ContainsFunc(deps("-tags", "cluster"), client) {
		t.Errorf("cellbox -tags cluster links none of %v", clients)
	}
}
