package builtins_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/runtime"
)

// The CSV pipeline of patterns/testdata/csv, with working scripts: clean,
// filter by a threshold cell, summarize.
const csvPattern = `
name: csv-pipeline
cells:
  threshold: 10
  raw: {file: data.csv}
nodes:
  clean:
    exec:
      command: python3 /workspace/clean.py
      env: {LC_ALL: C.UTF-8}
      files:
        /workspace/in.csv: ${raw}
        /workspace/clean.py: {file: clean.py}
        /workspace/out.csv: text
        /workspace/stats.json: json
  big:
    exec:
      command:
        - python3 /workspace/filter.py --min ${threshold}
        - wc -l < /workspace/big.csv
      timeout: 30s
      files:
        /workspace/in.csv: ${clean.result.files["/workspace/out.csv"]}
        /workspace/filter.py: {file: filter.py}
        /workspace/big.csv: text
  ok: {computed: '${clean.result?.exit_code == 0 && big.result?.exit_code == 0}'}
  summary:
    computed: 'rows over ${threshold}: ${big.result?.files["/workspace/big.csv"] ?? "pending"}'
`

var csvFiles = map[string]string{
	"data.csv": "name,value\na, 5\nb,20\n c,15\n\nd,x\ne,30\n",
	"clean.py": `import csv, json
rows, dropped = [], 0
with open("/workspace/in.csv") as f:
    for row in csv.reader(f):
        row = [c.strip() for c in row]
        if not any(row):
            continue
        if rows and not row[1].isdigit():
            dropped += 1
            continue
        rows.append(row)
with open("/workspace/out.csv", "w") as f:
    csv.writer(f, lineterminator="\n").writerows(rows)
json.dump({"rows": len(rows) - 1, "dropped": dropped}, open("/workspace/stats.json", "w"))
`,
	"filter.py": `import argparse, csv, time
p = argparse.ArgumentParser()
p.add_argument("--min", type=int)
a = p.parse_args()
if a.min == 13:
    time.sleep(3)  # a slow stage, to stop the runner in the middle of it
rows = list(csv.reader(open("/workspace/in.csv")))
with open("/workspace/big.csv", "w") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(rows[0])
    w.writerows(r for r in rows[1:] if int(r[1]) > a.min)
`,
}

func TestCSVPipeline(t *testing.T) {
	b := newBox(t)
	store, err := cells.OpenBolt(filepath.Join(t.TempDir(), "cells.db"), cells.Options{NoSync: true})
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	r := b.loadOn(t, store, csvPattern, csvFiles)
	r.settle()

	clean := r.exec("clean")
	require.Nil(t, clean.Error)
	assert.Equal(t, "name,value\na,5\nb,20\nc,15\ne,30\n", clean.Result.Files["/workspace/out.csv"])
	stats, _ := json.Marshal(clean.Result.Files["/workspace/stats.json"])
	assert.JSONEq(t, `{"rows": 4, "dropped": 1}`, string(stats))
	big := r.exec("big")
	require.Nil(t, big.Error)
	assert.Equal(t, "name,value\nb,20\nc,15\ne,30\n", big.Result.Files["/workspace/big.csv"])
	assert.Equal(t, "4\n", big.Result.Stdout)
	var ok bool
	r.get("ok", &ok)
	assert.True(t, ok)
	summary := func() string {
		var s string
		r.get("summary", &s)
		return s
	}
	assert.Equal(t, "rows over 10: name,value\nb,20\nc,15\ne,30\n", summary())

	boxes := func(node string) int {
		n := 0
		for _, name := range b.client.boxesCreated() {
			if strings.HasPrefix(name, "exec-csv-pipeline."+node+"-") {
				n++
			}
		}
		return n
	}
	require.Equal(t, 1, boxes("clean"))
	require.Equal(t, 1, boxes("big"))

	// Change the threshold: only the stages downstream of it run.
	r.set("threshold", "16")
	r.settle()
	assert.Equal(t, "rows over 16: name,value\nb,20\ne,30\n", summary())
	assert.Equal(t, 1, boxes("clean"), "clean does not read the threshold")
	assert.Equal(t, 2, boxes("big"))

	// Change it back: served from the cache, no box started.
	r.set("threshold", "10")
	r.settle()
	assert.Equal(t, "rows over 10: name,value\nb,20\nc,15\ne,30\n", summary())
	assert.Equal(t, 2, boxes("big"), "a revert starts no box")
	for _, n := range r.rt.Nodes() {
		if n.Addr.Name == "big" {
			assert.Equal(t, 1, n.CacheHits)
		}
	}

	// Change it twice quickly: the first run is aborted and never written.
	from := store.Version()
	r.set("threshold", "18")
	r.set("threshold", "25")
	r.settle()
	assert.Equal(t, "rows over 25: name,value\ne,30\n", summary())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := store.Watch(ctx, r.addr("big").Prefix(), from)
	require.NoError(t, err)
	for done := false; !done; {
		select {
		case batch := <-ch:
			for _, c := range batch.Changes {
				if c.Cell.Addr.Name == "big" {
					assert.NotContains(t, string(c.Cell.Value), `b,20\ne,30`, "the threshold 18 run (b and e) is never written")
					done = strings.Contains(string(c.Cell.Value), "e,30") && !strings.Contains(string(c.Cell.Value), `"pending":true`)
				}
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no final value of big in the change log")
		}
	}

	// Stop the runner in the middle of a stage and start it again: it
	// finishes that stage without repeating the finished ones.
	before := boxes("big")
	r.set("threshold", "13")
	waitFor(t, "the slow stage's box", func() bool { return boxes("big") == before+1 })
	r.close(runtime.Shutdown)
	assert.True(t, r.exec("big").Pending, "the stage stays pending in the store")
	r = b.loadOn(t, store, csvPattern, csvFiles)
	r.settle()
	assert.Equal(t, "rows over 13: name,value\nb,20\nc,15\ne,30\n", summary())
	assert.Equal(t, 1, boxes("clean"), "the finished stage is not repeated")
	assert.Equal(t, before+2, boxes("big"), "the interrupted stage is run again, once")
	assert.Empty(t, b.list(t))
}
