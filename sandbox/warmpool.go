package sandbox

// The service's warm pools (sandbox/warm): pre-started boxes of an image
// (Config.Pool), so that a session's first box with default settings takes
// one instead of waiting for a create. The reaper shrinks use-following
// pools and fills them; only the server that holds the warm pool's lease
// fills (owner.go).

import (
	"context"
	"fmt"
	"time"

	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/warm"
)

// warmBox is a box of a warm pool: made, started, never used.
type warmBox struct {
	id     string
	client *agent.Client
}

// fillQuiet is how long after the last take a pool waits to refill: the
// stages of a run take their boxes within it (measured with `cellbox
// bench pipeline`: the csv rerun on bubblewrap 76-91 ms with refills at
// once, 64-69 ms with this wait).
const fillQuiet = 100 * time.Millisecond

// newPools makes the service's warm pools, empty.
func (s *Service) newPools() *warm.Pools[warmBox] {
	return warm.New(warm.Config[warmBox]{
		Sizes:      s.cfg.Pool,
		FollowsUse: s.cfg.PoolFollowsUse,
		BurstsOnly: s.cfg.PoolBurstsOnly,
		Idle:       s.cfg.PoolIdle,
		Quiet:      fillQuiet,
		Make:       s.makeWarm,
		Discard: func(ctx context.Context, w warmBox) {
			w.client.Close()
			s.removeBox(ctx, w.id)
		},
		MayFill: func() bool { return s.holds(leaseWarmPool) },
		Log:     s.log,
	})
}

// makeWarm makes a box of image for a warm pool, under the global create
// slots as any create.
func (s *Service) makeWarm(ctx context.Context, image string) (warmBox, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*s.cfg.ReadyTimeout)
	defer cancel()
	release, err := s.acquireSlot(ctx, nil)
	if err != nil {
		return warmBox{}, err
	}
	defer release()
	rec := boxRecord{ID: "cb-" + randomID(8), Image: image}
	cl, err := s.makeBox(ctx, rec, "", "", false)
	if err != nil && s.asleep.Load() {
		return warmBox{}, fmt.Errorf("%w: %w", warm.ErrStopping, err)
	}
	if err != nil {
		return warmBox{}, err
	}
	return warmBox{id: rec.ID, client: cl}, nil
}

// takeWarm takes a pre-started box of image for a new box, if one is
// ready. A use-following pool counts the calls for one-shot boxes
// (Config.OneShot; every call without OneShot) as its uses; a pool of a
// fixed size counts every call (its last use delays its refill).
func (s *Service) takeWarm(ctx context.Context, image string, oneShot bool) (string, *agent.Client, bool) {
	w, ok := s.pools.Take(ctx, image, !s.cfg.PoolFollowsUse || s.cfg.OneShot == nil || oneShot)
	if !ok {
		return "", nil, false
	}
	s.metrics.observeWarmTake()
	return w.id, w.client, true
}

// ExpectBoxes says that n boxes of image ("" the default image) will be
// taken soon, one after another: a run's exec stages. The first of them
// to be taken fills the pool for the rest at once (warm.Pools.Expect), so
// a later stage finds its box made while the earlier ones ran.
func (s *Service) ExpectBoxes(image string, n int) {
	if image == "" {
		image = s.cfg.DefaultImage
	}
	s.pools.Expect(image, n)
}

// BeginBoxes starts the burst ExpectBoxes announced for image ("" the
// default image) now, before its first take (warm.Pools.Begin): for a
// caller that knows every stage will run.
func (s *Service) BeginBoxes(image string) {
	if image == "" {
		image = s.cfg.DefaultImage
	}
	s.pools.Begin(image)
}
