package modtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cellbox/cellbox/internal/testenv"
)

// outsideMain imports the packages another module would and uses one
// symbol of each; cells and runtime reach internal/jsonschema and so the
// patched validator.
const outsideMain = `package main

import (
	"fmt"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/runtime"
	"github.com/cellbox/cellbox/sandboxclient"
)

func main() {
	addr, err := cells.Parse("default/p/c")
	p := runtime.Pattern{Space: "default", Name: "p"}
	var c sandboxclient.Client = sandboxclient.New("http://127.0.0.1:1", "", "")
	fmt.Println(addr, err, p.Name, c != nil)
}
`

// TestOutsideModuleBuilds proves cellbox is importable by another module:
// a module in a temp dir (example.com/outside) requires cellbox, pointed at
// this working tree by a replace of its own, and go build and go vet pass
// on a main package importing cells, runtime and sandboxclient. A replace
// in cellbox's own go.mod would not apply there (Go ignores the replace
// directives of dependencies), so whatever cellbox needs must resolve from
// its requirements alone. Modules come from GOPROXY as the environment
// sets it; go.sum is filled in by -mod=mod. The binary built is run once.
func TestOutsideModuleBuilds(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module: skipped with -short")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		testenv.Missing(t, "the go command")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(gomod)
	if m == nil {
		t.Fatalf("no go directive in %s/go.mod", root)
	}

	dir := t.TempDir()
	mod := "module example.com/outside\n\ngo " + string(m[1]) + "\n\n" +
		"require github.com/cellbox/cellbox v0.0.0\n\n" +
		"replace github.com/cellbox/cellbox => " + root + "\n"
	for name, content := range map[string]string{"go.mod": mod, "main.go": outsideMain} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	env := append(os.Environ(),
		"GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -mod=mod"),
		"GOWORK=off",
	)
	for _, args := range [][]string{
		{"build", "-o", filepath.Join(dir, "outside"), "."},
		{"vet", "."},
	} {
		cmd := exec.Command(goBin, args...)
		cmd.Dir = dir
		cmd.Env = env
		start := time.Now()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s in the outside module: %v\n%s\ngo.mod:\n%s", strings.Join(args, " "), err, out, mod)
		}
		t.Logf("go %s: %v", strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
	}

	out, err := exec.Command(filepath.Join(dir, "outside")).CombinedOutput()
	if want := "default/p/c <nil> p true\n"; err != nil || string(out) != want {
		t.Fatalf("the outside binary: %v, printed %q, want %q", err, out, want)
	}
}
