package agent

import (
	"bytes"
	"context"
	"testing"
)

func BenchmarkVersion(b *testing.B) {
	a := startAgent(b)
	ctx := context.Background()
	for b.Loop() {
		if _, err := a.c.Version(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkExecTrue(b *testing.B) {
	a := startAgent(b)
	ctx := context.Background()
	for _, bc := range []struct {
		name string
		req  ExecRequest
	}{
		{"shell", ExecRequest{Command: "true"}},
		{"argv", ExecRequest{Argv: []string{"/bin/true"}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				res, err := a.c.Exec(ctx, bc.req, nil)
				if err != nil || res.ExitCode != 0 {
					b.Fatal(err, res)
				}
			}
		})
	}
}

func BenchmarkFile1MiB(b *testing.B) {
	a := startAgent(b)
	ctx := context.Background()
	data := bytes.Repeat([]byte("0123456789abcde\n"), 1<<16)
	if _, err := a.c.WriteFile(ctx, WriteRequest{Path: "f", Data: data}); err != nil {
		b.Fatal(err)
	}
	if _, err := a.c.Upload(ctx, "g", bytes.NewReader(data), 0); err != nil {
		b.Fatal(err)
	}
	b.Run("write", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if _, err := a.c.WriteFile(ctx, WriteRequest{Path: "f", Data: data}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("read", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if _, err := a.c.ReadFile(ctx, ReadRequest{Path: "f", ByteLimit: 1 << 20, MaxBytes: 1 << 20}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("upload", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if _, err := a.c.Upload(ctx, "g", bytes.NewReader(data), 0); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("download", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		var buf bytes.Buffer
		for b.Loop() {
			buf.Reset()
			if _, err := a.c.Download(ctx, "g", &buf); err != nil {
				b.Fatal(err)
			}
		}
	})
}
