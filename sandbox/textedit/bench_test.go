package textedit

import (
	"fmt"
	"strings"
	"testing"
)

func bigFile() []byte {
	var sb strings.Builder
	for i := 0; sb.Len() < 2<<20; i++ {
		fmt.Fprintf(&sb, "\tline %d: some typical source code text here\n", i)
	}
	return []byte(sb.String())
}

func BenchmarkEditExact2MiB(b *testing.B) {
	f := bigFile()
	for b.Loop() {
		if _, err := Edit(f, []Replacement{{"line 30000: some", "line 30000: other"}}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEditFuzzy2MiB(b *testing.B) {
	f := bigFile()
	for b.Loop() {
		res, err := Edit(f, []Replacement{{"    line 30000:  some", "    line 30000: other"}})
		if err != nil || len(res.Fuzzy) != 1 {
			b.Fatal(err)
		}
	}
}

func BenchmarkUnifiedDiffRewrite(b *testing.B) {
	var x, y strings.Builder
	for i := range 20000 {
		fmt.Fprintf(&x, "old %d\n", i)
		fmt.Fprintf(&y, "new %d\n", i)
	}
	for b.Loop() {
		UnifiedDiff("f", []byte(x.String()), []byte(y.String()), 3)
	}
}
