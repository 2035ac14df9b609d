package sandboxclient_test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandboxclient"
)

// BenchmarkFileToolsHTTP is write_file of 1 MiB, then read_file of it
// page by page, through the HTTP client and server, on bubblewrap: the
// path of `cellbox bench boxes`' write_file and read_file rows.
func BenchmarkFileToolsHTTP(b *testing.B) {
	t := &testing.T{} // startServer's and newSession's cleanups do not run: done below
	dir := b.TempDir()
	s := startServer(t, backends[0].open(t, dir), dir, nil)
	defer s.stop()
	c, err := sandboxclient.NewSession(context.Background(), s.url)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	defer func() {
		id, _ := c.Session()
		s.svc.DeleteSession(ctx, id) // its boxes and their disks
	}()
	content := strings.Repeat(strings.Repeat("x", 1023)+"\n", 1024)
	if _, err := c.Tool(ctx, "write_file", api.WriteFileInput{Path: "f.txt", Content: content}); err != nil {
		b.Fatal(err)
	}
	b.Run("write_file", func(b *testing.B) {
		defer reportCPU(b)()
		for b.Loop() {
			if _, err := c.Tool(ctx, "write_file", api.WriteFileInput{Path: "f.txt", Content: content}); err != nil {
				b.Fatal(err)
			}
		}
	})
	if _, err := c.Tool(ctx, "write_file", api.WriteFileInput{Path: "small.txt", Content: "small\n"}); err != nil {
		b.Fatal(err)
	}
	b.Run("read_file_small", func(b *testing.B) {
		defer reportCPU(b)()
		for b.Loop() {
			if _, err := c.Tool(ctx, "read_file", api.ReadFileInput{Path: "small.txt"}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("read_file", func(b *testing.B) {
		defer reportCPU(b)()
		for b.Loop() {
			for off := 0; ; {
				var out api.ReadFileOutput
				if err := c.ToolInto(ctx, "read_file", api.ReadFileInput{Path: "f.txt", Offset: off}, &out); err != nil {
					b.Fatal(err)
				}
				if out.NextOffset == 0 {
					break
				}
				off = out.NextOffset
			}
		}
	})
}

// reportCPU reports the CPU time this process (client and server; not
// the agent in the box) spent per operation, user and system: on a
// shared machine a steadier measure of the work than the wall time.
func reportCPU(b *testing.B) func() {
	start := cpuTime()
	return func() {
		b.ReportMetric(float64(cpuTime()-start)/float64(b.N)/1e6, "cpu-ms/op")
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
