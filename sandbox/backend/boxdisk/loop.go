package boxdisk

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// mountLoop attaches file to a free loop device and mounts it (ext4) at
// dir with the options `mount -t ext4 -o loop,nodev,nosuid,discard`
// gives. The loop device clears itself when the filesystem is unmounted
// (LO_FLAGS_AUTOCLEAR, as mount -o loop sets).
//
// Written out, not the mount binary: mount -o loop scans every loop
// device for one already backed by the file before it takes a free one,
// and forks a process; with a few dozen boxes on the host that cost 8 to
// 50 ms per mount (1 ms this way), paid at every create, wake and fork of
// a box. A caller falls back to the binary when this fails before the
// mount (a host whose /dev lacks the loop node, say).
func mountLoop(file, dir string) (loopErr, mountErr error) {
	img, err := os.OpenFile(file, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err, nil
	}
	defer img.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err, nil
	}
	defer ctl.Close()
	for tries := 0; ; tries++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return fmt.Errorf("get a free loop device: %w", err), nil
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		lf, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return err, nil
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		err = unix.IoctlLoopConfigure(int(lf.Fd()), &cfg)
		if errors.Is(err, unix.EBUSY) && tries < 100 {
			lf.Close() // another process took it between the two calls
			continue
		}
		if err != nil {
			lf.Close()
			return fmt.Errorf("attach %s to %s: %w", file, dev, err), nil
		}
		// The mount holds the device now; closing lf leaves it attached
		// until the unmount (or detaches it at once if the mount failed).
		err = unix.Mount(dev, dir, "ext4", unix.MS_NODEV|unix.MS_NOSUID, "discard")
		lf.Close()
		if err != nil {
			return nil, fmt.Errorf("mount %s (%s) at %s: %w", file, dev, dir, err)
		}
		return nil, nil
	}
}
