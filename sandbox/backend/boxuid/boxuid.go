// Package boxuid hands out host uids reserved for boxes, so that a box's
// processes and files belong to a uid no real account has and no other
// box shares: two boxes cannot signal or read each other even outside
// their namespaces.
//
// The uids come from a range no real account uses: above the ranges
// useradd (1000–60000), subuid files (from 100000 up) and systemd-nspawn
// (524288–1879048191) hand out, below 2^31 (tools that read uids as
// signed ints) and systemd's foreign range (from 2147352576). Each backend
// has a block of its own (Local, Docker). A box's slot is reserved by the
// file Dir/<slot> (created O_EXCL, so two backends over one Dir never
// share a slot), which names the box. Blocks under two different Dirs may
// hand out the same uid, though hardly ever: the search starts at a hash
// of the box id.
package boxuid

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Range is a block of host uids, one slot per box; a slot is Stride uids
// and a box gets the last of its slot (the local backend's slots are pairs:
// the box user and, below it, its user namespace's root).
type Range struct {
	Dir    string // reservation files
	Base   int    // first uid of slot 0
	Stride int
	Slots  int
}

// The blocks.
const (
	base  = 1_900_000_000
	slots = 1 << 20
)

// Local is the local backend's block (pairs); Docker the Docker
// backend's, just above it. Set Dir before use.
var (
	Local  = Range{Base: base, Stride: 2, Slots: slots}
	Docker = Range{Base: base + 2*slots, Stride: 1, Slots: slots}
)

// probes bounds the search for a free slot from the box's hash.
const probes = 4096

// UID is slot's uid.
func (r Range) UID(slot int) int { return r.Base + r.Stride*slot + r.Stride - 1 }

// Slot is uid's slot, if uid is one the range hands out.
func (r Range) Slot(uid int) (int, bool) {
	off := uid - r.Base - (r.Stride - 1)
	return off / r.Stride, off >= 0 && off%r.Stride == 0 && off/r.Stride < r.Slots
}

// Last is the last uid of the range.
func (r Range) Last() int { return r.Base + r.Stride*r.Slots - 1 }

// Alloc reserves a slot for box id and returns its uid. Probing starts at
// a hash of the id so that the usual reservation takes one file create.
func (r Range) Alloc(id string) (int, error) {
	if err := os.MkdirAll(r.Dir, 0o700); err != nil {
		return 0, fmt.Errorf("reserve host uid: %w", err)
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	start := int(h.Sum32() % uint32(r.Slots))
	for i := 0; i < probes; i++ {
		slot := (start + i) % r.Slots
		f, err := os.OpenFile(filepath.Join(r.Dir, strconv.Itoa(slot)), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			continue
		} else if err != nil {
			return 0, fmt.Errorf("reserve host uid: %w", err)
		}
		_, err = f.WriteString(id)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_ = os.Remove(f.Name())
			return 0, fmt.Errorf("reserve host uid: %w", err)
		}
		return r.UID(slot), nil
	}
	return 0, fmt.Errorf("reserve host uid: no free uid among %d tried in %s (too many boxes?)", probes, r.Dir)
}

// Free releases box id's reservation of uid, if it holds it.
func (r Range) Free(id string, uid int) {
	slot, ok := r.Slot(uid)
	if !ok {
		return
	}
	p := filepath.Join(r.Dir, strconv.Itoa(slot))
	if owner, err := os.ReadFile(p); err == nil && string(owner) == id {
		_ = os.Remove(p)
	}
}

// Release frees every reservation box id holds (its uid unknown: a
// Create cut short before it recorded it).
func (r Range) Release(id string) {
	ents, err := os.ReadDir(r.Dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		p := filepath.Join(r.Dir, e.Name())
		if owner, err := os.ReadFile(p); err == nil && string(owner) == id {
			_ = os.Remove(p)
		}
	}
}

// Sweep frees the reservations of the boxes gone says are gone (a
// process killed between a reservation and its box's record). A
// reservation younger than minAge is left alone: where another process
// shares Dir, its Create may be in flight.
func (r Range) Sweep(minAge time.Duration, gone func(id string) bool) {
	ents, err := os.ReadDir(r.Dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		p := filepath.Join(r.Dir, e.Name())
		if fi, err := e.Info(); err != nil || time.Since(fi.ModTime()) < minAge {
			continue
		}
		id, err := os.ReadFile(p)
		if err == nil && gone(string(id)) {
			_ = os.Remove(p)
		}
	}
}

// Clashes names the entries of the host's account files whose ids fall in
// the range: accounts and groups (/etc/passwd, /etc/group: name:x:id:...)
// and subordinate id ranges (/etc/subuid, /etc/subgid: name:start:count).
// A box escaping as such an id would be that account.
func (r Range) Clashes(etc string) []string {
	lo, hi := uint64(r.Base), uint64(r.Last())+1 // [lo, hi)
	var out []string
	for _, f := range []struct {
		name  string
		field int  // the id's field
		count bool // the next field is a count (subordinate ranges)
	}{{"passwd", 2, false}, {"group", 2, false}, {"subuid", 1, true}, {"subgid", 1, true}} {
		data, err := os.ReadFile(filepath.Join(etc, f.name))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			fields := strings.Split(line, ":")
			if len(fields) <= f.field+1 {
				continue
			}
			start, err := strconv.ParseUint(fields[f.field], 10, 32)
			if err != nil {
				continue
			}
			n := uint64(1)
			if f.count {
				if n, err = strconv.ParseUint(fields[f.field+1], 10, 32); err != nil {
					continue
				}
			}
			if start < hi && start+n > lo {
				out = append(out, filepath.Join(etc, f.name)+": "+fields[0])
			}
		}
	}
	return out
}
