package backendtest

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/backend/seccomp"
)

// probeArgs are the arguments a probe passes to a refused call (default:
// zeros), chosen so that the call, were it let through, harms nothing and
// mostly fails otherwise than with the filter's errno.
var probeArgs = map[string][]int64{
	"clone":       {0x10000000 | int64(syscall.SIGCHLD)}, // CLONE_NEWUSER: the child, if any, exits at once
	"personality": {0x0040000},                           // ADDR_NO_RANDOMIZE
	"ptrace":      {2, 1},                                // PTRACE_PEEKDATA of the agent
	"syslog":      {10},                                  // SYSLOG_ACTION_SIZE_BUFFER
	"kcmp":        {1, 1},
}

// seccompFamilies checks from inside the box that every call of package
// seccomp's list is refused with its errno, family by family, and that a
// filter is on (Seccomp: 2).
func seccompFamilies(t *testing.T, c *agent.Client) {
	assert.Equal(t, "2", ok(t, c, `grep '^Seccomp:' /proc/self/status | cut -f2`), "a seccomp filter is on")
	var py strings.Builder
	py.WriteString("import ctypes, os\nl = ctypes.CDLL(None, use_errno=True)\nl.syscall.restype = ctypes.c_long\n")
	py.WriteString("def probe(name, nr, *args):\n    ctypes.set_errno(0)\n    r = l.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])\n    if r == 0 and name == 'clone':\n        os._exit(0)\n    print(name, r, ctypes.get_errno())\n")
	fams := seccomp.Families()
	for _, f := range fams {
		for _, call := range f.Calls {
			nr, _ := seccomp.Number(call)
			args := append(probeArgs[call], make([]int64, 6)...)[:6]
			fmt.Fprintf(&py, "probe(%q, %d, %d, %d, %d, %d, %d, %d)\n", call, nr, args[0], args[1], args[2], args[3], args[4], args[5])
		}
	}
	res, err := c.Exec(ctxFor(t, time.Minute), agent.ExecRequest{Argv: []string{"python3", "-c", py.String()}}, nil)
	require.NoError(t, err)
	require.Equal(t, 0, res.ExitCode, "the probes: stdout %q stderr %q", res.Stdout, res.Stderr)
	got := map[string]string{}
	for _, line := range strings.Split(res.Stdout, "\n") {
		f := strings.Fields(line)
		if len(f) == 3 {
			got[f[0]] = f[1] + " errno " + f[2]
		}
	}
	if runtime.GOARCH == "amd64" {
		// A call through the i386 entry (int 0x80) would go around the
		// x86_64 list: the filter kills the process (SIGSYS). What matters
		// is that the call never runs: fchmod(fd, 0777) of a file 0600,
		// whose mode is read afterwards. A kernel that runs no 32-bit
		// calls at all (ia32_emulation off: a Firecracker VM here) ends
		// the process with SIGSEGV before the filter sees the call; that
		// is as good. The same call through the x86_64 entry shows that
		// the probe would see the call's effect.
		t.Run("seccomp kills calls of another architecture", func(t *testing.T) {
			probe := func(code string) string {
				return strings.TrimSpace(ok(t, c, `f=$(mktemp); chmod 600 $f; python3 -c '
import ctypes, mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY).to_bytes(4, "little")
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(`+code+`)
ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))()' $f 2>/dev/null; echo "exit $? mode $(stat -c %a $f)"; rm -f $f`))
			}
			// push rbx; mov eax, 94 (i386 fchmod); mov ebx, fd; mov ecx, 0777; int 0x80; pop rbx; ret
			got := probe(`bytes([0x53, 0xb8, 94, 0, 0, 0, 0xbb]) + fd + bytes([0xb9, 0xff, 0x01, 0, 0, 0xcd, 0x80, 0x5b, 0xc3])`)
			sigsys, sigsegv := fmt.Sprintf("exit %d mode 600", 128+int(syscall.SIGSYS)), fmt.Sprintf("exit %d mode 600", 128+int(syscall.SIGSEGV))
			assert.Contains(t, []string{sigsys, sigsegv}, got, "the 32-bit call must not run (its process killed, the mode unchanged)")
			if got == sigsegv {
				t.Logf("int 0x80 ended in SIGSEGV, not the filter's SIGSYS: this kernel runs no 32-bit calls")
			}
			// mov eax, 91 (x86_64 fchmod); mov edi, fd; mov esi, 0777; syscall; ret
			control := probe(`bytes([0xb8, 91, 0, 0, 0, 0xbf]) + fd + bytes([0xbe, 0xff, 0x01, 0, 0, 0x0f, 0x05, 0xc3])`)
			assert.Equal(t, "exit 0 mode 777", control, "the same call through the x86_64 entry runs, and the probe sees it")
		})
	}
	for _, f := range fams {
		t.Run("seccomp refuses "+f.Name, func(t *testing.T) {
			for _, call := range f.Calls {
				require.Contains(t, got, call)
				assert.Equal(t, "-1 errno "+strconv.Itoa(int(f.Errno)), got[call], "%s (want %v)", call, f.Errno)
			}
		})
	}
}
