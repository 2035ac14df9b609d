package patterns

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"
)

// TestDocsExamples loads every YAML example of docs/patterns.md: whole
// patterns as they are, fragments inside a pattern that provides the cells
// they read.
func TestDocsExamples(t *testing.T) {
	doc, err := os.ReadFile("../docs/patterns.md")
	require.NoError(t, err)
	fsys := fstest.MapFS{}
	for _, f := range []string{"data.csv", "clean.py", "filter.py", "tsconfig.json"} {
		fsys[f] = &fstest.MapFile{Data: []byte("x")}
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(doc), -1)
	require.GreaterOrEqual(t, len(blocks), 6)
	for i, m := range blocks {
		src := m[1]
		switch {
		case regexp.MustCompile(`(?m)^name:`).MatchString(src):
		case strings.HasPrefix(src, "cells:"):
			src = "name: docs\n" + src
		case strings.HasPrefix(src, "nodes:"):
			src = "name: docs\ncells: {threshold: 1}\n" + src
		default: // node fragments
			src = "name: docs\ncells: {threshold: 1, level: 1, source: s, config: {value: {}}, big: {value: {}}}\nnodes:\n" + src
		}
		_, err := Parse("docs/patterns.md", []byte(src), fsys)
		require.NoError(t, err, "example %d:\n%s", i+1, src)
	}
}
