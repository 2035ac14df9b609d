package local

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cellbox/cellbox/sandbox/backend"
)

// cgroups places boxes in cgroups named cellbox/<id>: under each cgroup v1
// controller hierarchy (<mount>/<ctrl>/cellbox/<id>), or on a cgroup v2
// host under the unified hierarchy (<mount>/cellbox/<id>).
type cgroups struct {
	mount string
	v2    bool
	ctrls []string // usable controllers among memory, pids, cpu
}

const cgroupParent = "cellbox"

// newCgroups finds the controllers this process can manage.
func newCgroups(mount string) *cgroups {
	cg := &cgroups{mount: mount}
	if _, err := os.Stat(filepath.Join(mount, "cgroup.controllers")); err == nil {
		// cgroup v2 (untested on the v1 machine this was written on).
		cg.v2 = true
		parent := filepath.Join(mount, cgroupParent)
		if os.MkdirAll(parent, 0o755) != nil {
			return cg
		}
		for _, c := range []string{"memory", "pids", "cpu"} {
			_ = os.WriteFile(filepath.Join(mount, "cgroup.subtree_control"), []byte("+"+c), 0)
			_ = os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+"+c), 0)
		}
		b, _ := os.ReadFile(filepath.Join(parent, "cgroup.subtree_control"))
		for _, c := range strings.Fields(string(b)) {
			if c == "memory" || c == "pids" || c == "cpu" {
				cg.ctrls = append(cg.ctrls, c)
			}
		}
		return cg
	}
	for _, c := range []string{"memory", "pids", "cpu"} {
		dir := filepath.Join(mount, c)
		if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err != nil {
			continue // not a v1 hierarchy
		}
		if err := os.MkdirAll(filepath.Join(dir, cgroupParent), 0o755); err != nil {
			continue
		}
		cg.ctrls = append(cg.ctrls, c)
	}
	return cg
}

func (cg *cgroups) has(ctrl string) bool { return slices.Contains(cg.ctrls, ctrl) }

// dirs are the box's cgroup directories.
func (cg *cgroups) dirs(id string) []string {
	if cg.v2 {
		if len(cg.ctrls) == 0 {
			return nil
		}
		return []string{filepath.Join(cg.mount, cgroupParent, id)}
	}
	d := make([]string, 0, len(cg.ctrls))
	for _, c := range cg.ctrls {
		d = append(d, filepath.Join(cg.mount, c, cgroupParent, id))
	}
	return d
}

// limitFiles are the files that set lim, per controller directory.
func (cg *cgroups) limitFiles(lim backend.Limits) map[string][][2]string {
	mem := strconv.FormatInt(lim.MemoryBytes, 10)
	const period = 100000
	quota := strconv.FormatInt(int64(lim.CPUs*period), 10)
	pids := strconv.FormatInt(lim.Pids, 10)
	if cg.v2 {
		var f [][2]string
		for _, c := range cg.ctrls {
			switch c {
			case "memory":
				f = append(f, [2]string{"memory.max", mem}, [2]string{"memory.swap.max", "0"})
			case "pids":
				f = append(f, [2]string{"pids.max", pids})
			case "cpu":
				f = append(f, [2]string{"cpu.max", quota + " " + strconv.Itoa(period)})
			}
		}
		return map[string][][2]string{"": f}
	}
	return map[string][][2]string{
		"memory": {{"memory.limit_in_bytes", mem}, {"memory.memsw.limit_in_bytes", mem}}, // memsw: only if swap is accounted
		"pids":   {{"pids.max", pids}},
		"cpu":    {{"cpu.cfs_period_us", strconv.Itoa(period)}, {"cpu.cfs_quota_us", quota}},
	}
}

// setup makes the box's cgroups, writes its limits and returns the
// cgroup.procs files its first process must join.
func (cg *cgroups) setup(id string, lim backend.Limits) ([]string, error) {
	files := cg.limitFiles(lim)
	var procs []string
	for i, d := range cg.dirs(id) {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("cgroup %s: %w", d, err)
		}
		key := ""
		if !cg.v2 {
			key = cg.ctrls[i]
		}
		for _, f := range files[key] {
			p := filepath.Join(d, f[0])
			if f[0] == "memory.memsw.limit_in_bytes" || f[0] == "memory.swap.max" {
				if _, err := os.Stat(p); err != nil {
					continue // swap not accounted
				}
			}
			if err := os.WriteFile(p, []byte(f[1]), 0); err != nil {
				return nil, fmt.Errorf("cgroup %s: set %s=%s: %w", d, f[0], f[1], err)
			}
		}
		procs = append(procs, filepath.Join(d, "cgroup.procs"))
	}
	return procs, nil
}

// remove kills what is left in the box's cgroups and deletes them.
func (cg *cgroups) remove(id string) error {
	var errs []error
	for _, d := range cg.dirs(id) {
		deadline := time.Now().Add(2 * time.Second)
		for {
			b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			if errors.Is(err, os.ErrNotExist) {
				break
			}
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			err = os.Remove(d)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			if time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return errors.Join(errs...)
}
