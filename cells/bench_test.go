package cells

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkWatchLatency measures cell write -> watcher notified: one Update
// setting one cell, until a watcher receives its Batch. It reports p50 and
// p95 in µs, and the ratio of p50 to the bare commit (the same Update with
// no watcher), measured in the same run.
func BenchmarkWatchLatency(b *testing.B) {
	for _, bk := range backends() {
		b.Run(bk.name, func(b *testing.B) {
			var s Store
			if bk.name == "memory" {
				s = NewMemory(Options{})
			} else {
				var err error
				s, err = OpenBolt(filepath.Join(b.TempDir(), "cells.db"), Options{})
				require.NoError(b, err)
			}
			defer s.Close()
			write := func(i int) {
				if err := s.Update(context.Background(), func(tx Tx) error {
					_, err := tx.Set(Address{"b", "p", "x"}, json.RawMessage(strconv.Itoa(i)))
					return err
				}); err != nil {
					b.Fatal(err)
				}
			}
			// Baseline: commits alone.
			const rounds = 200
			start := time.Now()
			for i := range rounds {
				write(-i - 1)
			}
			commit := time.Since(start) / rounds

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			w, err := s.Watch(ctx, "b/p/", s.Version())
			require.NoError(b, err)
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				write(i)
				<-w
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			slices.Sort(lat)
			p50, p95 := lat[len(lat)/2], lat[len(lat)*95/100]
			b.ReportMetric(float64(p50.Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(p95.Nanoseconds())/1e3, "p95-µs")
			b.ReportMetric(float64(p50)/float64(commit), "p50-x-commit")
		})
	}
}
