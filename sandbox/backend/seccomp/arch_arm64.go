package seccomp

import "golang.org/x/sys/unix"

const (
	auditArch    = unix.AUDIT_ARCH_AARCH64
	dockerArch   = "SCMP_ARCH_AARCH64"
	x32SyscallNr = 0 // no such ABI
)

var archOnly = map[string]int{}
