package patterns

import (
	"errors"
	"os"
	"testing"
	"testing/fstest"
)

// FuzzParse checks that no input makes the loader panic, and that every
// input gives either a pattern or a list of errors that each name the file.
func FuzzParse(f *testing.F) {
	csv, err := os.ReadFile("testdata/csv/pattern.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(csv)
	for _, s := range []string{
		"",
		"name: x\n  bad: [\n",
		"name: x\ncells: {a: &a [1, *a]}\n",
		"name: x\nnodes:\n  a: {computed: '${b}'}\n  b: {computed: '${a}'}\n",
		"name: x\nnodes:\n  e:\n    exec:\n      command: [\"a ${x\", ${y}]\n      files: {/o: text, /i: {file: f}}\n",
		"name: x\ncells:\n  c: {value: 1, schema: {type: string}}\n",
		"name: x\nnodes:\n  s:\n    sandbox: {image: ${i}, env: {A: ${s.files[\"/x\"]}}, files: {/x: json}}\n",
		"{a: !!binary aGk=, b: 2001-12-14t21:59:43.10-05:00, <<: {x: 1}}",
	} {
		f.Add([]byte(s))
	}
	fsys := fstest.MapFS{"f": {Data: []byte("x")}}
	f.Fuzz(func(t *testing.T, src []byte) {
		p, err := Parse("p.yaml", src, fsys)
		if (p == nil) == (err == nil) {
			t.Fatalf("want a pattern or an error, got %v and %v", p, err)
		}
		var list ErrorList
		if err != nil && (!errors.As(err, &list) || len(list) == 0) {
			t.Fatalf("error is not a non-empty ErrorList: %v", err)
		}
		for _, e := range list {
			if e.Pos.File != "p.yaml" || e.Msg == "" {
				t.Fatalf("error without file or message: %#v", e)
			}
		}
	})
}
