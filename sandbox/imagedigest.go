package sandbox

import (
	"context"

	"github.com/cellbox/cellbox/sandbox/backend"
)

// ImageDigest says which build of image a box created now would run: the
// backend's digest of it (backend.ImageDigester: a Docker image ID, a
// local rootfs's build id), "" when the backend cannot tell (an image it
// does not have, the host's /usr, a kubernetes image reference, a name
// that is no image reference, a backend without the capability). "" is
// the service's default image. The exec node's memo key holds it, so
// that a rebuilt image does not serve results of the build before.
func (s *Service) ImageDigest(ctx context.Context, image string) (string, error) {
	if image == "" {
		image = s.cfg.DefaultImage
	}
	d, ok := s.be.(backend.ImageDigester)
	if !ok || validImage(image) != nil {
		return "", nil // sandbox_create refuses the name, with its reasons
	}
	return d.ImageDigest(ctx, image)
}

// ImageDigest is Service.ImageDigest (sandboxclient.ImageDigester).
func (c *LocalClient) ImageDigest(ctx context.Context, image string) (string, error) {
	return c.s.ImageDigest(ctx, image)
}
