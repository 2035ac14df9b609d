package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/backend/boxdisk"
	"golang.org/x/sys/unix"
)

// A box's host directory, DATA/boxes/ID, is a small tmpfs of its own, so
// that a box cannot fill the host's disk through backend.SocketDir, the one
// host directory it may write (its agent's socket lives there). It holds:
//
//   - run/: the directory bound at backend.SocketDir (the backend gives it
//     to the box user), holding the agent's socket and the egress proxy's;
//   - st/: root's alone, never bound into the box, where the egress
//     socket is made before it is renamed into run/ (see egress.Listen); a
//     rename needs both on one filesystem.
//
// A write past hostDirSize or hostDirInodes gets ENOSPC in the box; the
// pages are charged to the box's memory cgroup, like the rest of its
// tmpfs. Mounting needs root, as the boxes' disks do (boxdisk).
//
// Boxes made before this layout have the plain directory DATA/boxes/ID
// bound at SocketDir (their backend box names it), with the agent's socket
// in it: they keep it (legacyHostDir) and their egress socket is staged in
// DATA/egress.
const (
	hostDirSize   = 256 << 10
	hostDirInodes = 64
	hostRunDir    = "run" // bound at backend.SocketDir
	hostStageDir  = "st"  // the egress socket's staging
)

// boxTop is box id's DATA/boxes/ID.
func (s *Service) boxTop(id string) string { return filepath.Join(s.cfg.DataDir, "boxes", id) }

// hostDir is the host directory of box id bound at backend.SocketDir; ""
// on a backend whose boxes run on another machine, which takes none.
func (s *Service) hostDir(id string) string {
	if s.caps.Remote {
		return ""
	}
	top := s.boxTop(id)
	if legacyHostDir(top) {
		return top
	}
	return filepath.Join(top, hostRunDir)
}

// egressStaging is where box id's egress socket is made: a directory only
// the host writes, on the filesystem of hostDir(id).
func (s *Service) egressStaging(id string) string {
	top := s.boxTop(id)
	if legacyHostDir(top) {
		return filepath.Join(s.cfg.DataDir, "egress")
	}
	return filepath.Join(top, hostStageDir)
}

// legacyHostDir tells a host directory of the old layout: the agent's
// socket at its top, on the data dir's own filesystem.
func legacyHostDir(top string) bool {
	if _, err := os.Lstat(filepath.Join(top, backend.SocketName)); err != nil {
		return false
	}
	return !boxdisk.IsMountPoint(top)
}

// makeHostDir mounts box id's host directory and makes run/ and st/ in
// it; it is a no-op for a directory already mounted (a box that runs, or
// was made since the host booted).
func (s *Service) makeHostDir(id string) error {
	s.hostDirMu.Lock()
	defer s.hostDirMu.Unlock()
	top := s.boxTop(id)
	if err := os.MkdirAll(top, 0o700); err != nil {
		return fmt.Errorf("create host dir of box %s: %w", id, err)
	}
	if legacyHostDir(top) {
		return nil
	}
	if !boxdisk.IsMountPoint(top) {
		opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0755", hostDirSize, hostDirInodes)
		if err := unix.Mount("cellbox-box", top, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
			return fmt.Errorf("mount the host dir of box %s (a tmpfs at %s; cellbox runs boxes as root): %w", id, top, err)
		}
	}
	for _, d := range []string{hostRunDir, hostStageDir} {
		if err := os.Mkdir(filepath.Join(top, d), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("create host dir of box %s: %w", id, err)
		}
	}
	return nil
}

// removeHostDir unmounts and removes box id's host directory.
func (s *Service) removeHostDir(id string) error {
	s.hostDirMu.Lock()
	defer s.hostDirMu.Unlock()
	top := s.boxTop(id)
	if err := unmountHostDir(top); err != nil {
		return fmt.Errorf("unmount host dir of box %s: %w", id, err)
	}
	return os.RemoveAll(top)
}

// prepareHost readies the host side of box id before it starts: its host
// directory, and its egress proxy unless it has the full network.
func (s *Service) prepareHost(id string, network bool) error {
	if !s.caps.Remote { // a remote box has no host directory here
		if err := s.makeHostDir(id); err != nil {
			return err
		}
	}
	if network {
		return nil
	}
	return s.startEgress(id)
}

// releaseHost undoes prepareHost for box id, which has stopped (asleep):
// its egress proxy stops and its host directory is unmounted (kept, empty),
// so that a server shut down leaves no mount behind; the next wake mounts
// it again. A failure is logged: the box can wake over a mounted one.
func (s *Service) releaseHost(id string) {
	s.stopEgress(id)
	s.hostDirMu.Lock()
	defer s.hostDirMu.Unlock()
	if err := unmountHostDir(s.boxTop(id)); err != nil {
		s.log.Warn("unmount the host dir of a sleeping box", "box", id, "err", err)
	}
}

// unmountHostDir unmounts top if it is mounted.
func unmountHostDir(top string) error {
	if err := unix.Unmount(top, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}
