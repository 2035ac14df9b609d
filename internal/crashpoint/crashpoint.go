// Package crashpoint kills this process at a named point of its work when
// the environment asks for it, so that the tests of what a crash leaves
// behind (a server killed -9 in the middle of making a box) hit each step
// for real, in the real binary. CELLBOX_CRASH_AT=NAME arms the point NAME;
// unset (always, outside those tests), Hit is one string compare.
//
// Hand-written: the Go failpoint libraries (gofail, pingcap/failpoint)
// rewrite the source at build time to offer far more (sleep, return an
// error, counts); a kill at a point is all these tests need.
package crashpoint

import (
	"fmt"
	"os"
	"syscall"
)

// Env names the point to crash at.
const Env = "CELLBOX_CRASH_AT"

var armed = os.Getenv(Env)

// Hit kills the process with SIGKILL if point is the one armed, saying so
// (with what it was doing: the box's id) on stderr first.
func Hit(point, detail string) {
	if armed == "" || armed != point {
		return
	}
	fmt.Fprintf(os.Stderr, "cellbox: crash point %s (%s): killing this process\n", point, detail)
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}
