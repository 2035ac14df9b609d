package boxdisk

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// loopMu serializes mountLoop: two mounts of one image must find the
// same loop device, not attach one each.
var loopMu sync.Mutex

// mountLoop mounts the image file (ext4) at dir with the options `mount -t
// ext4 -o loop,nodev,nosuid,discard` gives: through the loop device
// already backed by file if there is one, as mount -o loop does (the
// filesystem of a box just stopped can still be alive in the mount
// namespace of its dying container; a second device would mount a second
// instance of it over the same blocks), else through a free one, attached
// so that it clears itself when the filesystem is unmounted
// (LO_FLAGS_AUTOCLEAR, as mount -o loop sets).
//
// Written out, not the mount binary: that forks a process and asks
// libmount, which reads every loop device's state through udev and sysfs;
// with a few dozen boxes on the host it cost 8 to 50 ms per mount (1 ms
// this way), paid at every create, wake and fork of a box. Mount falls
// back to the binary when this fails before the mount (a host whose /dev
// lacks the loop nodes, say).
func mountLoop(file, dir string) (loopErr, mountErr error) {
	loopMu.Lock()
	defer loopMu.Unlock()
	img, err := os.OpenFile(file, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err, nil
	}
	defer img.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(img.Fd()), &st); err != nil {
		return err, nil
	}
	dev, lf, err := boundLoop(st)
	if err != nil {
		return err, nil
	}
	if lf != nil {
		err := mountDev(dev, dir)
		cleared := false
		if err != nil {
			_, serr := unix.IoctlLoopGetStatus64(int(lf.Fd()))
			cleared = serr != nil // its last user went meanwhile
		}
		lf.Close()
		if !cleared {
			return nil, err
		}
	}
	if dev, lf, err = attachLoop(img); err != nil {
		return err, nil
	}
	err = mountDev(dev, dir)
	lf.Close()
	return nil, err
}

// mountDev mounts the loop device dev at dir. The mount holds the device:
// its caller's open file of it may be closed after (with autoclear,
// closing it detaches the device if the mount failed).
func mountDev(dev, dir string) error {
	if err := unix.Mount(dev, dir, "ext4", unix.MS_NODEV|unix.MS_NOSUID, "discard"); err != nil {
		return fmt.Errorf("mount %s at %s: %w", dev, dir, err)
	}
	return nil
}

// boundLoop returns the loop device backed by the file st describes, open,
// or a nil file if none is.
func boundLoop(st unix.Stat_t) (string, *os.File, error) {
	ents, err := os.ReadDir("/sys/block")
	if err != nil {
		return "", nil, err
	}
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, "loop") {
			continue
		}
		if _, err := os.Stat("/sys/block/" + name + "/loop"); err != nil {
			continue // not bound
		}
		dev := "/dev/" + name
		lf, err := os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue // gone meanwhile
		}
		info, err := unix.IoctlLoopGetStatus64(int(lf.Fd()))
		if err == nil && info.Device == st.Dev && info.Inode == st.Ino && info.Offset == 0 && info.Sizelimit == 0 {
			return dev, lf, nil
		}
		lf.Close()
	}
	return "", nil, nil
}

// attachLoop attaches img to a free loop device and returns it open.
func attachLoop(img *os.File) (string, *os.File, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, err
	}
	defer ctl.Close()
	for tries := 0; ; tries++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", nil, fmt.Errorf("get a free loop device: %w", err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		lf, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", nil, err
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
			return "", nil, fmt.Errorf("attach %s to %s: %w", img.Name(), dev, err)
		}
		return dev, lf, nil
	}
}
