package seccomp

import "golang.org/x/sys/unix"

const (
	auditArch    = unix.AUDIT_ARCH_X86_64
	dockerArch   = "SCMP_ARCH_X86_64"
	x32SyscallNr = 0x40000000 // x32 ABI calls carry this bit and the x86_64 arch: refused
)

// archOnly are the numbers of refused calls that exist on this arch only.
var archOnly = map[string]int{
	"create_module": unix.SYS_CREATE_MODULE, "query_module": unix.SYS_QUERY_MODULE, "get_kernel_syms": unix.SYS_GET_KERNEL_SYMS,
	"iopl": unix.SYS_IOPL, "ioperm": unix.SYS_IOPERM,
	"sysfs": unix.SYS_SYSFS, "_sysctl": unix.SYS__SYSCTL, "uselib": unix.SYS_USELIB, "ustat": unix.SYS_USTAT,
}
