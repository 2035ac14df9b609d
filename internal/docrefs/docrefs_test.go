// Package docrefs holds a test of the docs: every test and benchmark the
// README and docs/ name as the proof of a claim exists in the code, so a
// renamed or removed test cannot leave a claim pointing at nothing.
package docrefs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/cellbox/cellbox/internal/testenv"
)

var (
	named    = regexp.MustCompile(`\b(?:Test|Benchmark|Fuzz)[A-Z][A-Za-z0-9_]*`)
	declared = regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz)[A-Z][A-Za-z0-9_]*)\(`)
)

func TestDocsNameTestsThatExist(t *testing.T) {
	root := testenv.RepoRoot()
	funcs := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range declared.FindAllSubmatch(b, -1) {
			funcs[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(funcs) < 100 {
		t.Fatalf("found %d test functions under %s: is it the repository?", len(funcs), root)
	}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, filepath.Join(root, "README.md"))
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		var missing []string
		for _, lineText := range strings.Split(string(b), "\n") {
			for _, at := range named.FindAllStringIndex(lineText, -1) {
				name := lineText[at[0]:at[1]]
				if funcs[name] || slices.Contains(missing, name) {
					continue
				}
				// A -run pattern names a prefix of tests.
				if strings.HasSuffix(strings.TrimRight(lineText[:at[0]], "'\"^"), "-run ") && prefixOfAny(name, funcs) {
					continue
				}
				missing = append(missing, name)
			}
		}
		rel, _ := filepath.Rel(root, doc)
		for _, name := range missing {
			t.Errorf("%s names %s, which no _test.go file declares: name the test that proves the claim now (renamed? moved?)", rel, name)
		}
	}
}

func prefixOfAny(prefix string, funcs map[string]bool) bool {
	for f := range funcs {
		if strings.HasPrefix(f, prefix) {
			return true
		}
	}
	return false
}
