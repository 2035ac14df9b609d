package backend

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cellbox/cellbox/sandbox/backend/boxdisk"
)

// CloneAll is Cloner.Clone for a backend whose boxes each have a
// boxdisk.Disk: it copies src's image once per spec, all at one instant
// (boxdisk.CopyImages, into dir, which must be on the filesystem of the
// new disks), then makes the boxes in parallel, each with create(spec,
// its image) (which adopts the image as the box's disk). If one fails,
// the boxes made are removed with be.Remove and the images left deleted.
func CloneAll(ctx context.Context, be Backend, src boxdisk.Disk, dir string, specs []Spec, create func(spec Spec, image string) (Info, error)) ([]Info, error) {
	images := make([]string, len(specs))
	for i, spec := range specs {
		if err := spec.Validate(be.Capabilities()); err != nil {
			return nil, err
		}
		images[i] = filepath.Join(dir, clonePrefix+spec.ID+".img")
	}
	if err := boxdisk.CopyImages(ctx, src, images); err != nil {
		return nil, fmt.Errorf("clone: %w", err)
	}
	defer func() {
		for _, f := range images {
			os.Remove(f) // those not adopted
		}
	}()
	infos := make([]Info, len(specs))
	errs := make([]error, len(specs))
	var wg sync.WaitGroup
	for i, spec := range specs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			infos[i], errs[i] = create(spec, images[i])
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for i, spec := range specs {
			if errs[i] == nil {
				if rerr := be.Remove(context.WithoutCancel(ctx), spec.ID); rerr != nil {
					err = errors.Join(err, rerr)
				}
			}
		}
		return nil, err
	}
	return infos, nil
}

// clonePrefix names the images CloneAll copies before the new boxes adopt
// them.
const clonePrefix = ".clone-"

// StaleClone is how old a copy CloneAll left in a directory must be for
// SweepClones to remove it: far longer than any clone takes, so that a
// clone in flight (of another server sharing the directory) is never
// removed.
const StaleClone = time.Hour

// SweepClones removes the images CloneAll left in dir (a server killed
// in the middle of a fork leaves a full-size copy per new box) that are
// older than age, and returns their paths.
func SweepClones(dir string, age time.Duration) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var removed []string
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || !strings.HasPrefix(name, clonePrefix) || !strings.HasSuffix(name, ".img") {
			continue
		}
		if fi, err := e.Info(); err != nil || time.Since(fi.ModTime()) < age {
			continue
		}
		if f := filepath.Join(dir, name); os.Remove(f) == nil {
			removed = append(removed, f)
		}
	}
	return removed
}
