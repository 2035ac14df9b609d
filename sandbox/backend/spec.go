package backend

import (
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// The unprivileged user every box runs as (named BoxUser in the box's
// /etc/passwd, home Workspace). Files a box writes are owned by it.
const (
	BoxUID  = 1000
	BoxGID  = 1000
	BoxUser = "user"
)

// BoxEnv is the environment every box's PID 1 starts with, before
// Spec.Env (which may override it).
var BoxEnv = map[string]string{
	"HOME": Workspace,
	"USER": BoxUser,
	"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"LANG": "C.UTF-8",
}

// idPattern leaves the length to ValidID: a counted repetition ({0,127})
// compiles to a program of hundreds of instructions, 0.3 ms at every start
// of the binary.
var idPattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)

// ValidID checks that id can name a box on every backend (a container name,
// a directory name).
func ValidID(id string) error {
	if len(id) > 128 || !idPattern.MatchString(id) {
		return fmt.Errorf("box id %q: want 1-128 characters of [a-zA-Z0-9_.-], starting with a letter or digit", id)
	}
	return nil
}

// Enforcement says which Limits a backend enforces on this host, and why not
// where it does not.
type Enforcement struct {
	Memory, CPU, Pids, Disk bool
	Warnings                []string
}

// Capabilities say what a backend can do and what it enforces, so that
// callers (the pool, the docs, the tests) ask it instead of testing its
// name. In the style of Nomad's driver Capabilities.
type Capabilities struct {
	// Clone: the backend copies a box's disk whole (it implements
	// Cloner); otherwise fork copies files through the agents.
	Clone bool
	// Remote: the boxes run on another machine than this process (a
	// remote engine, a cluster): the backend takes no host path from the
	// caller, and the caller reaches a box only through Dial
	// (docker.Remote). Where it is false (local; docker on this machine's
	// engine) Spec.HostDir is a directory of this host.
	Remote bool
	// Limits: which of Spec.Limits hold, and why not where they do not.
	Limits Enforcement
	// Network is how a box without Spec.Network is kept off the network:
	// NetworkNamespace (a network namespace with loopback only; the
	// kernel enforces it). A backend that cannot keep a box off the
	// network says NetworkNone, and the caller refuses boxes without
	// network on it.
	Network string
	// NetworkNote says why, when Network is NetworkNone.
	NetworkNote string
	// MaxCPUs is the most CPUs one box may be given (Limits.CPUs): the
	// CPU count of the machine its boxes run on.
	MaxCPUs int
}

// Network isolations (Capabilities.Network).
const (
	NetworkNamespace = "namespace"
	// NetworkPolicy: the box has a network interface, and a policy that
	// its network plugin enforces (a Kubernetes NetworkPolicy, found
	// enforced by a probe) refuses everything that leaves or reaches it.
	NetworkPolicy = "policy"
	NetworkNone   = "none"
)

// ImageOrDefault is the Spec's image, or DefaultImage when none is named.
func (s Spec) ImageOrDefault() string {
	if s.Image == "" {
		return DefaultImage
	}
	return s.Image
}

// Validate checks what every backend needs of a Spec and says what is wrong
// in terms a caller can act on; limits are checked against caps.
func (s Spec) Validate(caps Capabilities) error {
	if err := ValidID(s.ID); err != nil {
		return err
	}
	if !filepath.IsAbs(s.AgentBinary) {
		return fmt.Errorf("box %s: agent binary %q: want an absolute host path", s.ID, s.AgentBinary)
	}
	if fi, err := os.Stat(s.AgentBinary); err != nil {
		return fmt.Errorf("box %s: agent binary: %w", s.ID, err)
	} else if !fi.Mode().IsRegular() {
		return fmt.Errorf("box %s: agent binary %s is not a regular file", s.ID, s.AgentBinary)
	}
	switch {
	case caps.Remote && s.HostDir != "":
		return fmt.Errorf("box %s: host dir %q: a backend whose boxes run on another machine takes none", s.ID, s.HostDir)
	case caps.Remote:
	case !filepath.IsAbs(s.HostDir):
		return fmt.Errorf("box %s: host dir %q: want an absolute host path", s.ID, s.HostDir)
	default:
		if fi, err := os.Lstat(s.HostDir); err != nil {
			return fmt.Errorf("box %s: host dir: %w", s.ID, err)
		} else if !fi.IsDir() {
			return fmt.Errorf("box %s: host dir %s is not a directory", s.ID, s.HostDir)
		}
	}
	if err := ValidEnv(s.Env); err != nil {
		return fmt.Errorf("box %s: %w", s.ID, err)
	}
	if !s.Network && caps.Network == NetworkNone {
		return fmt.Errorf("box %s: a box without network cannot be made here: %s", s.ID, caps.NetworkNote)
	}
	if err := s.Limits.Validate(caps.MaxCPUs); err != nil {
		return fmt.Errorf("box %s: %w", s.ID, err)
	}
	if err := ValidWorkDir(s.WorkDir); err != nil {
		return fmt.Errorf("box %s: %w", s.ID, err)
	}
	return nil
}

// ValidWorkDir checks a box's working directory (Spec.WorkDir, the tools'
// workspace_dir): "" (Workspace), or a clean absolute path on the box's own
// writable disk, Workspace or /tmp or below them. Anywhere else is the
// read-only root, where the agent could not make it and file tools could
// not write.
func ValidWorkDir(dir string) error {
	if dir == "" {
		return nil
	}
	if !path.IsAbs(dir) || path.Clean(dir) != dir || strings.ContainsRune(dir, 0) {
		return fmt.Errorf("workspace_dir %q: want a clean absolute path, e.g. %q", dir, path.Join(Workspace, strings.Trim(path.Clean("/"+dir), "/")))
	}
	for _, root := range []string{Workspace, "/tmp"} {
		if dir == root || strings.HasPrefix(dir, root+"/") {
			return nil
		}
	}
	return fmt.Errorf("workspace_dir %q is outside the box's writable disk: use %s or /tmp, or a directory below them (e.g. %s)", dir, Workspace, path.Join(Workspace, path.Base(dir)))
}

// AgentCommand is the command line that starts the agent as the box's
// PID 1: `cellbox agent`, with --workspace when WorkDir is not Workspace.
func (s Spec) AgentCommand() []string {
	cmd := []string{AgentPath, "agent"}
	if s.WorkDir != "" && s.WorkDir != Workspace {
		cmd = append(cmd, "--workspace", s.WorkDir)
	}
	return cmd
}

// ValidEnv checks the environment of a box: what execve can pass on.
func ValidEnv(env map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(env[k], 0) {
			return fmt.Errorf("env %q: names must be non-empty without '=' or NUL, values without NUL", k)
		}
	}
	return nil
}

// BoxLabels are the labels a backend stores with the box: Spec.Labels plus
// LabelManaged and LabelID, which the backend owns.
func (s Spec) BoxLabels() map[string]string {
	l := make(map[string]string, len(s.Labels)+2)
	maps.Copy(l, s.Labels)
	l[LabelManaged] = "1"
	l[LabelID] = s.ID
	return l
}

// MatchLabels reports whether have includes every label in want.
func MatchLabels(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}
