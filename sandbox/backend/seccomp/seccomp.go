// Package seccomp is the one list of system calls a box may not make, the
// same on both backends: as a classic BPF program for bubblewrap
// (`bwrap --seccomp FD`, Filter) and as a Docker seccomp profile
// (SecurityOpt "seccomp=<json>", DockerProfile). It follows Docker's
// default profile (what that profile refuses to a container without
// capabilities), plus ptrace and io_uring, which newer Docker refuses too.
// Refused calls fail with EPERM (clone3 with ENOSYS, so that C libraries
// fall back to clone, whose flags a filter can read); a call of another
// architecture (i386 or x32 on x86_64) kills the process.
//
// Hand-written BPF: the program is a straight list of checks, short enough
// that an assembler library would add more than it saves; both encodings
// are generated from the same table, once per process.
package seccomp

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Family is a group of refused calls, for docs and tests.
type Family struct {
	Name  string
	Calls []string
	// Flags, when set, refuse Calls only when their first argument has
	// one of these bits (clone's namespace flags, personality's flags).
	Flags []uint32
	// Errno is what a refused call returns (EPERM unless said).
	Errno syscall.Errno
}

// Namespace flags of clone(2): a box makes no namespaces.
var cloneNSFlags = []uint32{unix.CLONE_NEWNS, unix.CLONE_NEWCGROUP, unix.CLONE_NEWUTS, unix.CLONE_NEWIPC, unix.CLONE_NEWUSER, unix.CLONE_NEWPID, unix.CLONE_NEWNET}

// Personality flags that weaken the process (no ASLR, executable data,
// page zero mapped, legacy layouts): refused, as Docker refuses every
// personality but a few plain ones. The query personality(0xffffffff) has
// them all set and is refused as well.
var personalityFlags = []uint32{
	0x0040000, // ADDR_NO_RANDOMIZE
	0x0100000, // MMAP_PAGE_ZERO
	0x0200000, // ADDR_COMPAT_LAYOUT
	0x0400000, // READ_IMPLIES_EXEC
	0x0800000, // ADDR_LIMIT_32BIT
	0x8000000, // ADDR_LIMIT_3GB
}

// families is the list. Calls an architecture lacks are skipped there.
var families = []Family{
	{Name: "kernel keyring", Calls: []string{"add_key", "keyctl", "request_key"}},
	{Name: "bpf", Calls: []string{"bpf"}},
	{Name: "perf events", Calls: []string{"perf_event_open"}},
	{Name: "mounts", Calls: []string{"mount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr"}},
	{Name: "ptrace and other processes' memory", Calls: []string{"ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd"}},
	{Name: "userfaultfd", Calls: []string{"userfaultfd"}},
	{Name: "namespaces", Calls: []string{"unshare", "setns"}},
	{Name: "namespaces (clone flags)", Calls: []string{"clone"}, Flags: cloneNSFlags},
	{Name: "clone3 (ENOSYS: its flags are out of a filter's reach; callers fall back to clone)", Calls: []string{"clone3"}, Errno: unix.ENOSYS},
	{Name: "kexec", Calls: []string{"kexec_load", "kexec_file_load"}},
	{Name: "kernel modules", Calls: []string{"init_module", "finit_module", "delete_module", "create_module", "query_module", "get_kernel_syms"}},
	{Name: "reboot", Calls: []string{"reboot"}},
	{Name: "swap", Calls: []string{"swapon", "swapoff"}},
	{Name: "process accounting", Calls: []string{"acct"}},
	{Name: "file handles", Calls: []string{"open_by_handle_at", "name_to_handle_at"}},
	{Name: "personality flags", Calls: []string{"personality"}, Flags: personalityFlags},
	{Name: "clock setting", Calls: []string{"settimeofday", "clock_settime", "clock_adjtime"}},
	{Name: "raw I/O ports", Calls: []string{"iopl", "ioperm"}},
	{Name: "io_uring", Calls: []string{"io_uring_setup", "io_uring_enter", "io_uring_register"}},
	{Name: "kernel logs and obsolete calls", Calls: []string{"syslog", "quotactl", "lookup_dcookie", "nfsservctl", "sysfs", "_sysctl", "uselib", "ustat", "vhangup"}},
}

// common are the numbers of refused calls every supported arch has.
var common = map[string]int{
	"add_key": unix.SYS_ADD_KEY, "keyctl": unix.SYS_KEYCTL, "request_key": unix.SYS_REQUEST_KEY,
	"bpf": unix.SYS_BPF, "perf_event_open": unix.SYS_PERF_EVENT_OPEN,
	"mount": unix.SYS_MOUNT, "umount2": unix.SYS_UMOUNT2, "pivot_root": unix.SYS_PIVOT_ROOT,
	"fsopen": unix.SYS_FSOPEN, "fsconfig": unix.SYS_FSCONFIG, "fsmount": unix.SYS_FSMOUNT, "fspick": unix.SYS_FSPICK,
	"move_mount": unix.SYS_MOVE_MOUNT, "open_tree": unix.SYS_OPEN_TREE, "mount_setattr": unix.SYS_MOUNT_SETATTR,
	"ptrace": unix.SYS_PTRACE, "process_vm_readv": unix.SYS_PROCESS_VM_READV, "process_vm_writev": unix.SYS_PROCESS_VM_WRITEV,
	"kcmp": unix.SYS_KCMP, "pidfd_getfd": unix.SYS_PIDFD_GETFD, "userfaultfd": unix.SYS_USERFAULTFD,
	"unshare": unix.SYS_UNSHARE, "setns": unix.SYS_SETNS, "clone": unix.SYS_CLONE, "clone3": unix.SYS_CLONE3,
	"kexec_load": unix.SYS_KEXEC_LOAD, "kexec_file_load": unix.SYS_KEXEC_FILE_LOAD,
	"init_module": unix.SYS_INIT_MODULE, "finit_module": unix.SYS_FINIT_MODULE, "delete_module": unix.SYS_DELETE_MODULE,
	"reboot": unix.SYS_REBOOT, "swapon": unix.SYS_SWAPON, "swapoff": unix.SYS_SWAPOFF, "acct": unix.SYS_ACCT,
	"open_by_handle_at": unix.SYS_OPEN_BY_HANDLE_AT, "name_to_handle_at": unix.SYS_NAME_TO_HANDLE_AT,
	"personality":  unix.SYS_PERSONALITY,
	"settimeofday": unix.SYS_SETTIMEOFDAY, "clock_settime": unix.SYS_CLOCK_SETTIME, "clock_adjtime": unix.SYS_CLOCK_ADJTIME,
	"io_uring_setup": unix.SYS_IO_URING_SETUP, "io_uring_enter": unix.SYS_IO_URING_ENTER, "io_uring_register": unix.SYS_IO_URING_REGISTER,
	"syslog": unix.SYS_SYSLOG, "quotactl": unix.SYS_QUOTACTL, "lookup_dcookie": unix.SYS_LOOKUP_DCOOKIE,
	"nfsservctl": unix.SYS_NFSSERVCTL, "vhangup": unix.SYS_VHANGUP,
}

// Number is the number of a call on this architecture.
func Number(name string) (int, bool) {
	if n, ok := common[name]; ok {
		return n, true
	}
	n, ok := archOnly[name]
	return n, ok
}

// Families lists the refused families with the calls this architecture
// has.
func Families() []Family {
	out := make([]Family, 0, len(families))
	for _, f := range families {
		f.Calls = slices.DeleteFunc(slices.Clone(f.Calls), func(c string) bool { _, ok := Number(c); return !ok })
		if f.Errno == 0 {
			f.Errno = unix.EPERM
		}
		if len(f.Calls) > 0 {
			out = append(out, f)
		}
	}
	return out
}

// Offsets in struct seccomp_data (little-endian arches).
const (
	offNr      = 0
	offArch    = 4
	offArg0Low = 16
)

// program builds the BPF program.
func program() []unix.SockFilter {
	stmt := func(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }
	jump := func(code uint16, k uint32, jt, jf uint8) unix.SockFilter {
		return unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k}
	}
	const (
		ldW  = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jge  = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		jset = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
		ret  = unix.BPF_RET | unix.BPF_K
	)
	errno := func(e syscall.Errno) uint32 { return unix.SECCOMP_RET_ERRNO | uint32(e)&unix.SECCOMP_RET_DATA }
	p := []unix.SockFilter{
		stmt(ldW, offArch),
		jump(jeq, auditArch, 1, 0),
		stmt(ret, unix.SECCOMP_RET_KILL_PROCESS),
		stmt(ldW, offNr),
	}
	if x32SyscallNr != 0 {
		p = append(p, jump(jge, x32SyscallNr, 0, 1), stmt(ret, unix.SECCOMP_RET_KILL_PROCESS))
	}
	// Unconditional refusals first, then the ones that read an argument
	// (each ends in its own return, so the call number need not be
	// loaded again).
	var flagged []Family
	for _, f := range Families() {
		if len(f.Flags) > 0 {
			flagged = append(flagged, f)
			continue
		}
		for _, c := range f.Calls {
			n, _ := Number(c)
			p = append(p, jump(jeq, uint32(n), 0, 1), stmt(ret, errno(f.Errno)))
		}
	}
	for _, f := range flagged {
		var mask uint32
		for _, fl := range f.Flags {
			mask |= fl
		}
		for _, c := range f.Calls {
			n, _ := Number(c)
			p = append(p,
				jump(jeq, uint32(n), 0, 4),
				stmt(ldW, offArg0Low),
				jump(jset, mask, 0, 1),
				stmt(ret, errno(f.Errno)),
				stmt(ret, unix.SECCOMP_RET_ALLOW),
			)
		}
	}
	return append(p, stmt(ret, unix.SECCOMP_RET_ALLOW))
}

// Filter is the BPF program as bwrap --seccomp reads it (struct
// sock_filter array, native byte order), built once.
var Filter = sync.OnceValue(func() []byte {
	var b bytes.Buffer
	for _, ins := range program() {
		_ = binary.Write(&b, binary.NativeEndian, ins)
	}
	return b.Bytes()
})

// Docker's seccomp profile format (the parts used).
type dockerProfile struct {
	DefaultAction string         `json:"defaultAction"`
	Architectures []string       `json:"architectures"`
	Syscalls      []dockerSyscal `json:"syscalls"`
}

type dockerSyscal struct {
	Names    []string    `json:"names"`
	Action   string      `json:"action"`
	ErrnoRet *uint       `json:"errnoRet,omitempty"`
	Args     []dockerArg `json:"args,omitempty"`
}

type dockerArg struct {
	Index    uint   `json:"index"`
	Value    uint64 `json:"value"`
	ValueTwo uint64 `json:"valueTwo"`
	Op       string `json:"op"`
}

// DockerProfile is the same list as a Docker seccomp profile (JSON), for
// HostConfig.SecurityOpt "seccomp=" + DockerProfile(), built once. A
// call with flags is refused by one rule per flag (rules are or-ed).
var DockerProfile = sync.OnceValue(func() string {
	prof := dockerProfile{DefaultAction: "SCMP_ACT_ALLOW", Architectures: []string{dockerArch}}
	for _, f := range Families() {
		e := uint(f.Errno)
		if len(f.Flags) == 0 {
			prof.Syscalls = append(prof.Syscalls, dockerSyscal{Names: f.Calls, Action: "SCMP_ACT_ERRNO", ErrnoRet: &e})
			continue
		}
		for _, fl := range f.Flags {
			prof.Syscalls = append(prof.Syscalls, dockerSyscal{Names: f.Calls, Action: "SCMP_ACT_ERRNO", ErrnoRet: &e,
				Args: []dockerArg{{Index: 0, Value: uint64(fl), ValueTwo: uint64(fl), Op: "SCMP_CMP_MASKED_EQ"}}})
		}
	}
	b, err := json.Marshal(prof)
	if err != nil {
		panic(fmt.Sprintf("seccomp: marshal the Docker profile: %v", err))
	}
	return string(b)
})
