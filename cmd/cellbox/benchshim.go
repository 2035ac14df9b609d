package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

func init() {
	register(command{
		name:  "bench",
		usage: "boxes|pipeline|runtime [--json] [...]  measure box, pipeline and runtime latencies against baselines (runs cellbox-bench, beside this binary; bench boxes -h, bench pipeline -h, bench runtime -h)",
		run:   runBench,
	})
}

// benchBinary is the benchmarks' binary (cmd/cellbox-bench). It is not
// part of this one, which every box mounts as its agent.
const benchBinary = "cellbox-bench"

// runBench runs cellbox-bench, from the directory of this executable,
// in this process's stead: its output, exit status and signals are the
// bench's own.
func runBench(_ context.Context, args []string) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find %s: %w", benchBinary, err)
	}
	bin := filepath.Join(filepath.Dir(exe), benchBinary)
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("the benchmarks are the binary %s, and there is none beside %s: build it there (CGO_ENABLED=0 go build -o %s ./cmd/cellbox-bench), or run it yourself", benchBinary, exe, bin)
	}
	return syscall.Exec(bin, append([]string{bin}, args...), os.Environ())
}
