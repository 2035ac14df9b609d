package sandboxclient_test

import (
	"context"
	"strings"
	"testing"

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
		for b.Loop() {
			if _, err := c.Tool(ctx, "write_file", api.WriteFileInput{Path: "f.txt", Content: content}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("read_file", func(b *testing.B) {
		for b.Loop() {
			for off := 0; ; {
				res, err := c.Tool(ctx, "read_file", api.ReadFileInput{Path: "f.txt", Offset: off})
				if err != nil {
					b.Fatal(err)
				}
				var out api.ReadFileOutput
				if err := api.DecodeResult(res, &out); err != nil {
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
